"""qkv_proj_rope ops (seed §3.1 stages 4a-4j) that are not plain matmuls. dsv4-math §1.2, §3.

The projections themselves are `matmul` nodes (atomic split-K into a `zeros` seed for qr and kv; int8 × int8 → i32
for wq_b). `rope_tables` is also the SWA/CSA `rope_cs` stage.
"""
from __future__ import annotations

from .. import dims as D
from ..types import DType, TensorType
from .base import (
    REQUIRED,
    Attr,
    OpDef,
    expect,
    expect_dtype,
    expect_rank,
    expect_same_dim,
    numpy_reference,
    register_op,
)

F32, BF16 = DType.fp32, DType.bf16
FLOATS = (BF16, DType.fp16, F32)


def _tables(cos_il: TensorType, sin: TensorType, rows: D.Dim) -> int | None:
    """Check a (cos_il, sin_signed) pair [rows, rope_dim]; return rope_dim when known."""
    for name, t in (("cos_il", cos_il), ("sin_signed", sin)):
        expect_rank(t, 2, f"{name} [T, rope_dim]")
        expect_dtype(t, FLOATS, name)
        expect_same_dim(t.shape[0], rows, f"{name} rows")
    expect_same_dim(cos_il.shape[1], sin.shape[1], "cos_il vs sin_signed width")
    return cos_il.shape[1].value()


def _check_rope_width(x: TensorType, rope_dim: int | None) -> None:
    width = x.shape[-1].value()
    expect(rope_dim is None or width is None or rope_dim < width,
           f"rope tables ({rope_dim} wide) must be narrower than the rows of {x}")


class _QkvOp(OpDef):
    family = "qkv"


@register_op
class RopeTables(_QkvOp):
    """Interleaved per-token tables cos_il, sin_signed [T, rope_dim] gathered from the RoPE tables at each token's
    position (q_rope_prepare, rope_cs): cos_il[j] = c[j>>1], sin_signed[j] = ∓s[j>>1] (− on even j)."""
    name = "rope_tables"
    operands = ("rope_cos", "rope_sin", "positions")
    results = ("cos_il", "sin_signed")
    attrs = {"rope_dim": Attr("int", REQUIRED)}
    reference = numpy_reference("qkv", "rope_tables")

    def infer(self, ins, attrs):
        cos, sin, pos = ins
        rd = attrs["rope_dim"]
        expect(rd > 0 and rd % 2 == 0, f"rope_dim must be positive and even, got {rd}")
        for name, t in (("rope_cos", cos), ("rope_sin", sin)):
            expect_rank(t, 2, f"{name} [positions, rope_dim]")
            expect_dtype(t, FLOATS, name)
            expect(t.shape[1].value() in (None, rd, rd // 2),
                   f"{name} must have {rd} (duplicated half) or {rd // 2} columns, got {t}")
        expect(cos.shape == sin.shape, f"rope_cos {cos} and rope_sin {sin} differ")
        expect(pos.rank == 1 and pos.dtype in (DType.i32, DType.i64), f"positions must be i32[T], got {pos}")
        t = TensorType(BF16, (pos.shape[0], D.Const(rd)))
        return [t, t]

    def tile_axes(self, ins, outs, attrs):
        return [("rows", ins[2].shape[0])]


@register_op
class QrRmsNormQuant(_QkvOp):
    """qn = qa·rsqrt(mean(qa²)+eps)·gamma_cq (f32), then q8 per token → qr i8, qr_scale f32[T] (qr_rms_norm_quant)."""
    name = "qr_rms_norm_quant"
    operands = ("qr_acc", "gamma_cq")
    results = ("qr", "scale")
    attrs = {"eps": Attr("float", 1e-6)}
    reference = numpy_reference("qkv", "qr_rms_norm_quant")

    def infer(self, ins, attrs):
        qa, gamma = ins
        expect_rank(qa, 2, "qr accumulator [T, q_lora]")
        expect_dtype(qa, F32, "qr accumulator")
        expect_rank(gamma, 1, "gamma_cq")
        expect_same_dim(gamma.shape[0], qa.shape[1], "gamma_cq length vs q_lora")
        return [qa.with_dtype(DType.i8), TensorType(F32, (qa.shape[0],))]

    def tile_axes(self, ins, outs, attrs):
        return [("rows", ins[0].shape[0])]


@register_op
class QprojDequantRmsNopeRope(_QkvOp):
    """q = deq(acc, qr_scale, wq_b_scale) per head, RMSNorm (no gamma), RoPE on the last rope_dim dims, bf16
    [T, H, head_dim] (stage qproj_dequant_rms_nope_rope)."""
    name = "qproj_dequant_rms_nope_rope"
    operands = ("acc", "qr_scale", "wq_b_scale", "cos_il", "sin_signed")
    attrs = {"heads": Attr("int", REQUIRED), "eps": Attr("float", 1e-6)}
    reference = numpy_reference("qkv", "qproj_dequant_rms_nope_rope")

    def infer(self, ins, attrs):
        acc, sa, sw, cos, sin = ins
        expect_rank(acc, 2, "acc [T, heads·head_dim]")
        expect_dtype(acc, DType.i32, "acc")
        expect(sa.rank == 1 and sa.dtype == F32, f"qr_scale must be f32[T], got {sa}")
        expect_same_dim(sa.shape[0], acc.shape[0], "qr_scale rows")
        expect(sw.rank == 1 and sw.dtype == F32, f"wq_b_scale must be f32[N], got {sw}")
        expect_same_dim(sw.shape[0], acc.shape[1], "wq_b_scale length")
        h = attrs["heads"]
        n = acc.shape[1].value()
        expect(h > 0 and (n is None or n % h == 0), f"{h} heads do not divide {acc.shape[1]} columns")
        head_dim = D.floordiv(acc.shape[1], h)
        out = TensorType(BF16, (acc.shape[0], D.Const(h), head_dim))
        _check_rope_width(out, _tables(cos, sin, acc.shape[0]))
        return [out]

    def tile_axes(self, ins, outs, attrs):
        return [("heads", D.Const(attrs["heads"]))]


@register_op
class KvRmsNormRope(_QkvOp):
    """kv = rope(ka·rsqrt(mean(ka²)+eps)·gamma_ckv), bf16 [T, head_dim] (stage kv_rms_norm_rope)."""
    name = "kv_rms_norm_rope"
    operands = ("kv_acc", "gamma_ckv", "cos_il", "sin_signed")
    attrs = {"eps": Attr("float", 1e-6)}
    reference = numpy_reference("qkv", "kv_rms_norm_rope")

    def infer(self, ins, attrs):
        ka, gamma, cos, sin = ins
        expect_rank(ka, 2, "kv accumulator [T, head_dim]")
        expect_dtype(ka, F32, "kv accumulator")
        expect_rank(gamma, 1, "gamma_ckv")
        expect_same_dim(gamma.shape[0], ka.shape[1], "gamma_ckv length vs head_dim")
        _check_rope_width(ka, _tables(cos, sin, ka.shape[0]))
        return [ka.with_dtype(BF16)]

    def tile_axes(self, ins, outs, attrs):
        return [("rows", ins[0].shape[0])]

"""Hyper-connection ops: the hc_pre stages (seed §3.1 1a-1f) and hc_post (§3.2 stage 11). dsv4-math §2."""
from __future__ import annotations

from .. import dims as D
from ..types import DType, TensorType
from .base import Attr, OpDef, expect, expect_dtype, expect_rank, expect_same_dim, numpy_reference, register_op

F32 = DType.fp32


def _x_hc(t: TensorType) -> None:
    expect_rank(t, 3, "x_hc [T, hc_mult, hidden]")
    expect_dtype(t, F32, "x_hc")


def _k(t: TensorType) -> D.Dim:
    return D.mul(t.shape[1], t.shape[2])


def _mix_operands(ins) -> TensorType:
    mixes, inv_rms, scale, base = ins
    expect_rank(mixes, 2, "mixes [T, mix_hc]")
    expect_dtype(mixes, F32, "mixes")
    expect(inv_rms.rank == 1 and inv_rms.dtype == F32, f"inv_rms must be f32[T], got {inv_rms}")
    expect_same_dim(inv_rms.shape[0], mixes.shape[0], "inv_rms rows vs mixes rows")
    expect(scale.rank == 1 and scale.shape[0].value() in (None, 3), f"hc_scale must be f32[3], got {scale}")
    expect(base.rank == 1, f"hc_base must be rank 1, got {base}")
    expect_same_dim(base.shape[0], mixes.shape[1], "hc_base length vs mix width")
    return mixes


def _mixed(x: TensorType, pre: TensorType) -> TensorType:
    """mix_x's result type: x_hc [T, 4, D] weighted by pre [T, 4] → bf16[T, D]."""
    _x_hc(x)
    expect(x.shape[1].value() in (None, 4), f"mix_x sums 4 streams pairwise, got {x}")
    expect(pre.rank == 2 and pre.dtype == F32, f"pre must be f32[T, hc_mult], got {pre}")
    expect_same_dim(pre.shape[0], x.shape[0], "pre rows")
    expect_same_dim(pre.shape[1], x.shape[1], "pre width vs hc_mult")
    return TensorType(DType.bf16, (x.shape[0], x.shape[2]))


class _HcOp(OpDef):
    family = "hc"


@register_op
class HcPreRms(_HcOp):
    """1/rms of each token's flattened HC stream; sum of squares over K chunks of tile[1] (stage hc_pre_rms)."""
    name = "hc_pre_rms"
    operands = ("x_hc",)
    attrs = {"eps": Attr("float", 1e-6)}
    reference = numpy_reference("hc", "hc_pre_rms")

    def infer(self, ins, attrs):
        _x_hc(ins[0])
        return [TensorType(F32, (ins[0].shape[0],))]

    def tile_axes(self, ins, outs, attrs):
        return [("rows", ins[0].shape[0]), ("k", _k(ins[0]))]


@register_op
class HcPreLinear(_HcOp):
    """X[T, n·D] @ hc_fn[mix, n·D].T in the cube MAD order, k_split contiguous splits (stage hc_pre_linear).

    accumulate = atomic: each split is added in f32 into the seeded `acc` operand (in place; reference order
    ascending). ordered: returns the disjoint partials f32[k_split·T, mix] (row s·T + t) for
    hc_pre_linear_reduce. none: one result, the splits summed in ascending order.
    """
    name = "hc_pre_linear"
    operands = ("x_hc", "hc_fn", "*acc")
    aliases = {0: 2}
    attrs = {
        "accumulate": Attr("enum", "atomic", choices=("none", "atomic", "ordered")),
        "k_split": Attr("int", 1),
    }
    core = "cube"
    reference = numpy_reference("hc", "hc_pre_linear")

    def infer(self, ins, attrs):
        x, fn, *acc = ins
        _x_hc(x)
        expect_rank(fn, 2, "hc_fn [mix_hc, hc_dim]")
        expect_dtype(fn, F32, "hc_fn")
        expect_same_dim(fn.shape[1], _k(x), "hc_fn columns vs hc_mult·hidden")
        ks = attrs["k_split"]
        expect(ks >= 1, f"k_split must be >= 1, got {ks}")
        k = _k(x).value()
        expect(k is None or k % (4 * ks) == 0, f"hc_dim {k} must split into {ks} splits of groups of 4")
        expect(len(acc) <= 1, "hc_pre_linear takes at most one accumulator")
        expect(bool(acc) == (attrs["accumulate"] == "atomic"),
               "an atomic hc_pre_linear takes exactly one accumulator operand (the seeded buffer); others none")
        out = TensorType(F32, (x.shape[0], fn.shape[0]))
        if acc:
            expect(acc[0] == out or (acc[0].dtype == F32 and acc[0].shape == out.shape),
                   f"accumulator must be {out}, got {acc[0]}")
        if attrs["accumulate"] == "ordered":
            return [TensorType(F32, (D.mul(ks, x.shape[0]), fn.shape[0]))]
        return [out]

    def tile_axes(self, ins, outs, attrs):
        return [("rows", ins[0].shape[0]), ("k", _k(ins[0]))]


@register_op
class HcPreLinearReduce(_HcOp):
    """Sum of k_split partial row blocks [k_split·T, mix] in ascending split order (stage hc_pre_linear_reduce)."""
    name = "hc_pre_linear_reduce"
    operands = ("partials",)
    attrs = {"k_split": Attr("int", 1)}
    reference = numpy_reference("hc", "hc_pre_linear_reduce")

    def infer(self, ins, attrs):
        p = ins[0]
        expect_rank(p, 2, "partials")
        expect_dtype(p, F32, "partials")
        ks = attrs["k_split"]
        rows = p.shape[0].value()
        expect(ks >= 1 and (rows is None or rows % ks == 0), f"{ks} splits do not divide {p.shape[0]} rows")
        return [TensorType(F32, (D.floordiv(p.shape[0], ks), p.shape[1]))]

    def tile_axes(self, ins, outs, attrs):
        return [("rows", outs[0].shape[0])]


@register_op
class SplitPrePost(_HcOp):
    """pre = sigmoid(mix·s0 + b) + eps, post = 2·sigmoid(mix·s1 + b); mix = mixes·inv_rms (stage split_pre_post)."""
    name = "split_pre_post"
    operands = ("mixes", "inv_rms", "hc_scale", "hc_base")
    results = ("pre", "post")
    attrs = {"hc_mult": Attr("int", 4), "eps": Attr("float", 1e-6)}
    reference = numpy_reference("hc", "split_pre_post")

    def infer(self, ins, attrs):
        mixes = _mix_operands(ins)
        n = attrs["hc_mult"]
        w = mixes.shape[1].value()
        expect(w is None or w == (2 + n) * n, f"mix width must be (2+hc_mult)·hc_mult = {(2 + n) * n}, got {w}")
        t = TensorType(F32, (mixes.shape[0], D.Const(n)))
        return [t, t]

    def tile_axes(self, ins, outs, attrs):
        return [("rows", ins[0].shape[0])]


@register_op
class CombSinkhorn(_HcOp):
    """comb[T, in, out]: softmax + Sinkhorn normalisation of mix[:, 2n:]·s2 + b (stage comb_sinkhorn)."""
    name = "comb_sinkhorn"
    operands = ("mixes", "inv_rms", "hc_scale", "hc_base")
    attrs = {"hc_mult": Attr("int", 4), "iters": Attr("int", 20), "eps": Attr("float", 1e-6)}
    reference = numpy_reference("hc", "comb_sinkhorn")

    def infer(self, ins, attrs):
        mixes = _mix_operands(ins)
        n = attrs["hc_mult"]
        w = mixes.shape[1].value()
        expect(w is None or w == (2 + n) * n, f"mix width must be (2+hc_mult)·hc_mult = {(2 + n) * n}, got {w}")
        expect(attrs["iters"] >= 1, f"iters must be >= 1, got {attrs['iters']}")
        return [TensorType(F32, (mixes.shape[0], D.Const(n), D.Const(n)))]

    def tile_axes(self, ins, outs, attrs):
        return [("rows", ins[0].shape[0])]


@register_op
class MixX(_HcOp):
    """x_mixed = rb((x0·p0 + x1·p1) + (x2·p2 + x3·p3)) → bf16[T, D] (stage mix_x)."""
    name = "mix_x"
    operands = ("x_hc", "pre")
    reference = numpy_reference("hc", "mix_x")

    def infer(self, ins, attrs):
        return [_mixed(*ins)]

    def tile_axes(self, ins, outs, attrs):
        return [("rows", ins[0].shape[0]), ("d", ins[0].shape[2])]


@register_op
class MixXRmsNorm(_HcOp):
    """rmsnorm(mix_x(x_hc, pre), w) per token row in one task: the bf16 x_mixed row stays on chip → bf16[T, D]
    (the captured code's fused `mix_x_rms_norm`; the rounding points of mix_x then rmsnorm)."""
    name = "mix_x_rms_norm"
    operands = ("x_hc", "pre", "w")
    attrs = {"eps": Attr("float", 1e-6)}
    reference = numpy_reference("hc", "mix_x_rms_norm")

    def infer(self, ins, attrs):
        x, pre, w = ins
        mixed = _mixed(x, pre)
        expect_rank(w, 1, "weight")
        expect_same_dim(w.shape[0], x.shape[2], "weight length vs hidden")
        return [mixed]

    def tile_axes(self, ins, outs, attrs):
        return [("rows", ins[0].shape[0])]


@register_op
class HcPost(_HcOp):
    """y[:, o] = f32(x_attn)·post[:, o] + Σ_i x_hc[:, i]·comb[:, i, o] (i ascending) → f32[T, n, D] (stage hc_post)."""
    name = "hc_post"
    operands = ("x_attn", "x_hc", "post", "comb")
    reference = numpy_reference("hc", "hc_post")

    def infer(self, ins, attrs):
        a, x, post, comb = ins
        _x_hc(x)
        expect_rank(a, 2, "x_attn [T, hidden]")
        expect_dtype(a, (DType.bf16, F32), "x_attn")
        expect_same_dim(a.shape[0], x.shape[0], "x_attn rows vs x_hc rows")
        expect_same_dim(a.shape[1], x.shape[2], "x_attn width vs hidden")
        expect(post.rank == 2 and post.dtype == F32, f"post must be f32[T, hc_mult], got {post}")
        expect_same_dim(post.shape[1], x.shape[1], "post width vs hc_mult")
        expect(comb.rank == 3 and comb.dtype == F32, f"comb must be f32[T, hc_mult, hc_mult], got {comb}")
        expect_same_dim(comb.shape[1], x.shape[1], "comb in-streams")
        expect_same_dim(comb.shape[2], x.shape[1], "comb out-streams")
        return [x]

    def tile_axes(self, ins, outs, attrs):
        return [("rows", ins[1].shape[0]), ("streams", ins[1].shape[1])]

"""Grouped W8A8 output-projection ops (seed §3.5 tp_o_a, tp_o_a_quant, tp_o_b, tp_o_b_dequant and the TP1
`decode_o_proj_tp1` stages proj_a_mm, quant, proj_b_mm, proj_b_act). dsv4-math §7.

One node per group for the A side, the quant and the B side (a task each in the seed); one dequant node sums the
groups in ascending order.
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

F32, BF16, I8, I32 = DType.fp32, DType.bf16, DType.i8, DType.i32


class _OprojOp(OpDef):
    family = "oproj"


def _group(attrs, groups: D.Dim) -> None:
    g, n = attrs["group"], groups.value()
    expect(g >= 0 and (n is None or g < n), f"group {g} out of range for {groups} groups")


@register_op
class OProjA(_OprojOp):
    """o_r = f32(heads[group]) @ f32(wo_a[group]).T → f32 [rows, o_lora] (tp_o_a / proj_a_mm)."""
    name = "o_proj_a"
    operands = ("heads", "wo_a")
    attrs = {"group": Attr("int", REQUIRED)}
    core = "cube"
    reference = numpy_reference("oproj", "o_proj_a")

    def infer(self, ins, attrs):
        heads, wo_a = ins
        expect_rank(heads, 3, "heads [groups, rows, group width]")
        expect_dtype(heads, BF16, "heads")
        expect_rank(wo_a, 3, "wo_a [groups, o_lora, group width]")
        expect_dtype(wo_a, BF16, "wo_a")
        expect_same_dim(wo_a.shape[0], heads.shape[0], "wo_a groups vs heads groups")
        expect_same_dim(wo_a.shape[2], heads.shape[2], "wo_a width vs group width")
        _group(attrs, heads.shape[0])
        return [TensorType(F32, (heads.shape[1], wo_a.shape[1]))]

    def tile_axes(self, ins, outs, attrs):
        return [("m", ins[0].shape[1]), ("n", ins[1].shape[1])]


@register_op
class QuantRows(_OprojOp):
    """q8 per row (dsv4-math §0) → int8 values and the f32 dequant scale per row (tp_o_a_quant / quant).

    `pad_rows` > 0: the int8 values fill a buffer of that many rows, the rows past x's zero (the seed's TP1 quant
    zeroes rows t_dim … T_PAD of `o_r_i8_pad`, which proj_b_mm reads whole); the scales stay one per x row."""
    name = "quant_rows"
    operands = ("x",)
    results = ("q", "scale")
    attrs = {"pad_rows": Attr("int")}   # absent: no padding (no default stored: graphs without it hash as before)
    reference = numpy_reference("oproj", "quant_rows")

    def infer(self, ins, attrs):
        x = ins[0]
        expect_rank(x, 2, "x [rows, width]")
        expect_dtype(x, F32, "x")
        pad, rows = attrs.get("pad_rows") or 0, x.shape[0].value()
        expect(pad >= 0, f"pad_rows must be ≥ 0, got {pad}")
        expect(not pad or rows is None or pad >= rows, f"pad_rows {pad} is below the {x.shape[0]} rows of x")
        q_rows = D.dim(pad) if pad else x.shape[0]
        return [TensorType(I8, (q_rows, x.shape[1])), TensorType(F32, (x.shape[0],))]

    def tile_axes(self, ins, outs, attrs):
        return [("rows", ins[0].shape[0])]


@register_op
class OProjB(_OprojOp):
    """Exact int8 product x @ wo_b[:, group·o_lora:(group+1)·o_lora].T → i32 [rows, hidden] (tp_o_b / proj_b_mm)."""
    name = "o_proj_b"
    operands = ("x", "wo_b")
    attrs = {"group": Attr("int", REQUIRED)}
    core = "cube"
    reference = numpy_reference("oproj", "o_proj_b")

    def infer(self, ins, attrs):
        x, wo_b = ins
        expect_rank(x, 2, "x [rows, o_lora]")
        expect_dtype(x, I8, "x")
        expect_rank(wo_b, 2, "wo_b [hidden, groups·o_lora]")
        expect_dtype(wo_b, I8, "wo_b")
        k, width = x.shape[1].value(), wo_b.shape[1].value()
        g = attrs["group"]
        expect(k is None or width is None or (k > 0 and width % k == 0 and 0 <= g < width // k),
               f"group {g} of width {x.shape[1]} is outside wo_b {wo_b}")
        return [TensorType(I32, (x.shape[0], wo_b.shape[0]))]

    def tile_axes(self, ins, outs, attrs):
        return [("m", ins[0].shape[0]), ("n", ins[1].shape[0])]


@register_op
class OProjBDequant(_OprojOp):
    """Σ_g f32(acc_g)·s_g over the groups in order, times wo_b_scale → f32 TP partial, or bf16 attn_out at TP1
    (tp_o_b_dequant / proj_b_act). Operands: wo_b_scale, then acc_0, s_0, acc_1, s_1, ... The output has one row
    per scale row; an accumulator may hold more rows (the padded rows of the seed's TP1 `partials [T_PAD, ·]`),
    which are not read."""
    name = "o_proj_b_dequant"
    operands = ("wo_b_scale", "*parts")
    attrs = {"out": Attr("enum", "f32", choices=("f32", "bf16"))}
    reference = numpy_reference("oproj", "o_proj_b_dequant")

    def infer(self, ins, attrs):
        sw, *parts = ins
        expect(sw.rank == 1 and sw.dtype == F32, f"wo_b_scale must be f32[hidden], got {sw}")
        expect(len(parts) >= 2 and len(parts) % 2 == 0, f"expects (acc, scale) pairs, got {len(parts)} operands")
        first = parts[0]
        expect(parts[1].rank == 1, f"group scale must be f32[rows], got {parts[1]}")
        rows = parts[1].shape[0]
        for acc, s in zip(parts[0::2], parts[1::2]):
            expect(acc.rank == 2 and acc.dtype == I32, f"group accumulator must be i32[rows, hidden], got {acc}")
            expect_same_dim(acc.shape[1], first.shape[1], "group accumulator width")
            expect(s.rank == 1 and s.dtype == F32, f"group scale must be f32[rows], got {s}")
            expect_same_dim(s.shape[0], rows, "group scale rows")
            if acc.shape[0] != rows:
                n_acc, n = acc.shape[0].value(), rows.value()
                expect(n_acc is not None and not acc.shape[0].symbols() and (n is None or n_acc >= n),
                       f"group accumulator rows {acc.shape[0]} are neither the {rows} scale rows nor a padded "
                       "capacity above them")
        expect_same_dim(sw.shape[0], first.shape[1], "wo_b_scale length vs hidden")
        return [TensorType(_dt(attrs["out"]), (rows, first.shape[1]))]

    def tile_axes(self, ins, outs, attrs):
        return [("rows", ins[1].shape[0]), ("n", ins[1].shape[1])]


def _dt(name: str) -> DType:
    return {"f32": F32, "bf16": BF16}[name]

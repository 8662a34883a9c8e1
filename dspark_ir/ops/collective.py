"""Collective ops of the TP O path (seed §3.5, §4): the all-to-all of O groups and the f32 reduce-scatter.

Collective references receive every rank's operands and return one result per rank (design.md "Collective ops").
Both are one incore / `at` task per rank in the seed (put → barrier 1 → copy-out or sum → barrier 2 → reset).
"""
from __future__ import annotations

from .. import dims as D
from ..types import DType, TensorType
from .base import REQUIRED, Attr, OpDef, expect, expect_dtype, expect_rank, register_op


def exact_div(d: D.Dim, k: int) -> D.Dim:
    """d // k, simplified when d is k·x (the dims module does not fold (k·x)//k)."""
    if isinstance(d, D.BinOp) and d.op == "*":
        for a, b in ((d.a, d.b), (d.b, d.a)):
            if a == D.Const(k):
                return b
            if isinstance(a, D.Const) and a.n % k == 0:
                return D.mul(a.n // k, b)
    return D.floordiv(d, k)


class _CollectiveOp(OpDef):
    family = "collective"
    collective = True
    core = "mix"


@register_op
class OGroupA2A(_CollectiveOp):
    """All-to-all of O groups: packed [G, T, w] on every rank → [G/tp, tp·T, w] holding this rank's groups for
    the whole TP group's tokens, row src_rank·T + t (o_group_a2a)."""
    name = "o_group_a2a"
    operands = ("packed",)
    attrs = {"tp": Attr("int", REQUIRED)}
    reference = "kernels.collective:o_group_a2a"

    def infer(self, ins, attrs):
        p = ins[0]
        expect_rank(p, 3, "packed [groups, T, group width]")
        tp = attrs["tp"]
        g = p.shape[0].value()
        expect(tp >= 1 and (g is None or g % tp == 0), f"tp {tp} does not divide {p.shape[0]} groups")
        return [TensorType(p.dtype, (exact_div(p.shape[0], tp), D.mul(tp, p.shape[1]), p.shape[2]))]


@register_op
class TpOReduceScatter(_CollectiveOp):
    """f32 partials [tp·T, D] on every rank → this rank's rows [T, D], summed over ranks ascending in f32 and
    rounded once (tp_o_reduce_scatter)."""
    name = "tp_o_reduce_scatter"
    operands = ("partial",)
    attrs = {"tp": Attr("int", REQUIRED), "out": Attr("dtype", "bf16")}
    reference = "kernels.collective:tp_o_reduce_scatter"

    def infer(self, ins, attrs):
        p = ins[0]
        expect_rank(p, 2, "partial [tp·T, hidden]")
        expect_dtype(p, DType.fp32, "partial")
        tp = attrs["tp"]
        rows = p.shape[0].value()
        expect(tp >= 1 and (rows is None or rows % tp == 0), f"tp {tp} does not divide {p.shape[0]} rows")
        return [TensorType(attrs["out"], (exact_div(p.shape[0], tp), p.shape[1]))]

"""Ordered split-K for the generic matmul: disjoint per-split partials and their ascending reduction.

`matmul {accumulate = atomic}` adds its k_split partial products into a seeded f32 buffer in completion order
(dspark-model.md §6(f) "Before"). The deterministic form writes each split's product into its own row block
(`matmul_partials`) and sums the blocks in ascending split order (`split_reduce`), the order the atomic form's
reference uses: same bits as that reference, and the same bits on every schedule. The `deterministic-split-k`
pass produces these two ops from an atomic matmul (`targets = all`); hc_pre has its own pair (ops/hc.py).
"""
from __future__ import annotations

from .. import dims as D
from ..types import DType, TensorType
from .base import Attr, OpDef, expect, expect_dtype, expect_rank, expect_same_dim, numpy_reference, register_op
from .hc import HcPreLinearReduce

FLOATS = (DType.bf16, DType.fp16, DType.fp32)


@register_op
class MatmulPartials(OpDef):
    """a[M,K] @ b[K,N] (b[N,K] with trans_b) as k_split f32 partials [k_split·M, N]: row s·M + m is split s's
    product over its contiguous K slice (the np.linspace cut of matmul's atomic form)."""
    name = "matmul_partials"
    operands = ("a", "b")
    attrs = {
        "trans_b": Attr("bool", False),
        "k_split": Attr("int", 1),
        "m_split": Attr("int", 1),
    }
    core = "cube"
    reference = numpy_reference("splitk", "matmul_partials")
    family = "splitk"

    def infer(self, ins, attrs):
        a, b = ins
        expect_rank(a, 2, "lhs")
        expect_rank(b, 2, "rhs")
        expect_dtype(a, FLOATS, "lhs")
        expect_dtype(b, FLOATS, "rhs")
        k_b, n = (b.shape[1], b.shape[0]) if attrs["trans_b"] else (b.shape[0], b.shape[1])
        expect_same_dim(a.shape[1], k_b, "contraction dims")
        ks = attrs["k_split"]
        expect(ks >= 1 and attrs["m_split"] >= 1, "k_split and m_split must be >= 1")
        k = a.shape[1].value()
        expect(k is None or ks <= k, f"{ks} splits of a {k}-wide contraction leave empty splits")
        return [TensorType(DType.fp32, (D.mul(ks, a.shape[0]), n))]

    def tile_axes(self, ins, outs, attrs):
        a, b = ins
        n = b.shape[0] if attrs["trans_b"] else b.shape[1]
        return [("m", a.shape[0]), ("n", n), ("k", a.shape[1])]


@register_op
class SplitReduce(HcPreLinearReduce):
    """Sum of the k_split row blocks of partials [k_split·M, N] in ascending split order → f32[M, N]."""
    name = "split_reduce"
    reference = numpy_reference("splitk", "split_reduce")
    family = "splitk"

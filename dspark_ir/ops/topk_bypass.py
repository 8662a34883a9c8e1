"""The guarded form of the CSA top-k bypass (dspark-model.md §6(a)): a per-token select between the bounded
indices and the scored top-k.

`idx_topk_bounded` (dspark_ir/ops/indexer.py) is the static form: it replaces `idx_score` → `idx_topk` when the
visible compressed length is provably ≤ k for every token. When it is not provable (the default cache extent, long
contexts), `idx_topk_select` keeps the top-k as its fallback operand and, per token, writes the bounded row
0 … visible−1, −1 tail wherever visible ≤ k (the boundary visible == k included), and copies the fallback row
elsewhere. Its visible length is the one `idx_topk` uses, min(kv_seq_len // r, (pos+1) // r, score_len), so the
bound is the plan stage's mask `raw < (pos+1) // r` or tighter.

Where visible ≤ k the fallback row is never read, so a lowering may predicate those rows of the score and top-k
tasks away (the in-kernel branch of §6(a)); in the reference both always run.
"""
from __future__ import annotations

from ..types import DType
from .base import REQUIRED, Attr, OpDef, expect, expect_same_dim, numpy_reference, register_op
from .indexer import check_visibility, visibility_attrs

I32 = DType.i32


@register_op
class IdxTopkSelect(OpDef):
    """Per token: 0 … visible−1 then −1 where visible ≤ k (the bypass), else the fallback (scored top-k) row;
    i32 [T, score_len] (the guarded top-k bypass, dspark-model.md §6(a))."""
    name = "idx_topk_select"
    family = "topk_bypass"
    operands = ("fallback", "positions", "kv_seq_len")
    attrs = visibility_attrs() | {"k": Attr("int", REQUIRED)}
    reference = numpy_reference("topk_bypass", "idx_topk_select")

    def infer(self, ins, attrs):
        fallback, pos, kv_len = ins
        check_visibility(attrs, pos, kv_len)
        expect(fallback.rank == 2 and fallback.dtype == I32, f"fallback must be i32[T, score_len], got {fallback}")
        expect_same_dim(fallback.shape[0], pos.shape[0], "fallback rows vs positions")
        expect(fallback.shape[1].value() in (None, attrs["score_len"]),
               f"fallback width must be score_len = {attrs['score_len']}, got {fallback.shape[1]}")
        expect(0 < attrs["k"] <= attrs["score_len"], f"k must be in (0, score_len], got {attrs['k']}")
        return [fallback]

    def tile_axes(self, ins, outs, attrs):
        return [("tokens", ins[0].shape[0])]

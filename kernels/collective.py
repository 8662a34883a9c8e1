"""Cross-rank kernels of the TP O path (dspark-model.md §3.5, §4; dsv4-math §7): numpy references.

Collective references take every rank's operands (`per_rank[r] = [operand, ...]`) and return one result per rank.
"""
from __future__ import annotations

import numpy as np

from ._np import as_dtype, f32


def o_group_a2a(per_rank, *, ranks, **_):
    """All-to-all of O groups: rank r receives groups [r·LG, (r+1)·LG) of every source rank, rows src·T + t.

    Source operand: packed [G, T, width]; result per rank: [LG, ranks·T, width] (LG = G / ranks)."""
    packed = [np.asarray(ops[0]) for ops in per_rank]
    groups = packed[0].shape[0]
    lg = groups // ranks
    return [np.concatenate([p[r * lg:(r + 1) * lg] for p in packed], axis=1) for r in range(ranks)]


def tp_o_reduce_scatter(per_rank, *, ranks, out="bf16", **_):
    """Reduce-scatter of the f32 O partials [ranks·T, D]: rank r gets rows [r·T, (r+1)·T) summed over the source
    ranks in ascending order in f32, then rounded once to `out`."""
    partials = [f32(ops[0]) for ops in per_rank]
    t = partials[0].shape[0] // ranks
    results = []
    for r in range(ranks):
        acc = partials[0][r * t:(r + 1) * t].copy()
        for p in partials[1:]:
            acc = acc + p[r * t:(r + 1) * t]
        results.append(as_dtype(acc, out))
    return results

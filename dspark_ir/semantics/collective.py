"""Cross-rank kernels of the TP O path and the context-parallel all-gather (dspark-model.md §3.5, §4;
dsv4-math §7): numpy references.

Collective references take every rank's operands (`per_rank[r] = [operand, ...]`) and return one result per rank.
"""
from __future__ import annotations

import numpy as np

from .dtypes import as_dtype, f32
from .elementwise import slice_
from .oproj import o_proj_b_dequant
from .sparse import hca_stream_merge_pack
from .wire import cp_wire_pack, cp_wire_unpack


def o_group_a2a(per_rank, *, ranks, t_pad=1, **_):
    """All-to-all of O groups: rank r receives groups [r·LG, (r+1)·LG) of every source rank, rows src·T + t.

    Source operand: packed [G, T, width]; result per rank: the exchange window [LG, ranks·T_PAD, width]
    (LG = G / ranks, T_PAD = T rounded up to t_pad) whose rows ranks·T … are zero (the host zero-fills windows)."""
    packed = [np.asarray(ops[0]) for ops in per_rank]
    groups, tokens = packed[0].shape[:2]
    lg = groups // ranks
    pad_rows = ranks * (-(-tokens // t_pad) * t_pad) - ranks * tokens
    out = []
    for r in range(ranks):
        rows = np.concatenate([p[r * lg:(r + 1) * lg] for p in packed], axis=1)
        pad = np.zeros((lg, pad_rows) + rows.shape[2:], rows.dtype)
        out.append(np.concatenate([rows, pad], axis=1))
    return out


def hca_stream_merge_pack_publish(per_rank, *, ranks, o_groups, t_pad=1, **_):
    """The merge-pack published into the owners' windows (pypto-lib #1170 (b)): every source rank's packed heads
    are hca_stream_merge_pack of its operands, and rank r's window is o_group_a2a of them (the same values: the
    publish only changes where the packed tiles travel through)."""
    packed = [[hca_stream_merge_pack(*ops, o_groups=o_groups)] for ops in per_rank]
    return o_group_a2a(packed, ranks=ranks, t_pad=t_pad)


def cp_allgather(per_rank, *, ranks, **_):
    """Context-parallel all-gather: every rank receives every rank's payload rows, rank-major along axis 0
    (row src·T + t)."""
    gathered = np.concatenate([np.asarray(ops[0]) for ops in per_rank[:ranks]], axis=0)
    return [gathered.copy() for _ in range(ranks)]


def cp_own_rows(per_rank, *, ranks, fill=-1, **_):
    """Rank r keeps rows [r·T, (r+1)·T) of its operand (T = rows / ranks); every other row becomes `fill`."""
    out = []
    for r, ops in enumerate(per_rank[:ranks]):
        x = np.array(ops[0], copy=True)
        t = x.shape[0] // ranks
        keep = np.zeros(x.shape[0], bool)
        keep[r * t:(r + 1) * t] = True
        x[~keep] = fill
        out.append(x)
    return out


def cp_typed_allgather(per_rank, *, ranks, **_):
    """The typed push: every rank receives every rank's payload as wire rows (ops/wire.py), rank-major."""
    gathered = np.concatenate([cp_wire_pack(*ops) for ops in per_rank[:ranks]], axis=0)
    return [gathered.copy() for _ in range(ranks)]


def cp_typed_readback(per_rank, *, ranks, rows, width, kv=0, **_):
    """The typed read-back: every rank decodes its window's wire rows [0, rows) into the typed tensors."""
    return [cp_wire_unpack(np.asarray(ops[0])[:rows], width=width, kv=kv) for ops in per_rank[:ranks]]


def cp_rank_rows(per_rank, *, ranks, **_):
    """Rank r keeps rows [r·T, (r+1)·T) of each operand (T = rows / ranks)."""
    out = []
    for r, ops in enumerate(per_rank[:ranks]):
        mine = []
        for x in ops:
            x = np.asarray(x)
            t = x.shape[0] // ranks
            mine.append(np.array(x[r * t:(r + 1) * t]))
        out.append(tuple(mine) if len(mine) > 1 else mine[0])
    return out


def window_copy_out(per_rank, *, ranks, axis, rows, **_):
    """Copy-out wave of an exchange window: every rank copies its window's data rows [0, rows) along `axis` into a
    local tensor (the barriers around it move no data)."""
    return [slice_(ops[0], axis=axis, start=0, size=rows) for ops in per_rank]


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


def tp_o_dequant_reduce_scatter(per_rank, *, ranks, out="bf16", **_):
    """The O-B dequant published into the owners' windows, then the fixed-order reduce: every source rank's f32
    partial is o_proj_b_dequant of its operands (wo_b_scale, acc_0, s_0, ...), and rank r gets rows [r·T, (r+1)·T)
    of the partials summed over the source ranks ascending in f32, rounded once to `out` (the same values as
    tp_o_reduce_scatter of the o_proj_b_dequant partials)."""
    partials = [[o_proj_b_dequant(*ops, out="f32")] for ops in per_rank]
    return tp_o_reduce_scatter(partials, ranks=ranks, out=out)

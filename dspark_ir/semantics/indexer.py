"""Lightning-indexer kernels of the CSA layers (decode form, layer offset 0): query side, head weights, scores,
top-k and the bounded-index writer of the top-k bypass. numpy references following dsv4-math §5.2, §5.3.

Rounding points: the dequantised query is f32; after the RoPE (at the request's FIRST position for all S tokens) the
whole query row is rounded to bf16; the Hadamard product stays f32 and is quantised per (token, head) row with q8.
Head weights are the ascending f32 sum of WEIGHTS_OK K-split partials (each accumulated exactly and rounded once)
times index_weights_scale. score[t, l] = (Σ_h relu(f32(qI8·k_i8) · qIs) · w[t, h]) · k_s[l] over the visible
entries l < visible[t] = min(kv_seq_len[b] // r, (pos + 1) // r, score_len); the tail is open (`idx_score_open`:
the reference writes FP32_NEG_INF; upstream writes only the visible pages and the top-k masks by visible).
topk[t, :k] = the first k = min(idx_topk, visible) entries by descending score, ties → lower index first; −1 tail.
"""
from __future__ import annotations

import numpy as np

from goldens.numerics import q8

from .compressor import rope_rotate
from .dtypes import BF16, f32

F32 = np.float32
FP32_NEG_INF = F32(-3.4028234663852886e38)


def _mm(a, b) -> np.ndarray:
    return (np.asarray(a, np.float64) @ np.asarray(b, np.float64)).astype(F32)


def visible_lengths(positions, kv_seq_len, *, ratio, seq, score_len) -> np.ndarray:
    """visible[t] = min(kv_seq_len[b(t)] // r, (pos[t] + 1) // r, score_len) (i64 [T])."""
    pos = np.asarray(positions, dtype=np.int64)
    cache_len = np.asarray(kv_seq_len, dtype=np.int64)[np.arange(len(pos)) // seq] // ratio
    return np.minimum(np.minimum(cache_len, (pos + 1) // ratio), score_len)


# ---- query side ---------------------------------------------------------------------------------------------
def idx_qr_dequant(acc, qr_scale, wq_b_scale, *, heads, **_):
    """q = f32(acc) · qr_scale[t] · idx_wq_b_scale[n] → f32 [T, IH, IHD]."""
    q = f32(acc) * f32(qr_scale)[:, None] * f32(wq_b_scale)[None, :]
    return q.reshape(q.shape[0], heads, -1)


def idx_qr_rope(q, cos_il, sin_signed, swap, *, seq, **_):
    """RoPE of the last rope_dim dims of every head at the request's first position (per-request tables [B, R]
    repeated over its S tokens), then one bf16 rounding of the whole row → bf16 [T, IH, IHD]."""
    rows = np.arange(np.shape(q)[0]) // seq
    rotated = rope_rotate(q, f32(cos_il)[rows], f32(sin_signed)[rows], swap)
    return rotated.astype(BF16)


def idx_hadamard_matmul(q, hadamard, **_):
    """qh = f32(q) @ f32(H) per (token, head) row → f32 [T, IH, IHD] (not rounded)."""
    qf = f32(q)
    return _mm(qf.reshape(-1, qf.shape[-1]), f32(hadamard)).reshape(qf.shape)


def idx_q_quant(qh, **_):
    """q8 per (token, head) row → (qI8 i8 [T, IH, IHD], qIs f32 [T, IH])."""
    q_i8, q_s = q8(f32(qh))
    return q_i8, q_s[..., 0].astype(F32)


# ---- head weights -------------------------------------------------------------------------------------------
def idx_weights_proj(x, weights_proj, *, k_split, **_):
    """Partials [k_split, T, IH]: partial k = x[:, K_k] @ weights_proj[K_k] over contiguous K slices."""
    xf, wf = f32(x), f32(weights_proj)
    bounds = np.linspace(0, xf.shape[1], k_split + 1).astype(int)
    return np.stack([_mm(xf[:, lo:hi], wf[lo:hi]) for lo, hi in zip(bounds[:-1], bounds[1:])])


def idx_weights_reduce(partials, *, scale, **_):
    """w = (Σ_k partials[k], ascending, f32) · index_weights_scale → f32 [T, IH]."""
    p = f32(partials)
    acc = p[0].copy()
    for k in range(1, p.shape[0]):
        acc = acc + p[k]
    return acc * F32(scale)


# ---- score and top-k ----------------------------------------------------------------------------------------
def idx_score(q_i8, q_s, w, idx_kv_cache, idx_kv_scale, idx_block_table, positions, kv_seq_len, *, ratio, seq,
              block_size, score_len, max_visible=None, **_):
    """score f32 [T, score_len] over the visible entries (decode ordering: k_s after the head sum, heads summed
    ascending: one order the contract allows), visible capped at max_visible when given (the caller's context
    bound); entries on unmapped pages are FP32_NEG_INF; the tail (open: idx_score_open) is FP32_NEG_INF here."""
    vis = visible_lengths(positions, kv_seq_len, ratio=ratio, seq=seq, score_len=score_len)
    if max_visible is not None:
        vis = np.minimum(vis, max_visible)
    table = np.asarray(idx_block_table)
    cache, kscale = np.asarray(idx_kv_cache), f32(idx_kv_scale)
    qi, qs, wf = np.asarray(q_i8), f32(q_s), f32(w)
    out = np.full((len(vis), score_len), FP32_NEG_INF, F32)
    for t, n in enumerate(vis):
        if n == 0:
            continue
        logical = np.arange(n)
        pages = table[t // seq][logical // block_size]
        rows = np.where(pages >= 0, pages * block_size + logical % block_size, -1)
        safe = np.where(rows >= 0, rows, 0)
        dots = (qi[t].astype(np.float64) @ cache[safe].T.astype(np.float64)).astype(F32)
        per_head = np.maximum(dots * qs[t][:, None], F32(0.0)) * wf[t][:, None]
        score = np.sum(per_head, axis=0) * kscale[safe]
        out[t, :n] = np.where(rows >= 0, score, FP32_NEG_INF)
    return out


def idx_score_open(q_i8, q_s, w, idx_kv_cache, idx_kv_scale, idx_block_table, positions, kv_seq_len, *, ratio, seq,
                   score_len, max_visible=None, **_):
    """The entries of idx_score's result its contract leaves open (OpDef.open_entries): (mask bool [T, score_len],)
    True at l ≥ visible[t] (capped at max_visible, as idx_score). Upstream's score scope writes only the tiles of
    the visible prefix and the top-k re-masks by the visible count, so no consumer reads these entries."""
    vis = visible_lengths(positions, kv_seq_len, ratio=ratio, seq=seq, score_len=score_len)
    if max_visible is not None:
        vis = np.minimum(vis, max_visible)
    return (np.arange(score_len)[None, :] >= vis[:, None],)


def staged_sort(row, stages) -> np.ndarray:
    """The positions of `row` after a staged descending sort (dspark-model.md §6(h)): stage i leaves runs of
    stages[i] entries each ordered (the first sorts each run, sort32; each later one merges whole runs of the one
    before, mrgsort; ties → lower index first). A merge of ordered runs is the ordered run of their union, so each
    stage is an ordered sort of each of its runs; the row stays unordered across runs of the widest stage."""
    n = len(row)
    order = np.arange(n)
    for width in stages:
        full = n - n % width
        for lo, hi, w in ((0, full, width), (full, n, n - full)):     # the whole runs, then a ragged last run
            if hi > lo:
                runs = order[lo:hi].reshape(-1, w)
                perm = np.lexsort((runs, -row[runs]), axis=-1)
                order[lo:hi] = np.take_along_axis(runs, perm, axis=-1).ravel()
    return order


def idx_topk(score, positions, kv_seq_len, *, k, ratio, seq, score_len, max_visible=None, sort_stages=None, **_):
    """i32 [T, score_len]: the first min(k, visible) entries by descending score (stable: ties keep the lower
    index first), then −1; visible capped at max_visible when given (as idx_score). With `sort_stages`, the first
    min(k, visible) entries of the staged sort of the row (entries at or past visible masked to −inf): the top-k
    while the widest stage covers the visible prefix, the first runs' keys past it."""
    vis = visible_lengths(positions, kv_seq_len, ratio=ratio, seq=seq, score_len=score_len)
    if max_visible is not None:
        vis = np.minimum(vis, max_visible)
    s = f32(score)
    out = np.full(s.shape, -1, np.int32)
    for t, n in enumerate(vis):
        kk = min(k, int(n))
        if sort_stages is None:
            out[t, :kk] = np.argsort(-s[t, :n], kind="stable")[:kk]
        else:
            masked = np.where(np.arange(score_len) < n, s[t].astype(np.float64), -np.inf)
            out[t, :kk] = staged_sort(masked, sort_stages)[:kk]
    return out


def idx_topk_bounded(positions, kv_seq_len, *, k, ratio, seq, score_len, **_):
    """The top-k bypass writer (dspark-model.md §6(a)): 0 … visible−1 then −1, i32 [T, score_len]. Equal to
    `idx_topk` as a set whenever visible ≤ k for every token."""
    vis = visible_lengths(positions, kv_seq_len, ratio=ratio, seq=seq, score_len=score_len)
    cols = np.arange(score_len)[None, :]
    return np.where(cols < np.minimum(vis, k)[:, None], cols, -1).astype(np.int32)

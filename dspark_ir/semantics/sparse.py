"""Sparse-attention kernels of the CSA and HCA decode layers: cache writeback, the CSA plan stage and per-block
qk_pv partials with their merge, and the HCA two-stream form (raw-window attention, compressed work-item partials,
stream merge, inverse-RoPE pack). numpy references following dsv4-math §6.

Tile numerics (§6.2), for every key tile (the CSA window tile and top-k tiles of ATTN_K_TILE rows; the HCA raw
window as ONE tile and each compressed work item of CMP_PAGES_PER_WORK pages):
    s = (q·Kᵀ)·scale (exact accumulation, one f32 rounding); s = −1e20 where invalid; m = rowmax(s);
    p = exp(s − m) (0 where invalid); l = Σp (unrounded p); o = rb(p)·rb(K).
Partials merge in list order (CSA: window tile, then top-k tiles; HCA: raw stream, then work items ascending) with
M = max(m, m_i), l = a·l + b·l_i, o = a·o + b·o_i; then out = o / (l + exp(sink[h] − m)). A fully masked tile is
neutral (m = −1e20, l = 0, o = 0). The output is inverse-RoPE'd at the query position, rounded to bf16 once and
packed group-major [o_groups, T, heads_per_group·head_dim].
"""
from __future__ import annotations

import numpy as np

from .compressor import rope_rotate
from .dtypes import BF16, f32

F32 = np.float32
NEG_INF_ATTN = F32(-1.0e20)


def _einsum(spec: str, *ops) -> np.ndarray:
    return np.einsum(spec, *(np.asarray(o, np.float64) for o in ops)).astype(F32)


def _page_rows(table_row, logical, block_size: int) -> np.ndarray:
    """Physical rows of logical rows through one block-table row; −1 for negative, beyond-table or unmapped."""
    logical = np.asarray(logical, dtype=np.int64)
    width = len(table_row)
    page = logical // block_size
    inside = (logical >= 0) & (page < width)
    block = np.asarray(table_row)[np.where(inside, page, 0)]
    return np.where(inside & (block >= 0), block * block_size + logical % block_size, -1)


def _gather(pool, rows) -> np.ndarray:
    """pool[rows] (−1 rows read as zeros), same dtype."""
    rows = np.asarray(rows)
    valid = rows >= 0
    data = np.asarray(pool)[np.where(valid, rows, 0)]
    return np.where(valid[..., None], data, np.zeros((), data.dtype)).astype(data.dtype)


def tile_partial(q, keys, valid, scale, keys_t=None):
    """(m [T,H], l [T,H], o [T,H,HD]) of one key tile; keys [T, L, HD] (keys_t [T, HD, L] for QKᵀ if given)."""
    if keys_t is None:
        s = _einsum("thd,tld->thl", f32(q), f32(keys)) * F32(scale)
    else:
        s = _einsum("thd,tdl->thl", f32(q), f32(keys_t)) * F32(scale)
    mask = np.asarray(valid)[:, None, :]
    s = np.where(mask, s, NEG_INF_ATTN)
    m = np.max(s, axis=-1)
    p = np.where(mask, np.exp(s - m[..., None]), F32(0.0))
    p_bf = p.astype(BF16).astype(F32)
    k_bf = f32(keys).astype(BF16).astype(F32)
    return m, np.sum(p, axis=-1), _einsum("thl,tld->thd", p_bf, k_bf)


def merge_into(m, l, o, m_i, l_i, o_i):
    """Fold one partial into a running (m, l, o) state."""
    big = np.maximum(m, m_i)
    a, b = np.exp(m - big), np.exp(m_i - big)
    return big, a * l + b * l_i, a[..., None] * o + b[..., None] * o_i


def sink_normalize(m, l, o, sink) -> np.ndarray:
    with np.errstate(over="ignore"):
        denom = f32(l) + np.exp(f32(sink)[None, :] - f32(m))
    return f32(o) / denom[..., None]


def derotate_pack(heads, cos_il, sin_signed, swap=None, *, o_groups) -> np.ndarray:
    """Inverse RoPE at the query position, one bf16 rounding, heads packed group-major → [G, T, hpg·HD] bf16."""
    out = rope_rotate(heads, cos_il, sin_signed, swap, inverse=True).astype(BF16)
    t, h, d = out.shape
    return np.ascontiguousarray(out.reshape(t, o_groups, (h // o_groups) * d).transpose(1, 0, 2))


# ---- cache writeback, WAR marker, output bridge -------------------------------------------------------------
def kv_cache_writeback(kv, kv_cache, slot_mapping, **_):
    """kv_cache (new version) with kv[t] at row slot_mapping[t]; −1 skipped, later tokens win."""
    cache = np.array(kv_cache, copy=True)
    slots = np.asarray(slot_mapping)
    keep = slots >= 0
    cache[slots[keep]] = np.asarray(kv)[keep]
    return cache


def kv_touch(kv_cache, **_):
    """No-op self-copy (the WAR marker that makes kv_cache an InOut of the sparse stage)."""
    return np.array(kv_cache, copy=True)


def o_local_bridge(x, **_):
    """Copy of the reduce-scattered O rows into the layer's attention output (csa_o_local_bridge,
    hca_output_bridge)."""
    return np.array(x, copy=True)


# ---- CSA ----------------------------------------------------------------------------------------------------
def csa_slots_build_valid_qk_plan(topk, positions, cmp_block_table, swa_indices, *, ratio, seq, block_size,
                                  idx_topk, k_tile, **_):
    """Mask the top-k list to [0, (pos+1)//r) and map it through cmp_block_table. Returns
    (cmp_sparse_indices i32 [T, idx_topk] physical rows or −1, valid_block_mask i32 [T, blocks],
    sparse_bias f32 [T, window + idx_topk] (0 valid / −1e20), qk_order i32 [T·blocks]: the (token, block) items,
    non-empty first, each group in ascending item order)."""
    pos = np.asarray(positions, dtype=np.int64)
    raw = np.asarray(topk)[:, :idx_topk].astype(np.int64)
    keep = (raw >= 0) & (raw < ((pos + 1) // ratio)[:, None])
    logical = np.where(keep, raw, -1)
    table = np.asarray(cmp_block_table)
    rows = np.stack([_page_rows(table[t // seq], logical[t], block_size) for t in range(len(pos))])
    valid = np.concatenate([np.asarray(swa_indices) >= 0, rows >= 0], axis=1)
    bias = np.where(valid, F32(0.0), NEG_INF_ATTN).astype(F32)
    blocks = valid.shape[1] // k_tile
    nonempty = valid.reshape(len(pos), blocks, k_tile).any(axis=-1)
    items = np.arange(len(pos) * blocks)
    flat = nonempty.reshape(-1)
    order = np.concatenate([items[flat], items[~flat]]).astype(np.int32)
    return rows.astype(np.int32), nonempty.astype(np.int32), bias, order


def csa_qk_pv(q, kv_cache, swa_indices, cmp_kv, cmp_sparse_indices, sparse_bias, qk_order, *, scale, k_tile,
              live_blocks=None, **_):
    """Per-(token, block) partials over [window rows | top-k rows] in k_tile-wide blocks: (m, l) f32 [T, blocks, H],
    o f32 [T, blocks, H, HD]; only the first live_blocks blocks when given. Invalid rows (bias < 0 or index −1) are
    masked. The item order does not change the values (every item writes its own partial)."""
    keys = np.concatenate([f32(_gather(kv_cache, swa_indices)), f32(_gather(cmp_kv, cmp_sparse_indices))], axis=1)
    index = np.concatenate([np.asarray(swa_indices), np.asarray(cmp_sparse_indices)], axis=1)
    valid = (f32(sparse_bias) >= 0) & (index >= 0)
    width = keys.shape[1] if live_blocks is None else live_blocks * k_tile
    parts = [tile_partial(q, keys[:, a:a + k_tile], valid[:, a:a + k_tile], scale)
             for a in range(0, width, k_tile)]
    return tuple(np.stack([p[i] for p in parts], axis=1) for i in range(3))


def csa_merge_norm(m, l, o, sink, cos_il, sin_signed, *, o_groups, **_):
    """Merge the blocks in order, sink-normalise, inverse RoPE, bf16, group-major pack → [G, T, hpg·HD]."""
    m, l, o = f32(m), f32(l), f32(o)
    state = (m[:, 0], l[:, 0], o[:, 0])
    for i in range(1, m.shape[1]):
        state = merge_into(*state, m[:, i], l[:, i], o[:, i])
    return derotate_pack(sink_normalize(*state, sink), cos_il, sin_signed, o_groups=o_groups)


# ---- HCA ----------------------------------------------------------------------------------------------------
def hca_raw_transpose(rows, **_):
    """Window rows [T, W, HD] → Kᵀ tiles [T, HD, W] (same dtype)."""
    return np.ascontiguousarray(np.swapaxes(np.asarray(rows), 1, 2))


def hca_raw_attn(q, rows, rows_t, indices, *, scale, **_):
    """The raw-window stream: ONE tile over the window rows (valid where index ≥ 0) → stream state
    (m f32 [T, H], l f32 [T, H], heads f32 [T, H, HD] unnormalised)."""
    return tile_partial(q, rows, np.asarray(indices) >= 0, scale, keys_t=rows_t)


def hca_raw_attn_direct(q, rows, indices, *, scale, **_):
    """hca_raw_attn without the transposed copy: the same tile over the window rows (q·Kᵀ from the rows)."""
    return tile_partial(q, rows, np.asarray(indices) >= 0, scale)


def _row_extent(indices) -> np.ndarray:
    """Per token, 1 + the last column that holds an index (≥ 0); 0 for a row of −1 only."""
    ok = np.asarray(indices) >= 0
    width = ok.shape[1]
    return np.where(ok.any(axis=1), width - np.argmax(ok[:, ::-1], axis=1), 0)


def request_window_rows(indices, seq: int) -> np.ndarray:
    """ridx i32 [B, W + seq − 1]: per request, the first token's index row up to its extent, then each later
    token's newest index, −1 past them (hca_request_kv_gather's row list)."""
    idx = np.asarray(indices)
    tokens, width = idx.shape
    ext = _row_extent(idx)
    ridx = np.full((tokens // seq, width + seq - 1), -1, dtype=np.int64)
    for b in range(tokens // seq):
        t0 = b * seq
        ridx[b, :ext[t0]] = idx[t0, :ext[t0]]
        for k in range(1, seq):
            if ext[t0 + k]:
                ridx[b, ext[t0] + k - 1] = idx[t0 + k, ext[t0 + k] - 1]
    return ridx


def hca_request_kv_gather(kv_cache, indices, *, seq, **_):
    """rows [B, W + seq − 1, HD] = kv_cache[request_window_rows] (−1 → zeros)."""
    return _gather(kv_cache, request_window_rows(indices, seq))


def hca_raw_attn_request(q, rows, indices, *, scale, seq, **_):
    """hca_raw_attn on each token's window rows taken from its request's rows: token t (k-th of request b) reads
    rows[b, d_t + c] for column c, d_t = e_{t0} + k − e_t; keys zero where indices[t, c] < 0."""
    idx = np.asarray(indices)
    tokens, width = idx.shape
    ext = _row_extent(idx)
    tok = np.arange(tokens)
    first = tok - tok % seq
    start = np.clip(ext[first] + tok % seq - ext, 0, seq - 1)
    cols = start[:, None] + np.arange(width)[None, :]
    keys = np.asarray(rows)[tok // seq][tok[:, None], cols]
    valid = idx >= 0
    keys = np.where(valid[..., None], keys, np.zeros((), keys.dtype))
    return tile_partial(q, keys, valid, scale)


def hca_cmp_work_gather(cmp_kv, cmp_block_table, *, block_size, work_rows, works, **_):
    """Per request, the compressed rows 0 … works·work_rows − 1 (logical order) through cmp_block_table:
    (rows bf16 [B, works·work_rows, HD] with unmapped rows zero, physical row i32 [B, works·work_rows] or −1)."""
    table = np.asarray(cmp_block_table)
    logical = np.arange(works * work_rows)
    phys = np.stack([_page_rows(table[b], logical, block_size) for b in range(table.shape[0])])
    return _gather(cmp_kv, phys), phys.astype(np.int32)


def hca_visible(positions, kv_seq_len, *, ratio, seq, max_rows) -> np.ndarray:
    """n[t] = min((pos+1)//R, kv_seq_len[b]//R, max_rows) visible compressed rows."""
    pos = np.asarray(positions, dtype=np.int64)
    kv_len = np.asarray(kv_seq_len, dtype=np.int64)[np.arange(len(pos)) // seq]
    return np.minimum(np.minimum((pos + 1) // ratio, kv_len // ratio), max_rows)


def hca_cmp_qk_pv(q, cmp_rows, cmp_phys, positions, kv_seq_len, *, scale, ratio, seq, work_rows, max_rows, **_):
    """Per-(token, work item) partials over the request's compressed rows, valid where row < n[t] and mapped;
    items past the visible rows are neutral. (m, l) f32 [T, works, H], o f32 [T, works, H, HD]."""
    n = hca_visible(positions, kv_seq_len, ratio=ratio, seq=seq, max_rows=max_rows)
    req = np.arange(len(n)) // seq
    keys = f32(cmp_rows)[req]
    cols = np.arange(keys.shape[1])[None, :]
    valid = (cols < n[:, None]) & (np.asarray(cmp_phys)[req] >= 0)
    parts = [tile_partial(q, keys[:, a:a + work_rows], valid[:, a:a + work_rows], scale)
             for a in range(0, keys.shape[1], work_rows)]
    return tuple(np.stack([p[i] for p in parts], axis=1) for i in range(3))


def hca_stream_merge(m, l, heads, cm, cl, co, sink, **_):
    """Fold the work-item partials into the raw stream in ascending work order, then apply the sink:
    normalised f32 [T, H, HD] (written back to stream_heads)."""
    state = (f32(m), f32(l), f32(heads))
    cm, cl, co = f32(cm), f32(cl), f32(co)
    for w in range(cm.shape[1]):
        state = merge_into(*state, cm[:, w], cl[:, w], co[:, w])
    return sink_normalize(*state, sink)


def hca_stream_pack(heads, cos_il, sin_signed, swap, *, o_groups, **_):
    """Inverse RoPE (at the query position), bf16, group-major pack → [G, T, hpg·HD]."""
    return derotate_pack(heads, cos_il, sin_signed, swap, o_groups=o_groups)


def hca_stream_merge_pack(m, l, heads, cm, cl, co, sink, cos_il, sin_signed, swap, *, o_groups, **_):
    """The fused form of hca_stream_merge → hca_stream_pack (dspark-model.md §6(c)): bit-identical."""
    merged = hca_stream_merge(m, l, heads, cm, cl, co, sink)
    return hca_stream_pack(merged, cos_il, sin_signed, swap, o_groups=o_groups)

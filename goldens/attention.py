"""Sparse MQA attention of the decode layers: row lists, tile softmax with log-sum-exp merge and sink, inverse
RoPE and grouped packing (dsv4-math §6).

Every kind attends over a key list `[window rows | compressed rows]` cut into tiles that are merged in list
order. SWA: the window only. CSA: window + masked top-k, tiled by ATTN_K_TILE. HCA: the window as one stream,
then the visible compressed rows in ascending work items of CMP_PAGES_PER_WORK pages.
"""
from __future__ import annotations

import numpy as np

from .config import ModelConfig, tiles_for
from .numerics import F32, NEG_INF_ATTN, einsum, f32, rb, rope_last
from .paging import gather_rows, page_rows, request_of_tokens


def swa_window(swa_indices, swa_lens) -> tuple[np.ndarray, np.ndarray]:
    """SWA: (rows, valid) with columns ≥ swa_lens AND slots < 0 masked (§6.1)."""
    rows = np.asarray(swa_indices)
    cols = np.arange(rows.shape[1])[None, :]
    valid = (rows >= 0) & (cols < np.asarray(swa_lens)[:, None])
    return np.where(valid, rows, -1), valid


def sparse_window(swa_indices) -> tuple[np.ndarray, np.ndarray]:
    """CSA/HCA: (rows, valid) with only slots < 0 masked (§6.1)."""
    rows = np.asarray(swa_indices)
    return rows, rows >= 0


def csa_compressed_rows(cfg: ModelConfig, topk, positions, cmp_block_table) -> np.ndarray:
    """Physical cmp_kv rows [T, idx_topk] of topk[:, :idx_topk] kept iff 0 ≤ raw < (pos+1)//r, else −1 (§6.1)."""
    positions = np.asarray(positions)
    raw = np.asarray(topk)[:, : cfg.idx_topk]
    keep = (raw >= 0) & (raw < ((positions + 1) // cfg.csa_ratio)[:, None])
    req = request_of_tokens(len(positions), cfg.seq)
    return page_rows(cmp_block_table[req], np.where(keep, raw, -1), cfg.block_size)


def hca_visible(cfg: ModelConfig, positions, kv_seq_len) -> np.ndarray:
    """n[t] = min((pos+1)//R, kv_len//R, HCA_MAX_COMPRESSED_ROWS) visible compressed rows (§6.1)."""
    positions = np.asarray(positions)
    kv_len = np.asarray(kv_seq_len)[request_of_tokens(len(positions), cfg.seq)]
    r = cfg.hca_ratio
    return np.minimum(np.minimum((positions + 1) // r, kv_len // r), tiles_for(cfg).HCA_MAX_COMPRESSED_ROWS)


def hca_compressed_rows(cfg: ModelConfig, positions, kv_seq_len, cmp_block_table) -> np.ndarray:
    """Physical cmp_kv rows [T, L] of entries 0 … n−1 ascending, −1 padded to whole work items (§6.1)."""
    n = hca_visible(cfg, positions, kv_seq_len)
    work = work_rows(cfg)
    width = -(-int(n.max(initial=0)) // work) * work
    logical = np.arange(width)[None, :]
    req = request_of_tokens(len(n), cfg.seq)
    return page_rows(cmp_block_table[req], np.where(logical < n[:, None], logical, -1), cfg.block_size)


def work_rows(cfg: ModelConfig) -> int:
    """Rows of one HCA compressed work item: CMP_PAGES_PER_WORK pages (§6.2)."""
    return tiles_for(cfg).CMP_PAGES_PER_WORK * cfg.block_size


def tile_partial(q, keys, valid, scale: float):
    """(m [T,H], l [T,H], o [T,H,HD]) of one key tile (§6.2): l sums the unrounded p; P·V uses rb(p), rb(K)."""
    s = einsum("thd,tld->thl", q, keys) * F32(scale)
    mask = valid[:, None, :]
    s = np.where(mask, s, NEG_INF_ATTN)
    m = np.max(s, axis=-1)
    p = np.where(mask, np.exp(s - m[..., None]), F32(0.0))
    return m, np.sum(p, axis=-1), einsum("thl,tld->thd", rb(p), rb(keys))


def merge_partials(parts):
    """Fold (m, l, o) partials in list order (§6.2)."""
    m, l, o = parts[0]
    for m_i, l_i, o_i in parts[1:]:
        big = np.maximum(m, m_i)
        a, b = np.exp(m - big), np.exp(m_i - big)
        l = a * l + b * l_i
        o = a[..., None] * o + b[..., None] * o_i
        m = big
    return m, l, o


def sink_normalize(m, l, o, sink) -> np.ndarray:
    """out = o / (l + exp(sink[h] − m)); a token without valid rows gets 0 (§6.2)."""
    with np.errstate(over="ignore"):
        denom = l + np.exp(f32(sink)[None, :] - m)
    return o / denom[..., None]


def attend(cfg: ModelConfig, q, keys, valid, bounds: list[tuple[int, int]], sink) -> np.ndarray:
    """Tile softmax over keys[:, a:b] for each (a, b) in order, merged, sink-normalised. f32 [T, H, HD]."""
    parts = [tile_partial(q, keys[:, a:b], valid[:, a:b], cfg.softmax_scale) for a, b in bounds]
    return sink_normalize(*merge_partials(parts), sink)


def even_tiles(start: int, stop: int, size: int) -> list[tuple[int, int]]:
    return [(a, min(a + size, stop)) for a in range(start, stop, size)]


def gather_keys(pool, rows, valid=None) -> tuple[np.ndarray, np.ndarray]:
    """(keys [T, L, HD], valid [T, L]); rows −1 read as zeros and are invalid."""
    keys, present = gather_rows(f32(pool), rows)
    return keys, present if valid is None else (present & valid)


def derotate_pack(cfg: ModelConfig, out, c, s) -> np.ndarray:
    """Inverse RoPE at the query position, rb, heads grouped: [o_groups, T_PAD, hpg·head_dim] (§6.3)."""
    o = rb(rope_last(out, c[:, None, :], s[:, None, :], inverse=True))
    tokens = o.shape[0]
    packed = np.zeros((cfg.o_groups, cfg.t_pad, cfg.heads_per_group * cfg.head_dim), dtype=np.float32)
    grouped = o.reshape(tokens, cfg.o_groups, cfg.heads_per_group * cfg.head_dim)
    packed[:, :tokens] = grouped.transpose(1, 0, 2)
    return packed

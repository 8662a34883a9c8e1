"""SWA sparse-attention kernels: cache insert + valid bias, window gather, tile QK/PV, merge + sink + inverse
RoPE + grouped pack. numpy references (dsv4-math §6).

Rounding points (dsv4-math §6.2, §11.1): scores, m, l and the o accumulator are f32 (matmuls accumulate exactly
and round once, like the golden convention); P is rounded to bf16 for P·V only (l sums the unrounded p); K/V are
bf16 in the cache. The output is sink-normalised in f32, inverse-RoPE'd and rounded once per element.
"""
from __future__ import annotations

import numpy as np

from .dtypes import BF16, f32
from .qkv import rope_il
from .sparse import kv_cache_writeback

F32 = np.float32
NEG_INF_ATTN = F32(-1.0e20)


def _einsum(spec: str, *ops) -> np.ndarray:
    """einsum accumulated in f64 and rounded once to f32 (order-independent, per-row exact)."""
    return np.einsum(spec, *(np.asarray(o, np.float64) for o in ops)).astype(F32)


def swa_cache_insert_valid_bias(kv, kv_cache, slot_mapping, lens, *, window, **_):
    """(kv_cache with kv[t] stored at row slot_mapping[t] (−1 skipped, later rows win),
    sparse_bias[T, window] = 0 where column < lens[t], else −1e20)."""
    return swa_cache_writeback(kv, kv_cache, slot_mapping), swa_valid_bias(lens, window=window)


def swa_cache_writeback(kv, kv_cache, slot_mapping, **_):
    """A new kv_cache with kv[t] at row slot_mapping[t]; −1 skipped; later rows win (kv_cache_writeback's scatter)."""
    return kv_cache_writeback(kv, kv_cache, slot_mapping)


def swa_valid_bias(lens, *, window, **_):
    """sparse_bias[T, window] = 0 where column < lens[t], else −1e20 (f32)."""
    cols = np.arange(window)[None, :]
    return np.where(cols < np.asarray(lens)[:, None], F32(0.0), NEG_INF_ATTN).astype(F32)


def swa_gather_kv(kv_cache, indices, **_):
    """Window rows kv_cache[indices[t, j]] → [T, W, head_dim]; index −1 reads as zeros."""
    idx = np.asarray(indices)
    valid = idx >= 0
    rows = np.asarray(kv_cache)[np.where(valid, idx, 0)]
    return np.where(valid[..., None], rows, np.zeros((), rows.dtype)).astype(rows.dtype)


def qk_pv(q, kv_rows, bias, indices, *, scale, k_tile=None, **_):
    """Per-token attention partials over the window in k_tile-wide tiles merged in order (dsv4-math §6.2):
    s = (q·Kᵀ)·scale masked to −1e20 where bias < 0 or index < 0; m = rowmax, p = exp(s − m) (0 where masked),
    l = Σp, o = rb(p)·rb(K). Returns (m [T,H], l [T,H], o [T,H,head_dim]), f32."""
    keys = f32(kv_rows)
    valid = (f32(bias) >= 0) & (np.asarray(indices) >= 0)
    width = keys.shape[1]
    tile = k_tile or width
    parts = [_tile(q, keys[:, a:a + tile], valid[:, a:a + tile], scale) for a in range(0, width, tile)]
    m, l, o = parts[0]
    for m_i, l_i, o_i in parts[1:]:
        big = np.maximum(m, m_i)
        a, b = np.exp(m - big), np.exp(m_i - big)
        l = a * l + b * l_i
        o = a[..., None] * o + b[..., None] * o_i
        m = big
    return m, l, o


def _tile(q, keys, valid, scale):
    s = _einsum("thd,tld->thl", q, keys) * F32(scale)
    mask = valid[:, None, :]
    s = np.where(mask, s, NEG_INF_ATTN)
    m = np.max(s, axis=-1)
    p = np.where(mask, np.exp(s - m[..., None]), F32(0.0))
    p_bf = p.astype(BF16).astype(F32)
    k_bf = keys.astype(BF16).astype(F32)
    return m, np.sum(p, axis=-1), _einsum("thl,tld->thd", p_bf, k_bf)


def merge_norm(m, l, o, sink, cos_il, sin_signed, *, o_groups, **_):
    """out = o / (l + exp(sink[h] − m)); inverse RoPE on the last rope_dim dims at the query position; one bf16
    rounding; heads packed group-major → [o_groups, T, heads_per_group·head_dim] bf16."""
    with np.errstate(over="ignore"):
        denom = f32(l) + np.exp(f32(sink)[None, :] - f32(m))
    out = f32(o) / denom[..., None]
    out = rope_il(out, cos_il, sin_signed, inverse=True).astype(BF16)
    t, h, d = out.shape
    return np.ascontiguousarray(out.reshape(t, o_groups, (h // o_groups) * d).transpose(1, 0, 2))

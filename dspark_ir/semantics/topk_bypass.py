"""Guarded CSA top-k bypass (dspark-model.md §6(a)): numpy reference of `idx_topk_select`.

It reuses the indexer family's visibility and bounded-index writer (kernels/indexer.py), so the bypassed rows are
bit for bit what `idx_topk_bounded` writes and the per-token condition uses the same visible length as `idx_topk`.
"""
from __future__ import annotations

import numpy as np

from .indexer import idx_topk_bounded, visible_lengths


def idx_topk_select(fallback, positions, kv_seq_len, *, k, ratio, seq, score_len, **_):
    """i32 [T, score_len]: row t is 0 … visible[t]−1, −1 tail when visible[t] ≤ k, else fallback[t]."""
    vis = visible_lengths(positions, kv_seq_len, ratio=ratio, seq=seq, score_len=score_len)
    bounded = idx_topk_bounded(positions, kv_seq_len, k=k, ratio=ratio, seq=seq, score_len=score_len)
    return np.where((vis <= k)[:, None], bounded, np.asarray(fallback)).astype(np.int32)

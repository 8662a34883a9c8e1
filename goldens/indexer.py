"""Lightning indexer of CSA layers: C8 key cache, query side, head weights, scores, visibility and top-k
(dsv4-math §5). Decode form, layer offset 0.
"""
from __future__ import annotations

import numpy as np

from .compressor import Entry
from .config import ModelConfig
from .numerics import FP32_NEG_INF, deq, f32, imatmul, matmul, q8, rb, rope_half, rope_last
from .paging import page_rows, request_of_tokens


def index_key(y, hadamard) -> tuple[np.ndarray, np.ndarray]:
    """k = rb(rb(y) @ H), then q8 per entry: (int8 [.., HD], scale [.., 1]) (§5.1)."""
    return q8(rb(matmul(rb(y), f32(hadamard))))


def write_index_cache(idx_kv_cache, idx_kv_scale, entries: list[Entry], slots, hadamard):
    """Store every pooled inner-compressor entry at idx_slot_mapping[token] as int8 + scale (§5.1)."""
    cache, scale = idx_kv_cache.copy(), f32(idx_kv_scale).copy()
    for entry in entries:
        row = int(slots[entry.token])
        if row < 0:
            continue
        k_i8, k_s = index_key(entry.y, hadamard)
        cache[row], scale[row] = k_i8, k_s[0]
    return cache, scale


def index_query(cfg: ModelConfig, qr, qr_scale, idx_wq_b, idx_wq_b_scale, hadamard, c_first, s_first):
    """(qI8 [T, IH, IHD] int8, qIs [T, IH, 1]) (§5.2). RoPE at the request's FIRST position for all S tokens."""
    q = deq(imatmul(qr, idx_wq_b), qr_scale, idx_wq_b_scale).reshape(-1, cfg.idx_heads, cfg.idx_head_dim)
    q = rb(rope_last(q, c_first[:, None, :], s_first[:, None, :]))
    return q8(matmul(q, f32(hadamard)))


def head_weights(cfg: ModelConfig, x_normed, weights_proj) -> np.ndarray:
    """w = (x @ weights_proj) · index_weights_scale, [T, IH] (§5.2)."""
    return matmul(f32(x_normed), f32(weights_proj)) * np.float32(cfg.index_weights_scale)


def visible_lengths(cfg: ModelConfig, positions, kv_seq_len) -> np.ndarray:
    """visible[t] = min(kv_seq_len[b]//r, (pos+1)//r, score_len) (§5.3)."""
    positions = np.asarray(positions)
    cache_len = np.asarray(kv_seq_len)[request_of_tokens(len(positions), cfg.seq)] // cfg.csa_ratio
    return np.minimum(np.minimum(cache_len, (positions + 1) // cfg.csa_ratio), cfg.score_len)


def index_scores(cfg: ModelConfig, q_i8, q_s, w, idx_kv_cache, idx_kv_scale, idx_block_table,
                 visible) -> np.ndarray:
    """score [T, score_len]: decode ordering, k_s applied after the head sum; tail FP32_NEG_INF (§5.2, §5.3)."""
    tokens = len(visible)
    req = request_of_tokens(tokens, cfg.seq)
    out = np.full((tokens, cfg.score_len), FP32_NEG_INF, dtype=np.float32)
    for t in range(tokens):
        n = int(visible[t])
        if n == 0:
            continue
        rows = page_rows(idx_block_table[req[t]][None, :], np.arange(n)[None, :], cfg.block_size)[0]
        if np.any(rows < 0):
            raise ValueError(f"idx_block_table: entry of token {t} within visible={n} is on an unmapped page")
        dots = imatmul(q_i8[t], idx_kv_cache[rows].T)
        per_head = np.maximum(dots * q_s[t], 0.0) * w[t][:, None]
        out[t, :n] = np.sum(per_head, axis=0) * f32(idx_kv_scale)[rows]
    return out


def topk_indices(cfg: ModelConfig, score, visible, offset: int = 0) -> np.ndarray:
    """[T, score_len] int32: the first min(idx_topk, visible) entries by descending score (ties: lower index
    first) + offset, then −1 (§5.3)."""
    out = np.full(score.shape, -1, dtype=np.int32)
    for t, n in enumerate(np.asarray(visible)):
        k = min(cfg.idx_topk, int(n))
        order = np.argsort(-score[t, :n], kind="stable")[:k]
        out[t, :k] = order + offset
    return out


def bypass_topk(cfg: ModelConfig, visible, width: int | None = None, offset: int = 0) -> np.ndarray:
    """The bypass form (dspark-model.md §6(a)): 0 … visible−1 (+offset), −1 tail; needs visible ≤ idx_topk."""
    visible = np.asarray(visible)
    if np.any(visible > cfg.idx_topk):
        raise ValueError("visible: bypass needs visible ≤ idx_topk for every token")
    cols = np.arange(width or cfg.score_len)
    return np.where(cols[None, :] < visible[:, None], cols[None, :] + offset, -1).astype(np.int32)


def indexer_topk(cfg: ModelConfig, x_normed, qr, qr_scale, positions, inputs: dict,
                 idx_kv_cache, idx_kv_scale, trace: dict | None = None, bypass: bool = False) -> np.ndarray:
    """Query side + head weights + scores + top-k for one decode step (§5.2, §5.3). [T, score_len] int32.

    inputs: idx_wq_b, idx_wq_b_scale, idx_hadamard, idx_weights_proj, idx_block_table, kv_seq_len, rope_cos,
    rope_sin. The key cache must already hold this step's entries. bypass=True gives the per-token form of
    dspark-model.md §6(a): tokens with visible ≤ idx_topk take 0 … visible−1 instead of their scored order.
    """
    positions = np.asarray(positions)
    first = positions[request_of_tokens(len(positions), cfg.seq) * cfg.seq]
    c, s = rope_half(inputs["rope_cos"], first), rope_half(inputs["rope_sin"], first)
    q_i8, q_s = index_query(cfg, qr, qr_scale, inputs["idx_wq_b"], inputs["idx_wq_b_scale"],
                            inputs["idx_hadamard"], c, s)
    w = head_weights(cfg, x_normed, inputs["idx_weights_proj"])
    visible = visible_lengths(cfg, positions, inputs["kv_seq_len"])
    score = index_scores(cfg, q_i8, q_s, w, idx_kv_cache, idx_kv_scale, inputs["idx_block_table"], visible)
    topk = topk_indices(cfg, score, visible)
    if bypass:
        small = visible <= cfg.idx_topk
        topk[small] = bypass_topk(cfg, visible[small])
    if trace is not None:
        trace.update({"idx.q_i8": q_i8, "idx.q_scale": q_s, "idx.weights": w, "idx.visible": visible,
                      "idx.score": score, "idx.topk": topk})
    return topk


__all__ = [
    "index_key", "write_index_cache", "index_query", "head_weights", "visible_lengths", "index_scores",
    "topk_indices", "bypass_topk", "indexer_topk",
]

"""KV compressors: ratio-4 overlap (CSA main, indexer inner) and ratio-R non-overlap (HCA) (dsv4-math §4).

State rows are f32 `[kv(OUT) | score(OUT)]`, one per position, in a paged ring per request. A decode step
writes the state rows of all S tokens first, then pools at most one entry per request: the first token of the
request whose position closes a window ((pos+1) % r == 0). Entry j covers positions [r·j, r·j + r − 1].
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import ModelConfig
from .norm import rms_normalize
from .numerics import FP32_NEG_INF, f32, matmul, rope_half, rope_last
from .paging import request_of_tokens, ring_rows, write_rows


@dataclass(frozen=True)
class CompressorSpec:
    """ratio r, entry width HD, and whether windows overlap (then OUT = 2·HD and 2r rows are pooled)."""

    ratio: int
    head_dim: int
    overlap: bool

    @property
    def out_dim(self) -> int:
        return 2 * self.head_dim if self.overlap else self.head_dim


@dataclass(frozen=True)
class Entry:
    """One pooled entry: produced by token `token`, compressed index `j`, f32 y (normed, RoPE'd, not rounded)."""

    token: int
    j: int
    y: np.ndarray


def csa_spec(cfg: ModelConfig) -> CompressorSpec:
    return CompressorSpec(cfg.csa_ratio, cfg.head_dim, overlap=True)


def indexer_spec(cfg: ModelConfig) -> CompressorSpec:
    return CompressorSpec(cfg.csa_ratio, cfg.idx_head_dim, overlap=True)


def hca_spec(cfg: ModelConfig) -> CompressorSpec:
    return CompressorSpec(cfg.hca_ratio, cfg.head_dim, overlap=False)


def state_rows(spec: CompressorSpec, x_normed, wkv, wgate, ape, positions) -> np.ndarray:
    """[T, 2·OUT]: kvp = x @ Wkv.T and scp = x @ Wgate.T + ape[pos % r] (§4)."""
    x = f32(x_normed)
    kvp = matmul(x, f32(wkv).T)
    scp = matmul(x, f32(wgate).T) + f32(ape)[np.asarray(positions) % spec.ratio]
    return np.concatenate([kvp, scp], axis=1)


def pooling_tokens(cfg: ModelConfig, spec: CompressorSpec, positions) -> list[tuple[int, int]]:
    """(token, j) of the first window-closing token of each request: ≤ 1 entry per request per step (§4)."""
    positions = np.asarray(positions)
    closes = (positions + 1) % spec.ratio == 0
    found = []
    for b in range(len(positions) // cfg.seq):
        hits = np.flatnonzero(closes[b * cfg.seq : (b + 1) * cfg.seq])
        if hits.size:
            t = b * cfg.seq + int(hits[0])
            found.append((t, int(positions[t]) // spec.ratio))
    return found


def window_segments(spec: CompressorSpec, j: int) -> list[tuple[np.ndarray, int]]:
    """(positions, column offset) of the state rows pooled for entry j (§4). Overlap: the previous window's
    FRONT halves, then the current window's BACK halves."""
    current = np.arange(spec.ratio * j, spec.ratio * (j + 1))
    if not spec.overlap:
        return [(current, 0)]
    return [(current - spec.ratio, 0), (current, spec.head_dim)]


def window_rows(spec: CompressorSpec, state, table_row, j: int, block_size: int):
    """(kv [rows, HD], score [rows, HD]) pooled for entry j; missing positions read kv 0 / score −inf (§4)."""
    hd, out = spec.head_dim, spec.out_dim
    kv, score = [], []
    for pos, col in window_segments(spec, j):
        rows = ring_rows(table_row[None, :], pos[None, :], block_size)[0]
        present = (rows >= 0)[:, None]
        data = state[np.where(rows >= 0, rows, 0)]
        kv.append(np.where(present, data[:, col : col + hd], 0.0))
        score.append(np.where(present, data[:, out + col : out + col + hd], FP32_NEG_INF))
    return f32(np.concatenate(kv)), f32(np.concatenate(score))


def softmax_pool(kv, score) -> np.ndarray:
    """pooled[c] = Σ_rows kv[row, c] · softmax_rows(score[:, c]) (§4)."""
    with np.errstate(over="ignore"):
        e = np.exp(score - np.max(score, axis=0, keepdims=True))
    return np.sum(kv * (e / np.sum(e, axis=0, keepdims=True)), axis=0)


def finish_entry(cfg: ModelConfig, pooled, norm_w, cos_tab, sin_tab, pos0: int) -> np.ndarray:
    """y = rmsnorm(pooled)·norm_w, then RoPE of the last rope_dim dims at `pos0` = r·j; f32, not rounded (§4)."""
    y = rms_normalize(pooled, cfg.rms_eps) * f32(norm_w)
    return rope_last(y, rope_half(cos_tab, pos0), rope_half(sin_tab, pos0))


def compress_step(cfg: ModelConfig, spec: CompressorSpec, x_normed, positions, weights: dict, state,
                  state_table, cos_tab, sin_tab) -> tuple[np.ndarray, list[Entry]]:
    """One decode step of a compressor: (new state, pooled entries) (§4 "Decode rules").

    weights: {wkv, wgate, ape, norm_w}. state_table: [B, pages] ring table.
    """
    positions = np.asarray(positions)
    rows = state_rows(spec, x_normed, weights["wkv"], weights["wgate"], weights["ape"], positions)
    req = request_of_tokens(len(positions), cfg.seq)
    slots = ring_rows(state_table[req], positions[:, None], cfg.block_size)[:, 0]
    state = write_rows(f32(state), slots, rows)
    entries = []
    for t, j in pooling_tokens(cfg, spec, positions):
        kv, score = window_rows(spec, state, state_table[req[t]], j, cfg.block_size)
        y = finish_entry(cfg, softmax_pool(kv, score), weights["norm_w"], cos_tab, sin_tab, spec.ratio * j)
        entries.append(Entry(t, j, y))
    return state, entries


def compressor_weights(inputs: dict, prefix: str) -> dict:
    """{wkv, wgate, ape, norm_w} from inputs `<prefix>wkv`, `<prefix>wgate`, `<prefix>ape`, `<prefix>norm_w`."""
    return {name: inputs[prefix + name] for name in ("wkv", "wgate", "ape", "norm_w")}

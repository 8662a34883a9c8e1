"""Grouped W8A8 output projection, TP1 and TP forms (dsv4-math §7; dspark-model.md §3.5, §4)."""
from __future__ import annotations

import numpy as np

from .config import ModelConfig
from .numerics import f32, imatmul, matmul, q8, rb


def group_acc(x_rows, wo_a_g, wo_b_g) -> np.ndarray:
    """One O group's contribution: q8(x @ wo_a_g.T) per row, int8 @ wo_b_g.T, times the row scale (§7)."""
    o_r = matmul(f32(x_rows), f32(wo_a_g).T)
    o_i8, s = q8(o_r)
    return imatmul(o_i8, np.asarray(wo_b_g).T) * s


def wo_b_columns(cfg: ModelConfig, wo_b, g: int) -> np.ndarray:
    """Columns of wo_b [D, groups·o_lora] belonging to (local) group g."""
    return np.asarray(wo_b)[:, g * cfg.o_lora : (g + 1) * cfg.o_lora]


def o_proj(cfg: ModelConfig, packed, wo_a, wo_b, wo_b_scale) -> np.ndarray:
    """TP1 form: acc over groups ascending, times wo_b_scale, one rb → attn_out [T, D] (§7)."""
    tokens = cfg.tokens
    acc = np.zeros((tokens, np.asarray(wo_b).shape[0]), dtype=np.float32)
    for g in range(cfg.o_groups):
        acc = acc + group_acc(packed[g, :tokens], wo_a[g], wo_b_columns(cfg, wo_b, g))
    return rb(acc * f32(wo_b_scale))


def o_group_all_to_all(cfg: ModelConfig, packed_per_rank: list[np.ndarray]) -> list[np.ndarray]:
    """Rank r receives its local groups' rows of every source rank: [local_o_groups, GROUP_T, in] with row
    src·T + t (dspark-model.md §4)."""
    lg, tokens = cfg.local_o_groups, cfg.tokens
    received = []
    for r in range(cfg.tp):
        groups = range(r * lg, (r + 1) * lg)
        received.append(np.stack([np.concatenate([p[g, :tokens] for p in packed_per_rank]) for g in groups]))
    return received


def o_partial(cfg: ModelConfig, received, wo_a_local, wo_b_local, wo_b_scale) -> np.ndarray:
    """A rank's f32 partial [GROUP_T, D]: (Σ over its groups ascending) · wo_b_scale (§7 "TP > 1")."""
    acc = np.zeros((received.shape[1], np.asarray(wo_b_local).shape[0]), dtype=np.float32)
    for g in range(cfg.local_o_groups):
        acc = acc + group_acc(received[g], wo_a_local[g], wo_b_columns(cfg, wo_b_local, g))
    return acc * f32(wo_b_scale)


def reduce_scatter(cfg: ModelConfig, partials: list[np.ndarray]) -> list[np.ndarray]:
    """f32 sum of the rank partials in rank order, then one rb; rank q keeps rows q·T … (q+1)·T − 1."""
    total = partials[0]
    for p in partials[1:]:
        total = total + p
    out = rb(total)
    return [out[q * cfg.tokens : (q + 1) * cfg.tokens] for q in range(cfg.tp)]


def o_proj_tp(cfg: ModelConfig, packed_per_rank, wo_a_shards, wo_b_shards, wo_b_scale) -> list[np.ndarray]:
    """TP form: all-to-all of groups, per-rank f32 partials, f32 reduce-scatter, rb (§7; model §3.5).

    wo_a_shards[r]: [local_o_groups, o_lora, hpg·head_dim]; wo_b_shards[r]: [D, local_o_groups·o_lora].
    """
    received = o_group_all_to_all(cfg, packed_per_rank)
    partials = [o_partial(cfg, received[r], wo_a_shards[r], wo_b_shards[r], wo_b_scale) for r in range(cfg.tp)]
    return reduce_scatter(cfg, partials)

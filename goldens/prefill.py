"""Prefill layers: one request's prompt chunk through an attention layer (dsv4-math §3-§7, §10; prefill rules of
§2.2, §4, §5.3, §6.2), single-rank and context-parallel.

A chunk is `tokens` prompt tokens per rank starting at `start` (the request's earlier chunks are already in the
caches). At TP > 1 the chunk is context-parallel: the request's tp·tokens tokens are split into rank-major
slices (rank r holds positions start + r·tokens …), every rank computes the KV side (kv rows, compressors) of
the whole group's tokens into its own replica of the request's caches, and attends only its own queries; the O
path is the TP one (all-to-all of groups, f32 reduce-scatter). TP1 is the one-rank case.

Per stage (what differs from decode):
* compressors pool EVERY boundary in the chunk (decode: at most one per request). An entry's rows come from the
  chunk where its positions are in the chunk, else from the state as the step received it; positions < 0 read
  kv 0 / score FP32_NEG_INF (the ratio-4 overlap of entry 0). Then the state rows of every chunk token are written
  (ring slots; later tokens win).
* attention compacts each token's valid rows (window rows oldest first, then compressed rows) and tiles the
  compacted list by ATTN_K_TILE without masking (§6.2 "Prefill golden").
* HCA compressed rows: entries 0 … n−1, n = (pos+1) // R (all written by this or earlier chunks).
* CSA: the prefill indexer (score formula with k_s inside the relu, per-token q RoPE, no offset), visible =
  min((pos+1)//4, cap), k = min(idx_topk, visible), top-k by a full sort (the correct keys), −1 tail.
* hc_post is the decode one: the chunk has no padded rows (num_tokens = tokens).

Inputs (`make_prefill_inputs`): the decode layer's weights (goldens.inputs) with RoPE tables of P rows (P covers
the chunk's last position), one request's paged caches (block tables [1, pages], one spare pool page that is
never written), per-rank x_hc / positions / slot mappings / window lists, and caches and states replicated over
the ranks (the same request).
"""
from __future__ import annotations

import numpy as np

from . import inputs as gi
from .attention import attend, derotate_pack, even_tiles
from .compressor import (
    CompressorSpec,
    compressor_weights,
    csa_spec,
    finish_entry,
    hca_spec,
    indexer_spec,
    softmax_pool,
    state_rows,
    window_segments,
)
from .config import PREFILL_INDEXER_SCORE_CAP, PREFILL_KINDS, ModelConfig, prefill_geometry, tiles_for
from .hc import hc_post, hc_pre
from .indexer import head_weights, index_key
from .norm import rms_norm, rms_normalize
from .numerics import FP32_NEG_INF, deq, f32, imatmul, matmul, q8, rb, rope_half, rope_inv_freq, rope_profile
from .o_proj import o_proj, o_proj_tp
from .paging import page_rows, ring_rows, write_rows
from .qkv import kv_proj, q_proj, rope_round

KINDS = PREFILL_KINDS
TOKEN_BLOCK = 256          # attention is evaluated in blocks of query tokens (memory only; rows are independent)
F32_ZERO = np.float32(0.0)

_BUFFERS = {
    "prefill_swa": ("kv_cache",),
    "prefill_hca": ("kv_cache", "cmp_kv", "cmp_state"),
    "prefill_csa": ("kv_cache", "cmp_kv", "cmp_state", "idx_kv_cache", "idx_kv_scale", "idx_cmp_state"),
}


def base_kind(kind: str) -> str:
    _check_kind(kind)
    return kind.removeprefix("prefill_")


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind: unknown prefill kind {kind!r} (known: {', '.join(KINDS)})")


def chunk_config(cfg: ModelConfig, tokens: int) -> ModelConfig:
    """The config whose T is the chunk: `tokens` one-token rows (batch = tokens, seq = 1)."""
    return cfg.with_(seq=1, batch=tokens)


def input_specs(kind: str, cfg: ModelConfig, tokens: int, start: int, rank_local: bool = False) -> dict:
    """name → (logical dtype, shape) of every prefill input (rank_local: the TP shards of wo_a / wo_b)."""
    g = prefill_geometry(kind, cfg, tokens, start)
    pcfg = chunk_config(cfg, tokens)
    base = gi.input_specs(base_kind(kind), pcfg, rank_local)
    bs, hd, t = cfg.block_size, cfg.head_dim, tokens
    specs = {k: v for k, v in base.items() if k in _SHARED or k in ("x_hc", "positions", "swa_slot_mapping",
                                                                     "swa_indices", "swa_lens")}
    specs |= {
        "rope_cos": ("bf16", (g["rope_rows"], cfg.rope_dim)),
        "rope_sin": ("bf16", (g["rope_rows"], cfg.rope_dim)),
        "kv_seq_len": ("i32", (1,)),
        "kv_cache": ("bf16", ((g["kv_blocks"] + 1) * bs, hd)),
        "kv_block_table": ("i32", (1, g["kv_blocks"])),
    }
    if kind in ("prefill_hca", "prefill_csa"):
        out = hd if kind == "prefill_hca" else 2 * hd
        specs |= {
            "cmp_kv": ("bf16", ((g["cmp_blocks"] + 1) * bs, hd)),
            "cmp_block_table": ("i32", (1, g["cmp_blocks"])),
            "cmp_slot_mapping": ("i32", (t,)),
            "cmp_state": ("f32", (g["state_blocks"] * bs, 2 * out)),
            "cmp_state_block_table": ("i32", (1, g["state_blocks"])),
        }
    if kind == "prefill_csa":
        ihd = cfg.idx_head_dim
        specs |= {
            "idx_kv_cache": ("i8", ((g["cmp_blocks"] + 1) * bs, ihd)),
            "idx_kv_scale": ("f32", ((g["cmp_blocks"] + 1) * bs,)),
            "idx_block_table": ("i32", (1, g["cmp_blocks"])),
            "idx_slot_mapping": ("i32", (t,)),
            "idx_cmp_state": ("f32", (g["state_blocks"] * bs, 4 * ihd)),
            "idx_cmp_state_block_table": ("i32", (1, g["state_blocks"])),
        }
    return specs


# weights (replicated or sharded like decode) taken from the decode specs
_SHARED = ("hc_fn", "hc_scale", "hc_base", "norm_w", "wq_a", "wq_b", "wq_b_scale", "wkv", "gamma_cq", "gamma_ckv",
           "attn_sink", "wo_a", "wo_b", "wo_b_scale", "cmp_wkv", "cmp_wgate", "cmp_ape", "cmp_norm_w", "idx_wq_b",
           "idx_wq_b_scale", "idx_weights_proj", "idx_hadamard", "idx_cmp_wkv", "idx_cmp_wgate", "idx_cmp_ape",
           "idx_cmp_norm_w")


# ---- inputs -----------------------------------------------------------------------------------------------------
def make_prefill_inputs(kind: str, cfg: ModelConfig, tokens: int, start: int, seed: int) -> list[dict]:
    """One input dict per rank (cfg.tp ranks) for a chunk of `tokens` tokens per rank at `start`."""
    g = prefill_geometry(kind, cfg, tokens, start)
    base = base_kind(kind)
    weights = gi.layer_weights(base, cfg, seed)
    cos, sin = prefill_rope_tables(cfg, rope_profile(base), g["rope_rows"])
    weights |= {"rope_cos": cos, "rope_sin": sin}
    rng = np.random.default_rng([seed, 100 + KINDS.index(kind)])
    bs, hd, tp, end = cfg.block_size, cfg.head_dim, cfg.tp, start + cfg.tp * tokens
    group_pos = start + np.arange(tp * tokens)
    shared = {"kv_seq_len": np.array([end], np.int32)}
    kv_table = _table(rng, g["kv_blocks"])
    shared |= {"kv_cache": rb(rng.standard_normal(((g["kv_blocks"] + 1) * bs, hd)).astype(np.float32)),
               "kv_block_table": kv_table}
    group = {"swa_slot_mapping": page_rows(kv_table, group_pos[None, :], bs)[0]}
    w = cfg.window
    first = np.maximum(group_pos - w + 1, 0)
    logical = first[:, None] + np.arange(w)[None, :]
    logical = np.where(logical <= group_pos[:, None], logical, -1)
    group |= {"swa_indices": page_rows(kv_table, logical.reshape(1, -1), bs).reshape(-1, w),
              "swa_lens": np.minimum(group_pos + 1, w)}
    if kind in ("prefill_hca", "prefill_csa"):
        ratio = cfg.hca_ratio if kind == "prefill_hca" else cfg.csa_ratio
        spec = hca_spec(cfg) if kind == "prefill_hca" else csa_spec(cfg)
        cmp_table = _table(rng, g["cmp_blocks"])
        entry = np.where((group_pos + 1) % ratio == 0, group_pos // ratio, -1)
        shared |= {"cmp_kv": rb(rng.standard_normal(((g["cmp_blocks"] + 1) * bs, hd)).astype(np.float32)),
                   "cmp_block_table": cmp_table}
        group["cmp_slot_mapping"] = page_rows(cmp_table, entry[None, :], bs)[0]
        shared |= _state(rng, cfg, "cmp_", spec, g["state_blocks"], start)
    if kind == "prefill_csa":
        idx_table = _table(rng, g["cmp_blocks"])
        entry = np.where((group_pos + 1) % cfg.csa_ratio == 0, group_pos // cfg.csa_ratio, -1)
        cache, scale = q8(rng.standard_normal(((g["cmp_blocks"] + 1) * bs, cfg.idx_head_dim)).astype(np.float32))
        shared |= {"idx_kv_cache": cache, "idx_kv_scale": scale[:, 0], "idx_block_table": idx_table}
        group["idx_slot_mapping"] = page_rows(idx_table, entry[None, :], bs)[0]
        shared |= _state(rng, cfg, "idx_cmp_", indexer_spec(cfg), g["state_blocks"], start)
    per_rank = []
    for r in range(tp):
        local = slice(r * tokens, (r + 1) * tokens)
        x_hc = rng.standard_normal((tokens, cfg.hc_mult, cfg.hidden)).astype(np.float32)
        state = {"x_hc": x_hc, "positions": group_pos[local]} | {k: v[local] for k, v in group.items()}
        d = gi.shard_weights(base, cfg, weights, r) | {k: v.copy() for k, v in shared.items()} | state
        per_rank.append({k: _as_stored(v) for k, v in d.items()})
    return per_rank


def _as_stored(a) -> np.ndarray:
    a = np.asarray(a)
    return a.astype(np.int32) if a.dtype.kind in "iu" and a.dtype != np.int8 else a


def _table(rng, pages: int) -> np.ndarray:
    """[1, pages]: the request's logical pages on a seeded permutation of the pool's pages + 1 (one spare)."""
    return rng.permutation(pages + 1)[None, :pages].astype(np.int32)


def _state(rng, cfg: ModelConfig, prefix: str, spec: CompressorSpec, pages: int, start: int) -> dict:
    """Ring state of one request: kv 0 / score FP32_NEG_INF, seeded history rows for [start − ring, start)."""
    bs, out = cfg.block_size, spec.out_dim
    table = rng.permutation(pages)[None, :].astype(np.int32)
    state = np.zeros((pages * bs, 2 * out), dtype=np.float32)
    state[:, out:] = FP32_NEG_INF
    hist = np.arange(max(0, start - pages * bs), start)
    rows = ring_rows(table, hist[None, :], bs)[0]
    state[rows] = rng.standard_normal((len(hist), 2 * out)).astype(np.float32)
    return {f"{prefix}state": state, f"{prefix}state_block_table": table}


def prefill_rope_tables(cfg: ModelConfig, profile: str, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The layer's duplicated bf16 RoPE tables for positions 0 … rows−1 (dsv4-math §1.1)."""
    inv = rope_inv_freq(cfg, profile)
    angle = np.arange(rows, dtype=np.float32)[:, None] * inv[None, :]
    cos, sin = rb(np.cos(angle)), rb(np.sin(angle))
    return np.concatenate([cos, cos], axis=1), np.concatenate([sin, sin], axis=1)


def written_rows(kind: str, cfg: ModelConfig, per_rank: list[dict]) -> list[dict[str, np.ndarray]]:
    """Per rank: buffer → pool rows the chunk writes (every rank writes the whole group's rows)."""
    _check_kind(kind)
    positions = np.concatenate([np.asarray(d["positions"]) for d in per_rank])
    out = {}
    for name in _BUFFERS[kind]:
        source = {"kv_cache": "swa_slot_mapping", "cmp_kv": "cmp_slot_mapping", "idx_kv_cache": "idx_slot_mapping",
                  "idx_kv_scale": "idx_slot_mapping"}.get(name)
        if source is None:
            table = np.asarray(per_rank[0][name.replace("state", "state_block_table")])
            rows = ring_rows(table, positions[None, :], cfg.block_size)[0]
        else:
            rows = np.concatenate([np.asarray(d[source]) for d in per_rank])
        out[name] = np.unique(rows[rows >= 0]).astype(np.int64)
    return [dict(out) for _ in per_rank]


# ---- the layer --------------------------------------------------------------------------------------------------
def run_prefill(kind: str, cfg: ModelConfig, per_rank: list[dict], trace: dict | None = None) -> list[dict]:
    """Every rank's outputs: x_out [tokens, 4, D] and the updated buffers (the same on every rank)."""
    _check_kind(kind)
    if len(per_rank) != cfg.tp:
        raise ValueError(f"per_rank: expected tp={cfg.tp} ranks, got {len(per_rank)}")
    tokens = len(per_rank[0]["positions"])
    pcfg = chunk_config(cfg, tokens)
    w = per_rank[0]                               # replicated weights, caches and states
    pres = [hc_pre(pcfg, d["x_hc"], w["hc_fn"], w["hc_scale"], w["hc_base"]) for d in per_rank]
    x_normed = np.concatenate([rms_norm(x, w["norm_w"], cfg.rms_eps) for x, _, _ in pres])
    positions = np.concatenate([np.asarray(d["positions"], np.int64) for d in per_rank])
    c, s = rope_half(w["rope_cos"], positions), rope_half(w["rope_sin"], positions)
    kv = kv_proj(pcfg, x_normed, w["wkv"], w["gamma_ckv"], c, s)
    slots = np.concatenate([np.asarray(d["swa_slot_mapping"]) for d in per_rank])
    buffers = {"kv_cache": write_rows(w["kv_cache"], slots, kv)}
    cmp_rows = None
    if kind in ("prefill_hca", "prefill_csa"):
        spec = hca_spec(cfg) if kind == "prefill_hca" else csa_spec(cfg)
        state, entries = prefill_compress(cfg, spec, x_normed, positions, compressor_weights(w, "cmp_"),
                                          w["cmp_state"], w["cmp_state_block_table"], w["rope_cos"], w["rope_sin"])
        cmp_slots = np.concatenate([np.asarray(d["cmp_slot_mapping"]) for d in per_rank])
        cmp_kv = f32(w["cmp_kv"]).copy()
        for t, y in entries:
            if cmp_slots[t] >= 0:
                cmp_kv[cmp_slots[t]] = rb(y)
        buffers |= {"cmp_kv": cmp_kv, "cmp_state": state}
    if kind == "prefill_hca":
        n = (positions + 1) // cfg.hca_ratio
        logical = np.arange(int(n.max(initial=0)))[None, :]
        cmp_rows = page_rows(np.asarray(w["cmp_block_table"]), np.where(logical < n[:, None], logical, -1)
                             .reshape(1, -1), cfg.block_size).reshape(len(n), -1)
    if kind == "prefill_csa":
        topk, idx_buffers = prefill_indexer(cfg, x_normed, positions, w, per_rank, trace)
        buffers |= idx_buffers
        keep = (topk >= 0) & (topk < ((positions + 1) // cfg.csa_ratio)[:, None])
        cmp_rows = page_rows(np.asarray(w["cmp_block_table"]), np.where(keep, topk, -1).reshape(1, -1),
                             cfg.block_size).reshape(topk.shape)
    packed = []
    for r, d in enumerate(per_rank):
        local = slice(r * tokens, (r + 1) * tokens)
        q, _, _ = q_proj(pcfg, x_normed[local], w["wq_a"], w["gamma_cq"], w["wq_b"], w["wq_b_scale"], c[local],
                         s[local])
        out = prefill_attention(pcfg, kind, q, buffers, d, None if cmp_rows is None else cmp_rows[local])
        packed.append(derotate_pack(pcfg, out, c[local], s[local]))
    if cfg.tp == 1:
        attn = [o_proj(pcfg, packed[0], w["wo_a"], w["wo_b"], w["wo_b_scale"])]
    else:
        attn = o_proj_tp(pcfg, packed, [d["wo_a"] for d in per_rank], [d["wo_b"] for d in per_rank],
                         w["wo_b_scale"])
    return [{"x_out": hc_post(a, d["x_hc"], post, comb)} | {k: v.copy() for k, v in buffers.items()}
            for a, d, (_, post, comb) in zip(attn, per_rank, pres)]


def prefill_compress(cfg: ModelConfig, spec: CompressorSpec, x_normed, positions, weights: dict, state, table,
                     cos_tab, sin_tab) -> tuple[np.ndarray, list[tuple[int, np.ndarray]]]:
    """(new state, [(token, y)] for every boundary token of the chunk) (module docstring; dsv4-math §4 prefill)."""
    positions = np.asarray(positions, np.int64)
    rows = state_rows(spec, x_normed, weights["wkv"], weights["wgate"], weights["ape"], positions)
    state, table = f32(state), np.asarray(table)
    start, hd, out = int(positions[0]), spec.head_dim, spec.out_dim
    entries = []
    for t in np.flatnonzero((positions + 1) % spec.ratio == 0):
        j = int(positions[t]) // spec.ratio
        kv, score = [], []
        for pos, col in window_segments(spec, j):
            in_chunk = pos >= start
            ring = ring_rows(table, np.where(in_chunk, 0, pos)[None, :], cfg.block_size)[0]
            from_state = state[np.where(ring >= 0, ring, 0)]
            data = np.where(in_chunk[:, None], rows[np.clip(pos - start, 0, len(rows) - 1)], from_state)
            present = (in_chunk | (ring >= 0))[:, None]
            kv.append(np.where(present, data[:, col : col + hd], 0.0))
            score.append(np.where(present, data[:, out + col : out + col + hd], FP32_NEG_INF))
        pooled = softmax_pool(f32(np.concatenate(kv)), f32(np.concatenate(score)))
        entries.append((int(t), finish_entry(cfg, pooled, weights["norm_w"], cos_tab, sin_tab, spec.ratio * j)))
    slots = ring_rows(table, positions[None, :], cfg.block_size)[0]
    return write_rows(state, slots, rows), entries


def prefill_attention(pcfg: ModelConfig, kind: str, q, buffers: dict, d: dict, cmp_rows) -> np.ndarray:
    """f32 [T, H, HD]: each token's valid rows compacted (window, then compressed), tiled without masking."""
    rows = np.asarray(d["swa_indices"])
    valid = rows >= 0
    if kind == "prefill_swa":
        valid &= np.arange(rows.shape[1])[None, :] < np.asarray(d["swa_lens"])[:, None]
    pools = [(buffers["kv_cache"], rows, valid)]
    if cmp_rows is not None:
        pools.append((buffers["cmp_kv"], cmp_rows, cmp_rows >= 0))
    tile = tiles_for(pcfg).ATTN_K_TILE
    out = np.zeros((len(q), pcfg.heads, pcfg.head_dim), dtype=np.float32)
    for a in range(0, len(q), TOKEN_BLOCK):
        blk = slice(a, a + TOKEN_BLOCK)
        keys = np.concatenate([f32(pool)[np.where(v[blk], r[blk], 0)] for pool, r, v in pools], axis=1)
        ok = np.concatenate([v[blk] for _, _, v in pools], axis=1)
        order = np.argsort(~ok, axis=1, kind="stable")              # compaction: valid rows first, in list order
        keys = np.take_along_axis(keys, order[:, :, None], axis=1)
        ok = np.take_along_axis(ok, order, axis=1)
        width = max(int(ok.sum(axis=1).max(initial=0)), 1)
        out[blk] = attend(pcfg, q[blk], keys[:, :width], ok[:, :width], even_tiles(0, width, tile),
                          d["attn_sink"])
    return out


# ---- the prefill indexer (CSA) ----------------------------------------------------------------------------------
def prefill_indexer(cfg: ModelConfig, x_normed, positions, w: dict, per_rank: list[dict],
                    trace: dict | None) -> tuple[np.ndarray, dict]:
    """(top-k [G, idx_topk] compressed indices, −1 padded; the updated indexer buffers) over the group's tokens."""
    state, entries = prefill_compress(cfg, indexer_spec(cfg), x_normed, positions, compressor_weights(w, "idx_cmp_"),
                                      w["idx_cmp_state"], w["idx_cmp_state_block_table"], w["rope_cos"],
                                      w["rope_sin"])
    slots = np.concatenate([np.asarray(d["idx_slot_mapping"]) for d in per_rank])
    cache, scale = np.asarray(w["idx_kv_cache"]).copy(), f32(w["idx_kv_scale"]).copy()
    for t, y in entries:
        if slots[t] >= 0:
            k_i8, k_s = index_key(y, w["idx_hadamard"])
            cache[slots[t]], scale[slots[t]] = np.ravel(k_i8), np.ravel(k_s)[0]
    c, s = rope_half(w["rope_cos"], positions), rope_half(w["rope_sin"], positions)
    qr, qr_scale = _qr(cfg, x_normed, w)
    q_i8, q_s = prefill_index_query(cfg, qr, qr_scale, w["idx_wq_b"], w["idx_wq_b_scale"], w["idx_hadamard"], c, s)
    weights = head_weights(cfg, x_normed, w["idx_weights_proj"])
    visible = np.minimum((positions + 1) // cfg.csa_ratio, PREFILL_INDEXER_SCORE_CAP)
    width = int(visible.max(initial=0))
    rows = page_rows(np.asarray(w["idx_block_table"]), np.arange(width)[None, :], cfg.block_size)[0]
    score = prefill_index_scores(q_i8, q_s, weights, cache[np.maximum(rows, 0)], scale[np.maximum(rows, 0)])
    topk = full_sort_topk(score, visible, cfg.idx_topk)
    if trace is not None:
        trace.update({"idx.score": score, "idx.visible": visible, "idx.topk": topk})
    return topk, {"idx_kv_cache": cache, "idx_kv_scale": scale, "idx_cmp_state": state}


def _qr(cfg: ModelConfig, x_normed, w: dict):
    qa = matmul(f32(x_normed), f32(w["wq_a"]))
    return q8(rms_normalize(qa, cfg.rms_eps) * f32(w["gamma_cq"]))


def prefill_index_query(cfg: ModelConfig, qr, qr_scale, idx_wq_b, idx_wq_b_scale, hadamard, c, s):
    """(q_i8 [G, IH, IHD], q_s [G, IH, 1]): rope halves rounded at each token's own position, rb, Hadamard, q8."""
    q = deq(imatmul(qr, idx_wq_b), qr_scale, idx_wq_b_scale).reshape(-1, cfg.idx_heads, cfg.idx_head_dim)
    q = rope_round(q, c[:, None, :], s[:, None, :])
    return q8(matmul(rb(q), f32(hadamard)))


def prefill_index_scores(q_i8, q_s, weights, k_i8, k_s) -> np.ndarray:
    """score[t, l] = Σ_h relu(f32(q_i8[t,h]·k_i8[l]) · q_s[t,h] · k_s[l]) · w[t,h] (dsv4-math §5.2 prefill)."""
    dots = np.einsum("thd,ld->thl", q_i8.astype(np.int32), np.asarray(k_i8, np.int32)).astype(np.float32)
    inner = np.maximum(dots * f32(q_s) * f32(k_s)[None, None, :], F32_ZERO)
    return np.einsum("thl,th->tl", inner, f32(weights)).astype(np.float32)



def full_sort_topk(score, visible, k: int) -> np.ndarray:
    """[T, k]: the indices of the min(k, visible) highest scores among [0, visible), descending; −1 tail."""
    out = np.full((len(score), k), -1, dtype=np.int32)
    for t, n in enumerate(np.asarray(visible)):
        n = int(n)
        if n:
            order = np.argsort(-score[t, :n], kind="stable")[: min(k, n)]
            out[t, : len(order)] = order
    return out

"""Seeded inputs of the layer goldens. The NAMES are a contract: layer graphs name their parameters exactly so
(docs/design.md "Writing an op").

Storage: logical bf16 tensors are f32 arrays holding bf16-representable values (rounded with rb); int8 weights are
int8 arrays with an f32 per-output-channel scale from q8; metadata is int32. `input_specs` lists the logical dtype
("bf16" | "f32" | "i8" | "i32") and shape of every name; `typed_inputs` casts bf16 ones to ml_dtypes.bfloat16.
Shapes depend on the config only (not on seed or regime). Symbols: T tokens, B requests, S seq, D hidden,
H heads, HD head_dim, IH/IHD indexer heads/head dim, r = csa_ratio, R = hca_ratio, P = max_pos.

Attention kinds ("swa", "csa", "hca"), common names
  x_hc f32[T,4,D]                       residual HC streams entering the layer
  hc_fn f32[24,4D], hc_scale f32[3], hc_base f32[24]
  norm_w bf16[D]                        attention RMSNorm weight
  wq_a bf16[D,q_lora], wq_b i8[q_lora,H·HD] + wq_b_scale f32[H·HD], wkv bf16[D,HD]
  gamma_cq bf16[q_lora], gamma_ckv bf16[HD], attn_sink f32[H]
  wo_a bf16[o_groups,o_lora,hpg·HD], wo_b i8[D,o_groups·o_lora] + wo_b_scale f32[D]
  rope_cos, rope_sin bf16[P,rope_dim]   the layer's table (SWA: base θ; CSA/HCA: compress θ + YaRN)
  positions i32[T], kv_seq_len i32[B]   pos = start[b] + s; kv_seq_len = start + S
  kv_cache bf16[KV_ROWS,HD], kv_block_table i32[B,KV_BLOCKS]       original-KV pool (inout)
  swa_slot_mapping i32[T], swa_indices i32[T,window] (oldest first, −1 tail), swa_lens i32[T]
CSA adds (r = 4, overlap)
  cmp_wkv, cmp_wgate bf16[2HD,D], cmp_ape f32[r,2HD], cmp_norm_w bf16[HD]
  cmp_kv bf16[CMP_ROWS,HD], cmp_block_table i32[B,CMP_BLOCKS], cmp_slot_mapping i32[T]
  cmp_state f32[STATE_ROWS,4HD], cmp_state_block_table i32[B,STATE_BLOCKS]            (ring)
  idx_wq_b i8[q_lora,IH·IHD] + idx_wq_b_scale f32[IH·IHD], idx_weights_proj bf16[D,IH], idx_hadamard bf16[IHD,IHD]
  idx_cmp_wkv, idx_cmp_wgate bf16[2IHD,D], idx_cmp_ape f32[r,2IHD], idx_cmp_norm_w bf16[IHD]
  idx_kv_cache i8[CMP_ROWS,IHD], idx_kv_scale f32[CMP_ROWS], idx_block_table i32[B,CMP_BLOCKS], idx_slot_mapping i32[T]
  idx_cmp_state f32[STATE_ROWS,4IHD], idx_cmp_state_block_table i32[B,STATE_BLOCKS]
HCA adds (R, no overlap)
  cmp_wkv, cmp_wgate bf16[HD,D], cmp_ape f32[R,HD], cmp_norm_w bf16[HD]
  cmp_kv, cmp_block_table, cmp_slot_mapping as CSA (R-based sizes); cmp_state f32[STATE_ROWS,2HD], cmp_state_block_table
MoE kinds ("moe" sort routing, "moe_hash" hash routing)
  x_hc, hc_fn, hc_scale, hc_base (the FFN's HC weights), norm_w bf16[D], gate_w f32[E,D], gate_bias f32[E]
  w1, w3 i8[E,inter,D] + w1_scale, w3_scale f32[E,inter]; w2 i8[E,D,inter] + w2_scale f32[E,D]
  sh_w1, sh_w3 i8[n_shared·inter,D] + scales f32[n_shared·inter]; sh_w2 i8[D,n_shared·inter] + sh_w2_scale f32[D]
  moe_hash only: tid2eid i32[vocab,topk_experts], input_ids i32[T]
Outputs: swa {x_out f32[T,4,D], kv_cache}; csa {x_out, kv_cache, cmp_kv, cmp_state, idx_kv_cache, idx_kv_scale,
idx_cmp_state}; hca {x_out, kv_cache, cmp_kv, cmp_state}; moe, moe_hash {x_out}.

Slots. Physical row = table[b, i // BS]·BS + i % BS (−1 page = unmapped). swa_slot_mapping: row of pos.
cmp_slot_mapping / idx_slot_mapping: row of entry pos // r where (pos+1) % r == 0, else −1 (every boundary is
listed; the golden pools only the first per request). State rows: ring page (pos // BS) % STATE_BLOCKS. Pages are a
seeded permutation of the pool; only pages covering kv_seq_len (entries < ceil(kv_seq_len/r)) are mapped.
Pools start as seeded garbage (bf16 N(0,1) rows, int8 q8 rows); compressor state starts at kv 0 / score
FP32_NEG_INF, and ring rows of positions [start − ring + S, start) hold seeded N(0,1) history.

Regimes → start position per request (inclusive ranges; TINY: r = 4, k = idx_topk = 16, W = window = 16, S = 4,
cap = 256; FLASH: k = 512, W = 128, S = 8, cap = 8192)
  empty_cmp        start = 0 (no compressed entry before the step; ratio-4 entry 0 is pooled at pos 3)
  short_cache      [max(r, R), r·k − S − 1]      every visible CSA length < k (TINY 16…59), HCA rows present
  long_cache       [r·k + r − 1, cap − S]        every visible > k, so top-k really selects (TINY 67…252)
  window_boundary  [W − S + 1, W − 1]            the chunk contains pos W−1 and W (TINY 13…15)
  topk_boundary    [r·k − S, r·k − 1]            some token has visible == k exactly (TINY 60…63)
  cmp_boundary     R·j − 1 − o, j ≥ 1, o < S      the chunk closes an HCA (and a CSA) entry at offset o (TINY 12…251)
  default          request b takes the regime long, short, window, topk, empty_cmp, cmp_boundary (b mod 6), each
                   drawn as above; b counts over the TP group (rank r's requests are r·B …), so at TP > 1 every
                   regime occurs too, and with an explicit regime every rank has only that one
MoE regimes: "default"; "swiglu_clip" (w1, w3 drawn 8× larger so the SwiGLU limits bind).

Multi-rank: `make_rank_inputs` returns one dict per rank (tp ranks for attention, ep ranks for MoE) with the same
replicated weights as `make_inputs`, rank-local requests/tokens and caches, and the shards wo_a/wo_b (TP) or
w1/w3/w2 + scales (EP). Rank 0's state equals `make_inputs`'s. `merge_rank_inputs` builds the equivalent
single-rank inputs (pools concatenated, tables and slots offset); `split_rank_outputs` undoes it on outputs.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from .config import ConfigError, ModelConfig, cache_geometry
from .numerics import FP32_NEG_INF, q8, rb, rope_profile, rope_tables
from .paging import page_rows, request_of_tokens, ring_rows

KINDS = ("swa", "csa", "hca", "moe", "moe_hash")
ATTENTION_KINDS = ("swa", "csa", "hca")
MOE_KINDS = ("moe", "moe_hash")
ATTENTION_REGIMES = ("default", "empty_cmp", "short_cache", "long_cache", "window_boundary", "topk_boundary",
                     "cmp_boundary")
MOE_REGIMES = ("default", "swiglu_clip")
_DEFAULT_CYCLE = ("long_cache", "short_cache", "window_boundary", "topk_boundary", "empty_cmp", "cmp_boundary")

Spec = tuple[str, tuple[int, ...]]


def regimes_for(kind: str) -> tuple[str, ...]:
    _check_kind(kind)
    return MOE_REGIMES if kind in MOE_KINDS else ATTENTION_REGIMES


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ValueError(f"kind: unknown layer kind {kind!r} (known: {', '.join(KINDS)})")


def _check_regime(kind: str, regime: str) -> None:
    if regime not in regimes_for(kind):
        raise ValueError(f"regime: {regime!r} is not a {kind} regime ({', '.join(regimes_for(kind))})")


# ---- specs ------------------------------------------------------------------------------------------------------

def input_specs(kind: str, cfg: ModelConfig, rank_local: bool = False) -> dict[str, Spec]:
    """name → (logical dtype, shape) of every input; rank_local gives the TP/EP shard shapes."""
    _check_kind(kind)
    if kind in MOE_KINDS:
        return _moe_specs(kind, cfg, rank_local)
    specs = _attention_specs(cfg, rank_local)
    specs.update(_csa_specs(cfg) if kind == "csa" else _hca_specs(cfg) if kind == "hca" else {})
    return specs


def output_specs(kind: str, cfg: ModelConfig) -> dict[str, Spec]:
    _check_kind(kind)
    specs = input_specs(kind, cfg)
    x_out = {"x_out": ("f32", (cfg.tokens, cfg.hc_mult, cfg.hidden))}
    return x_out | {name: specs[name] for name in _BUFFERS[kind]}


_BUFFERS = {
    "swa": ("kv_cache",),
    "csa": ("kv_cache", "cmp_kv", "cmp_state", "idx_kv_cache", "idx_kv_scale", "idx_cmp_state"),
    "hca": ("kv_cache", "cmp_kv", "cmp_state"),
    "moe": (),
    "moe_hash": (),
}


# buffer → (slot input whose rows it writes, or the state's ring table read at `positions`)
_WRITERS = {
    "kv_cache": "swa_slot_mapping",
    "cmp_kv": "cmp_slot_mapping",
    "idx_kv_cache": "idx_slot_mapping",
    "idx_kv_scale": "idx_slot_mapping",
    "cmp_state": "cmp_state_block_table",
    "idx_cmp_state": "idx_cmp_state_block_table",
}


def written_rows(kind: str, cfg: ModelConfig, inputs: dict) -> dict[str, np.ndarray]:
    """buffer name → sorted pool rows (axis 0) one decode step may write, from the step's own inputs.

    Caches: the rows their slot mapping names (kv_cache ← swa_slot_mapping: every token; cmp_kv ←
    cmp_slot_mapping, idx_kv_cache / idx_kv_scale ← idx_slot_mapping: every listed boundary, of which the step
    pools the first per request, the others keep their input rows). Compressor state: the ring row of every
    token's position (dsv4-math §4, §10). Every other row of the pool must come back unchanged."""
    _check_kind(kind)
    out = {}
    for name in _BUFFERS[kind]:
        source = np.asarray(inputs[_WRITERS[name]])
        if source.ndim == 2:   # a ring state table: the row of each token's position
            table = source[request_of_tokens(len(inputs["positions"]), cfg.seq)]
            source = ring_rows(table, np.asarray(inputs["positions"])[:, None], cfg.block_size)[:, 0]
        out[name] = np.unique(source[source >= 0]).astype(np.int64)
    return out


def _hc_specs(cfg: ModelConfig) -> dict[str, Spec]:
    return {
        "x_hc": ("f32", (cfg.tokens, cfg.hc_mult, cfg.hidden)),
        "hc_fn": ("f32", (cfg.mix_hc, cfg.hc_dim)),
        "hc_scale": ("f32", (3,)),
        "hc_base": ("f32", (cfg.mix_hc,)),
        "norm_w": ("bf16", (cfg.hidden,)),
    }


def _attention_specs(cfg: ModelConfig, rank_local: bool) -> dict[str, Spec]:
    d, h, hd, t, b = cfg.hidden, cfg.heads, cfg.head_dim, cfg.tokens, cfg.batch
    groups = cfg.local_o_groups if rank_local else cfg.o_groups
    geo = cache_geometry(cfg)
    return _hc_specs(cfg) | {
        "wq_a": ("bf16", (d, cfg.q_lora)),
        "wq_b": ("i8", (cfg.q_lora, h * hd)),
        "wq_b_scale": ("f32", (h * hd,)),
        "wkv": ("bf16", (d, hd)),
        "gamma_cq": ("bf16", (cfg.q_lora,)),
        "gamma_ckv": ("bf16", (hd,)),
        "attn_sink": ("f32", (h,)),
        "wo_a": ("bf16", (groups, cfg.o_lora, cfg.heads_per_group * hd)),
        "wo_b": ("i8", (d, groups * cfg.o_lora)),
        "wo_b_scale": ("f32", (d,)),
        "rope_cos": ("bf16", (cfg.max_pos, cfg.rope_dim)),
        "rope_sin": ("bf16", (cfg.max_pos, cfg.rope_dim)),
        "positions": ("i32", (t,)),
        "kv_seq_len": ("i32", (b,)),
        "kv_cache": ("bf16", (geo.rows(geo.kv_blocks), hd)),
        "kv_block_table": ("i32", (b, geo.kv_blocks)),
        "swa_slot_mapping": ("i32", (t,)),
        "swa_indices": ("i32", (t, cfg.window)),
        "swa_lens": ("i32", (t,)),
    }


def _compressor_specs(cfg: ModelConfig, prefix: str, ratio: int, hd: int, out: int) -> dict[str, Spec]:
    return {
        f"{prefix}wkv": ("bf16", (out, cfg.hidden)),
        f"{prefix}wgate": ("bf16", (out, cfg.hidden)),
        f"{prefix}ape": ("f32", (ratio, out)),
        f"{prefix}norm_w": ("bf16", (hd,)),
    }


def _state_specs(cfg: ModelConfig, prefix: str, blocks: int, out: int) -> dict[str, Spec]:
    geo = cache_geometry(cfg)
    return {
        f"{prefix}state": ("f32", (geo.rows(blocks), 2 * out)),
        f"{prefix}state_block_table": ("i32", (cfg.batch, blocks)),
    }


def _csa_specs(cfg: ModelConfig) -> dict[str, Spec]:
    hd, ihd, r, t, b = cfg.head_dim, cfg.idx_head_dim, cfg.csa_ratio, cfg.tokens, cfg.batch
    geo = cache_geometry(cfg)
    rows = geo.rows(geo.csa_blocks)
    return (
        _compressor_specs(cfg, "cmp_", r, hd, 2 * hd)
        | {
            "cmp_kv": ("bf16", (rows, hd)),
            "cmp_block_table": ("i32", (b, geo.csa_blocks)),
            "cmp_slot_mapping": ("i32", (t,)),
        }
        | _state_specs(cfg, "cmp_", geo.csa_state_blocks, 2 * hd)
        | {
            "idx_wq_b": ("i8", (cfg.q_lora, cfg.idx_heads * ihd)),
            "idx_wq_b_scale": ("f32", (cfg.idx_heads * ihd,)),
            "idx_weights_proj": ("bf16", (cfg.hidden, cfg.idx_heads)),
            "idx_hadamard": ("bf16", (ihd, ihd)),
        }
        | _compressor_specs(cfg, "idx_cmp_", r, ihd, 2 * ihd)
        | {
            "idx_kv_cache": ("i8", (rows, ihd)),
            "idx_kv_scale": ("f32", (rows,)),
            "idx_block_table": ("i32", (b, geo.csa_blocks)),
            "idx_slot_mapping": ("i32", (t,)),
        }
        | _state_specs(cfg, "idx_cmp_", geo.csa_state_blocks, 2 * ihd)
    )


def _hca_specs(cfg: ModelConfig) -> dict[str, Spec]:
    hd, t, b = cfg.head_dim, cfg.tokens, cfg.batch
    geo = cache_geometry(cfg)
    return (
        _compressor_specs(cfg, "cmp_", cfg.hca_ratio, hd, hd)
        | {
            "cmp_kv": ("bf16", (geo.rows(geo.hca_blocks), hd)),
            "cmp_block_table": ("i32", (b, geo.hca_blocks)),
            "cmp_slot_mapping": ("i32", (t,)),
        }
        | _state_specs(cfg, "cmp_", geo.hca_state_blocks, hd)
    )


def _moe_specs(kind: str, cfg: ModelConfig, rank_local: bool) -> dict[str, Spec]:
    d, inter, e = cfg.hidden, cfg.moe_inter, cfg.local_experts if rank_local else cfg.n_experts
    shared = cfg.n_shared * inter
    specs = _hc_specs(cfg) | {
        "gate_w": ("f32", (cfg.n_experts, d)),
        "gate_bias": ("f32", (cfg.n_experts,)),
        "w1": ("i8", (e, inter, d)), "w1_scale": ("f32", (e, inter)),
        "w3": ("i8", (e, inter, d)), "w3_scale": ("f32", (e, inter)),
        "w2": ("i8", (e, d, inter)), "w2_scale": ("f32", (e, d)),
        "sh_w1": ("i8", (shared, d)), "sh_w1_scale": ("f32", (shared,)),
        "sh_w3": ("i8", (shared, d)), "sh_w3_scale": ("f32", (shared,)),
        "sh_w2": ("i8", (d, shared)), "sh_w2_scale": ("f32", (d,)),
    }
    if kind == "moe_hash":
        specs |= {"tid2eid": ("i32", (cfg.vocab, cfg.topk_experts)), "input_ids": ("i32", (cfg.tokens,))}
    return specs


def typed_inputs(kind: str, cfg: ModelConfig, inputs: dict, rank_local: bool = False) -> dict[str, np.ndarray]:
    """Copy of `inputs` with every logical-bf16 array cast to ml_dtypes.bfloat16 (exact: values are bf16)."""
    return _typed(input_specs(kind, cfg, rank_local), inputs)


def typed_outputs(kind: str, cfg: ModelConfig, outputs: dict) -> dict[str, np.ndarray]:
    """Copy of golden `outputs` with every logical-bf16 array cast to ml_dtypes.bfloat16."""
    return _typed(output_specs(kind, cfg), outputs)


def _typed(specs: dict[str, Spec], arrays: dict) -> dict[str, np.ndarray]:
    return {name: a.astype(ml_dtypes.bfloat16) if specs[name][0] == "bf16" else a for name, a in arrays.items()}


# ---- generation -------------------------------------------------------------------------------------------------

def make_inputs(kind: str, cfg: ModelConfig, seed: int, regime: str = "default") -> dict[str, np.ndarray]:
    """Single-rank inputs of `kind` for cfg.batch requests (cfg.tokens tokens), full (unsharded) weights."""
    _check_regime(kind, regime)
    return _weights(kind, cfg, seed, regime) | _rank_state(kind, cfg, seed, regime, 0)


def make_rank_inputs(kind: str, cfg: ModelConfig, seed: int, regime: str = "default") -> list[dict[str, np.ndarray]]:
    """Per-rank inputs: cfg.tp ranks (attention) or cfg.ep ranks (MoE); see the module docstring."""
    _check_regime(kind, regime)
    weights = _weights(kind, cfg, seed, regime)
    ranks = rank_count(kind, cfg)
    return [_shard(kind, cfg, weights, r) | _rank_state(kind, cfg, seed, regime, r) for r in range(ranks)]


def rank_count(kind: str, cfg: ModelConfig) -> int:
    _check_kind(kind)
    return cfg.ep if kind in MOE_KINDS else cfg.tp


def layer_weights(kind: str, cfg: ModelConfig, seed: int, regime: str = "default") -> dict[str, np.ndarray]:
    """The full (unsharded) weights `make_inputs` gives layer `kind` (the prefill inputs reuse them)."""
    _check_regime(kind, regime)
    return _weights(kind, cfg, seed, regime)


def shard_weights(kind: str, cfg: ModelConfig, weights: dict, rank: int) -> dict[str, np.ndarray]:
    """Rank `rank`'s view of `weights`: O groups (TP) or experts (EP) sliced, the rest replicated."""
    return _shard(kind, cfg, weights, rank)


def _rng(seed: int, kind: str, *stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, KINDS.index(kind), *stream])


def _normal(rng, shape, std=1.0, mean=0.0) -> np.ndarray:
    return (mean + std * rng.standard_normal(shape)).astype(np.float32)


def _bf16(rng, shape, std=1.0, mean=0.0) -> np.ndarray:
    return rb(_normal(rng, shape, std, mean))


def _int8(rng, shape, std, axis) -> tuple[np.ndarray, np.ndarray]:
    """q8 per output channel: `axis` is the input (reduced) axis."""
    values, scale = q8(_normal(rng, shape, std), axis=axis)
    return values, np.squeeze(scale, axis=axis)


def _weights(kind: str, cfg: ModelConfig, seed: int, regime: str) -> dict[str, np.ndarray]:
    rng = _rng(seed, kind, 0)
    if kind in MOE_KINDS:
        return _moe_weights(rng, kind, cfg, regime)
    weights = _attention_weights(rng, cfg) | _rope_weights(kind, cfg)
    if kind == "csa":
        weights |= _csa_weights(rng, cfg)
    if kind == "hca":
        weights |= _compressor_weights(rng, cfg, "cmp_", cfg.hca_ratio, cfg.head_dim, cfg.head_dim)
    return weights


def _hc_weights(rng, cfg: ModelConfig) -> dict[str, np.ndarray]:
    """HC weights drawn like a trained layer's: the comb logits are sharp (scale s2 in [4, 8], base N(0, 1)), so
    Sinkhorn is still moving at its last iterations (comb after 19 and 20 iterations differs by ~1e-3, after 10
    by ~5e-2), and an iteration-count fault shows. With the old N(0, 0.5) base and s2 ≈ 1 it converged by 10-15."""
    n = cfg.hc_mult
    scale = np.concatenate([rng.uniform(0.5, 1.5, 2), rng.uniform(4.0, 8.0, 1)]).astype(np.float32)
    base = np.concatenate([_normal(rng, (2 * n,), 0.5), _normal(rng, (cfg.mix_hc - 2 * n,), 1.0)])
    return {
        "hc_fn": _normal(rng, (cfg.mix_hc, cfg.hc_dim), cfg.hc_dim ** -0.5),
        "hc_scale": scale,
        "hc_base": base.astype(np.float32),
        "norm_w": _bf16(rng, (cfg.hidden,), 0.1, 1.0),
    }


def _attention_weights(rng, cfg: ModelConfig) -> dict[str, np.ndarray]:
    d, h, hd = cfg.hidden, cfg.heads, cfg.head_dim
    wq_b, wq_b_scale = _int8(rng, (cfg.q_lora, h * hd), cfg.q_lora ** -0.5, axis=0)
    o_in = cfg.heads_per_group * hd
    wo_b, wo_b_scale = _int8(rng, (d, cfg.o_groups * cfg.o_lora), (cfg.o_groups * cfg.o_lora) ** -0.5, axis=1)
    return _hc_weights(rng, cfg) | {
        "wq_a": _bf16(rng, (d, cfg.q_lora), d ** -0.5),
        "wq_b": wq_b,
        "wq_b_scale": wq_b_scale,
        "wkv": _bf16(rng, (d, hd), d ** -0.5),
        "gamma_cq": _bf16(rng, (cfg.q_lora,), 0.1, 1.0),
        "gamma_ckv": _bf16(rng, (hd,), 0.1, 1.0),
        "attn_sink": _normal(rng, (h,)),
        "wo_a": _bf16(rng, (cfg.o_groups, cfg.o_lora, o_in), o_in ** -0.5),
        "wo_b": wo_b,
        "wo_b_scale": wo_b_scale,
    }


def _rope_weights(kind: str, cfg: ModelConfig) -> dict[str, np.ndarray]:
    cos, sin = rope_tables(cfg, rope_profile(kind))
    return {"rope_cos": cos, "rope_sin": sin}


def _compressor_weights(rng, cfg: ModelConfig, prefix: str, ratio: int, hd: int, out: int) -> dict[str, np.ndarray]:
    d = cfg.hidden
    return {
        f"{prefix}wkv": _bf16(rng, (out, d), d ** -0.5),
        f"{prefix}wgate": _bf16(rng, (out, d), d ** -0.5),
        f"{prefix}ape": _normal(rng, (ratio, out), 0.5),
        f"{prefix}norm_w": _bf16(rng, (hd,), 0.1, 1.0),
    }


def _csa_weights(rng, cfg: ModelConfig) -> dict[str, np.ndarray]:
    hd, ihd, r = cfg.head_dim, cfg.idx_head_dim, cfg.csa_ratio
    idx_wq_b, idx_wq_b_scale = _int8(rng, (cfg.q_lora, cfg.idx_heads * ihd), cfg.q_lora ** -0.5, axis=0)
    return (
        _compressor_weights(rng, cfg, "cmp_", r, hd, 2 * hd)
        | {
            "idx_wq_b": idx_wq_b,
            "idx_wq_b_scale": idx_wq_b_scale,
            "idx_weights_proj": _bf16(rng, (cfg.hidden, cfg.idx_heads), cfg.hidden ** -0.5),
            "idx_hadamard": _bf16(rng, (ihd, ihd), ihd ** -0.5),
        }
        | _compressor_weights(rng, cfg, "idx_cmp_", r, ihd, 2 * ihd)
    )


def _moe_weights(rng, kind: str, cfg: ModelConfig, regime: str) -> dict[str, np.ndarray]:
    d, inter, e = cfg.hidden, cfg.moe_inter, cfg.n_experts
    gain = 8.0 if regime == "swiglu_clip" else 1.0
    shared = cfg.n_shared * inter
    w1, w1_scale = _int8(rng, (e, inter, d), gain * d ** -0.5, axis=-1)
    w3, w3_scale = _int8(rng, (e, inter, d), gain * d ** -0.5, axis=-1)
    w2, w2_scale = _int8(rng, (e, d, inter), inter ** -0.5, axis=-1)
    sh_w1, sh_w1_scale = _int8(rng, (shared, d), gain * d ** -0.5, axis=-1)
    sh_w3, sh_w3_scale = _int8(rng, (shared, d), gain * d ** -0.5, axis=-1)
    sh_w2, sh_w2_scale = _int8(rng, (d, shared), shared ** -0.5, axis=-1)
    weights = _hc_weights(rng, cfg) | {
        "gate_w": _normal(rng, (e, d), d ** -0.5),
        "gate_bias": _normal(rng, (e,), 0.1),
        "w1": w1, "w1_scale": w1_scale, "w3": w3, "w3_scale": w3_scale, "w2": w2, "w2_scale": w2_scale,
        "sh_w1": sh_w1, "sh_w1_scale": sh_w1_scale, "sh_w3": sh_w3, "sh_w3_scale": sh_w3_scale,
        "sh_w2": sh_w2, "sh_w2_scale": sh_w2_scale,
    }
    if kind == "moe_hash":
        weights["tid2eid"] = np.argsort(rng.random((cfg.vocab, e)), axis=1)[:, : cfg.topk_experts].astype(np.int32)
    return weights


_SHARD_AXIS = {"wo_a": 0, "wo_b": 1, "w1": 0, "w1_scale": 0, "w3": 0, "w3_scale": 0, "w2": 0, "w2_scale": 0}


def _shard(kind: str, cfg: ModelConfig, weights: dict, rank: int) -> dict[str, np.ndarray]:
    """Rank `rank`'s view of the weights: O groups (TP) or experts (EP) sliced, the rest replicated."""
    ranks = rank_count(kind, cfg)
    out = dict(weights)
    for name, axis in _SHARD_AXIS.items():
        if name in out:
            out[name] = np.split(out[name], ranks, axis=axis)[rank]
    return out


def _rank_state(kind: str, cfg: ModelConfig, seed: int, regime: str, rank: int) -> dict[str, np.ndarray]:
    rng = _rng(seed, kind, 1, rank)
    x_hc = {"x_hc": _normal(rng, (cfg.tokens, cfg.hc_mult, cfg.hidden))}
    if kind == "moe":
        return x_hc
    if kind == "moe_hash":
        return x_hc | {"input_ids": rng.integers(0, cfg.vocab, cfg.tokens).astype(np.int32)}
    starts = request_starts(cfg, regime, rng, first=rank * cfg.batch)
    positions = (starts[:, None] + np.arange(cfg.seq)[None, :]).reshape(-1)
    kv_seq_len = starts + cfg.seq
    state = x_hc | {"positions": positions.astype(np.int32), "kv_seq_len": kv_seq_len.astype(np.int32)}
    state |= _original_kv(rng, cfg, positions, kv_seq_len)
    if kind == "csa":
        state |= _csa_state(rng, cfg, positions, kv_seq_len)
    if kind == "hca":
        state |= _hca_state(rng, cfg, positions, kv_seq_len)
    return state


def start_ranges(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """Inclusive start-position range of each regime (module docstring)."""
    s, w, r, k = cfg.seq, cfg.window, cfg.csa_ratio, cfg.idx_topk
    cap = cache_geometry(cfg).ctx_cap
    ranges = {
        "empty_cmp": (0, 0),
        "short_cache": (max(r, cfg.hca_ratio), r * k - s - 1),
        "long_cache": (r * k + r - 1, cap - s),
        "window_boundary": (w - s + 1, max(w - s + 1, w - 1)),
        "topk_boundary": (r * k - s, r * k - 1),
        "cmp_boundary": (cfg.hca_ratio - s, cap - s),
    }
    for regime, (lo, hi) in ranges.items():
        if lo > hi or lo < 0:
            raise ConfigError(f"seq: regime {regime} has no start position for this config ({lo} > {hi})")
    return ranges


def request_starts(cfg: ModelConfig, regime: str, rng, first: int = 0) -> np.ndarray:
    """Start position of every request for `regime` (module docstring); `first` = the global index of this
    rank's first request (the default cycle runs over the whole TP group, so every regime occurs at TP > 1)."""
    ranges = start_ranges(cfg)
    cycle = len(_DEFAULT_CYCLE)
    names = [_DEFAULT_CYCLE[(first + b) % cycle] if regime == "default" else regime for b in range(cfg.batch)]
    starts = [rng.integers(ranges[n][0], ranges[n][1] + 1) for n in names]
    return np.array([_on_boundary(cfg, x, rng) if n == "cmp_boundary" else x for n, x in zip(names, starts)],
                    dtype=np.int64)


def _on_boundary(cfg: ModelConfig, x: int, rng) -> int:
    """A start near `x` whose chunk closes an HCA entry (pos = R·j − 1, so a CSA entry too) at a seeded offset
    inside the chunk (first token … last token)."""
    r, s = cfg.hca_ratio, cfg.seq
    j = max(1, min((x + s) // r, (cache_geometry(cfg).ctx_cap - s) // r))
    return r * j - 1 - int(rng.integers(0, s))


def _block_table(rng, batch: int, width: int, used) -> np.ndarray:
    """[batch, width]: request b maps its first used[b] pages to distinct pool pages, −1 beyond."""
    perm = rng.permutation(batch * width).reshape(batch, width)
    cols = np.arange(width)[None, :]
    return np.where(cols < np.asarray(used)[:, None], perm, -1).astype(np.int32)


def _ceil_div(a, b):
    return -(-np.asarray(a) // b)


def _original_kv(rng, cfg: ModelConfig, positions, kv_seq_len) -> dict[str, np.ndarray]:
    geo = cache_geometry(cfg)
    bs, w = cfg.block_size, cfg.window
    table = _block_table(rng, cfg.batch, geo.kv_blocks, _ceil_div(kv_seq_len, bs))
    tables = table[request_of_tokens(cfg.tokens, cfg.seq)]
    first = np.maximum(positions - w + 1, 0)
    logical = first[:, None] + np.arange(w)[None, :]
    logical = np.where(logical <= positions[:, None], logical, -1)
    return {
        "kv_cache": _bf16(rng, (geo.rows(geo.kv_blocks), cfg.head_dim)),
        "kv_block_table": table,
        "swa_slot_mapping": page_rows(tables, positions[:, None], bs)[:, 0].astype(np.int32),
        "swa_indices": page_rows(tables, logical, bs).astype(np.int32),
        "swa_lens": np.minimum(positions + 1, w).astype(np.int32),
    }


def _cmp_pages(rng, cfg: ModelConfig, ratio: int, positions, kv_seq_len) -> tuple[np.ndarray, np.ndarray, int]:
    """(block table, slot mapping, pool rows) of a compressed cache: entry pos // r at window-closing tokens."""
    geo = cache_geometry(cfg)
    bs = cfg.block_size
    width = geo.csa_blocks if ratio == cfg.csa_ratio else geo.hca_blocks
    table = _block_table(rng, cfg.batch, width, _ceil_div(_ceil_div(kv_seq_len, ratio), bs))
    tables = table[request_of_tokens(cfg.tokens, cfg.seq)]
    entry = np.where((positions + 1) % ratio == 0, positions // ratio, -1)
    slots = page_rows(tables, entry[:, None], bs)[:, 0].astype(np.int32)
    return table, slots, geo.rows(width)


def _cmp_kv(rng, cfg: ModelConfig, ratio: int, positions, kv_seq_len) -> dict[str, np.ndarray]:
    table, slots, rows = _cmp_pages(rng, cfg, ratio, positions, kv_seq_len)
    return {"cmp_kv": _bf16(rng, (rows, cfg.head_dim)), "cmp_block_table": table, "cmp_slot_mapping": slots}


def _idx_kv(rng, cfg: ModelConfig, positions, kv_seq_len) -> dict[str, np.ndarray]:
    table, slots, rows = _cmp_pages(rng, cfg, cfg.csa_ratio, positions, kv_seq_len)
    cache, scale = q8(_normal(rng, (rows, cfg.idx_head_dim)))
    return {"idx_kv_cache": cache, "idx_kv_scale": scale[:, 0], "idx_block_table": table, "idx_slot_mapping": slots}


def _state(rng, cfg: ModelConfig, prefix: str, positions, blocks: int, out: int) -> dict[str, np.ndarray]:
    """Ring state: kv 0 / score FP32_NEG_INF, with seeded history rows for positions [start − ring + S, start)."""
    bs, s = cfg.block_size, cfg.seq
    geo = cache_geometry(cfg)
    table = _block_table(rng, cfg.batch, blocks, np.full(cfg.batch, blocks))
    state = np.zeros((geo.rows(blocks), 2 * out), dtype=np.float32)
    state[:, out:] = FP32_NEG_INF
    ring = blocks * bs
    for b in range(cfg.batch):
        start = int(positions[b * s])
        hist = np.arange(max(0, start - ring + s), start)
        rows = page_rows(table[b][None, :], ((hist // bs) % blocks * bs + hist % bs)[None, :], bs)[0]
        state[rows] = _normal(rng, (len(hist), 2 * out))
    return {f"{prefix}state": state, f"{prefix}state_block_table": table}


def _csa_state(rng, cfg: ModelConfig, positions, kv_seq_len) -> dict[str, np.ndarray]:
    hd, ihd = cfg.head_dim, cfg.idx_head_dim
    blocks = cache_geometry(cfg).csa_state_blocks
    return (
        _cmp_kv(rng, cfg, cfg.csa_ratio, positions, kv_seq_len)
        | _state(rng, cfg, "cmp_", positions, blocks, 2 * hd)
        | _idx_kv(rng, cfg, positions, kv_seq_len)
        | _state(rng, cfg, "idx_cmp_", positions, blocks, 2 * ihd)
    )


def _hca_state(rng, cfg: ModelConfig, positions, kv_seq_len) -> dict[str, np.ndarray]:
    blocks = cache_geometry(cfg).hca_state_blocks
    return (_cmp_kv(rng, cfg, cfg.hca_ratio, positions, kv_seq_len)
            | _state(rng, cfg, "cmp_", positions, blocks, cfg.head_dim))


# ---- rank merge / split -----------------------------------------------------------------------------------------

_PAGED = (
    (("kv_cache",), "kv_block_table", ("swa_slot_mapping", "swa_indices")),
    (("cmp_kv",), "cmp_block_table", ("cmp_slot_mapping",)),
    (("cmp_state",), "cmp_state_block_table", ()),
    (("idx_kv_cache", "idx_kv_scale"), "idx_block_table", ("idx_slot_mapping",)),
    (("idx_cmp_state",), "idx_cmp_state_block_table", ()),
)
_PER_RANK = {"x_hc", "positions", "kv_seq_len", "swa_lens", "input_ids"} | {
    name for pools, table, slots in _PAGED for name in (*pools, table, *slots)}


def merged_config(kind: str, cfg: ModelConfig) -> ModelConfig:
    """The single-rank config holding every rank's requests / tokens."""
    if kind in MOE_KINDS:
        return cfg.with_(tp=1, ep=1, decode_batch=cfg.batch * cfg.ep)
    return cfg.with_(tp=1)


def merge_rank_inputs(kind: str, cfg: ModelConfig, per_rank: list[dict]) -> tuple[ModelConfig, dict]:
    """(merged config, single-rank inputs) equivalent to `per_rank`: per-rank arrays concatenated (pools too, with
    block tables offset by r·pool pages and slots by r·pool rows), shards re-joined, replicated weights kept."""
    merged = {}
    for name in per_rank[0]:
        arrays = [inp[name] for inp in per_rank]
        if name in _SHARD_AXIS:
            merged[name] = np.concatenate(arrays, axis=_SHARD_AXIS[name])
        elif name in _PER_RANK:
            merged[name] = np.concatenate(arrays, axis=0)
        else:
            merged[name] = arrays[0]
    for pools, table, slots in _PAGED:
        if pools[0] not in merged:
            continue
        rows = per_rank[0][pools[0]].shape[0]
        merged[table] = _offset([inp[table] for inp in per_rank], rows // cfg.block_size)
        for slot in slots:
            merged[slot] = _offset([inp[slot] for inp in per_rank], rows)
    return merged_config(kind, cfg), merged


def _offset(arrays: list[np.ndarray], step: int) -> np.ndarray:
    return np.concatenate([np.where(a >= 0, a + r * step, -1).astype(a.dtype) for r, a in enumerate(arrays)])


def split_rank_outputs(kind: str, cfg: ModelConfig, outputs: dict, ranks: int | None = None) -> list[dict]:
    """Per-rank outputs from merged single-rank outputs: every output splits evenly along axis 0."""
    ranks = ranks or rank_count(kind, cfg)
    parts = {name: np.split(a, ranks, axis=0) for name, a in outputs.items()}
    return [{name: parts[name][r] for name in outputs} for r in range(ranks)]

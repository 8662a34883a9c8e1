"""Whole decode layers composed in the order of dsv4-math §10, single-rank (TP1) and multi-rank forms.

Every layer function takes `(cfg, inputs)` with the names of `goldens.inputs` and returns ALL outputs: `x_out`
plus every updated cache / state buffer under its input name (new arrays; inputs are never mutated). Logical
bf16 outputs are f32 arrays holding bf16 values (`inputs.output_specs` gives the logical dtypes,
`inputs.typed_outputs` casts them). Tolerances for comparing against these outputs: `goldens.compare`.

An optional `trace` dict receives intermediates for stage-by-stage checks: hc.x_mixed, hc.post, hc.comb,
norm.x_normed, qkv.q, qkv.kv, qkv.qr, qkv.qr_scale, attn.out (f32 before de-rotation), attn.packed,
attn.cmp_rows (CSA/HCA physical cmp_kv rows), o.attn_out; CSA adds idx.q_i8, idx.q_scale, idx.weights,
idx.visible, idx.score, idx.topk; MoE adds moe.x_i8, moe.x_scale, moe.idx, moe.wts, moe.sh, moe.routed_y,
moe.ffn_out.

TP form (`decode_*_tp`): rank r owns its own requests (its inputs carry its own caches) and the O-projection
shards wo_a [local_o_groups, ...], wo_b [D, local_o_groups·o_lora]; the O path is the all-to-all of groups,
per-rank f32 partials, f32 reduce-scatter, then rb (dsv4-math §7). EP form (`moe_layer_ep`): rank r owns its
tokens and experts r·local_experts …; results equal the single-rank form row by row.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .attention import (
    attend,
    csa_compressed_rows,
    derotate_pack,
    even_tiles,
    gather_keys,
    hca_compressed_rows,
    sparse_window,
    swa_window,
    work_rows,
)
from .compressor import Entry, compress_step, compressor_weights, csa_spec, hca_spec, indexer_spec
from .config import ModelConfig, tiles_for
from .hc import hc_post, hc_pre
from .indexer import indexer_topk, write_index_cache
from .moe import moe_ffn, moe_ffn_ep
from .norm import rms_norm
from .numerics import rb, rope_half
from .o_proj import o_proj, o_proj_tp
from .paging import write_rows
from .qkv import qkv_proj_rope


@dataclass
class Front:
    """A rank's attention result before the O projection: packed heads, HC gates and the updated buffers."""

    packed: np.ndarray
    post: np.ndarray
    comb: np.ndarray
    buffers: dict


@dataclass
class Prefix:
    """Steps 1-3 of §10: hc_pre, rms_norm, qkv_proj_rope, plus the per-token RoPE half rows."""

    post: np.ndarray
    comb: np.ndarray
    x_normed: np.ndarray
    qkv: dict
    positions: np.ndarray
    c: np.ndarray
    s: np.ndarray


def _record(trace: dict | None, **values) -> None:
    if trace is not None:
        trace.update({name.replace("__", "."): v for name, v in values.items()})


def attention_prefix(cfg: ModelConfig, inputs: dict, trace: dict | None) -> Prefix:
    """hc_pre → rms_norm → qkv_proj_rope at per-token positions with the layer's table (§10 steps 1-3)."""
    x_mixed, post, comb = hc_pre(cfg, inputs["x_hc"], inputs["hc_fn"], inputs["hc_scale"], inputs["hc_base"])
    x_normed = rms_norm(x_mixed, inputs["norm_w"], cfg.rms_eps)
    positions = np.asarray(inputs["positions"])
    c, s = rope_half(inputs["rope_cos"], positions), rope_half(inputs["rope_sin"], positions)
    qkv = qkv_proj_rope(cfg, x_normed, inputs, c, s)
    _record(trace, hc__x_mixed=x_mixed, hc__post=post, hc__comb=comb, norm__x_normed=x_normed,
            qkv__q=qkv["q"], qkv__kv=qkv["kv"], qkv__qr=qkv["qr"], qkv__qr_scale=qkv["qr_scale"])
    return Prefix(post, comb, x_normed, qkv, positions, c, s)


def write_cmp_entries(cmp_kv, entries: list[Entry], slots) -> np.ndarray:
    """Main compressors store rb(y) at cmp_slot_mapping[token] (§4 "Finish")."""
    out = cmp_kv.copy()
    for entry in entries:
        if slots[entry.token] >= 0:
            out[slots[entry.token]] = rb(entry.y)
    return out


def main_compressor(cfg: ModelConfig, spec, p: Prefix, inputs: dict) -> tuple[np.ndarray, np.ndarray]:
    """(cmp_state, cmp_kv) after one step of the layer's main compressor (§10 step 4)."""
    state, entries = compress_step(cfg, spec, p.x_normed, p.positions, compressor_weights(inputs, "cmp_"),
                                   inputs["cmp_state"], inputs["cmp_state_block_table"], inputs["rope_cos"],
                                   inputs["rope_sin"])
    return state, write_cmp_entries(inputs["cmp_kv"], entries, inputs["cmp_slot_mapping"])


def _attend_pack(cfg: ModelConfig, p: Prefix, inputs: dict, keys, valid, bounds, trace) -> np.ndarray:
    out = attend(cfg, p.qkv["q"], keys, valid, bounds, inputs["attn_sink"])
    packed = derotate_pack(cfg, out, p.c, p.s)
    _record(trace, attn__out=out, attn__packed=packed)
    return packed


def front_swa(cfg: ModelConfig, inputs: dict, trace: dict | None = None) -> Front:
    """SWA: write kv rows, attend over the window only (§10)."""
    p = attention_prefix(cfg, inputs, trace)
    kv_cache = write_rows(inputs["kv_cache"], inputs["swa_slot_mapping"], p.qkv["kv"])
    rows, valid = swa_window(inputs["swa_indices"], inputs["swa_lens"])
    keys, valid = gather_keys(kv_cache, rows, valid)
    bounds = even_tiles(0, keys.shape[1], tiles_for(cfg).ATTN_K_TILE)
    packed = _attend_pack(cfg, p, inputs, keys, valid, bounds, trace)
    return Front(packed, p.post, p.comb, {"kv_cache": kv_cache})


def front_csa(cfg: ModelConfig, inputs: dict, trace: dict | None = None, bypass: bool = False) -> Front:
    """CSA: main r=4 compressor, indexer (inner compressor → C8 cache, scores, top-k), kv rows, then attention
    over window + masked top-k in ATTN_K_TILE tiles (§10)."""
    p = attention_prefix(cfg, inputs, trace)
    cmp_state, cmp_kv = main_compressor(cfg, csa_spec(cfg), p, inputs)
    idx_state, idx_entries = compress_step(cfg, indexer_spec(cfg), p.x_normed, p.positions,
                                           compressor_weights(inputs, "idx_cmp_"), inputs["idx_cmp_state"],
                                           inputs["idx_cmp_state_block_table"], inputs["rope_cos"],
                                           inputs["rope_sin"])
    idx_kv_cache, idx_kv_scale = write_index_cache(inputs["idx_kv_cache"], inputs["idx_kv_scale"], idx_entries,
                                                   inputs["idx_slot_mapping"], inputs["idx_hadamard"])
    topk = indexer_topk(cfg, p.x_normed, p.qkv["qr"], p.qkv["qr_scale"], p.positions, inputs, idx_kv_cache,
                        idx_kv_scale, trace, bypass)
    kv_cache = write_rows(inputs["kv_cache"], inputs["swa_slot_mapping"], p.qkv["kv"])
    win_keys, win_valid = gather_keys(kv_cache, *sparse_window(inputs["swa_indices"]))
    cmp_rows = csa_compressed_rows(cfg, topk, p.positions, inputs["cmp_block_table"])
    cmp_keys, cmp_valid = gather_keys(cmp_kv, cmp_rows)
    keys = np.concatenate([win_keys, cmp_keys], axis=1)
    valid = np.concatenate([win_valid, cmp_valid], axis=1)
    _record(trace, attn__cmp_rows=cmp_rows)
    packed = _attend_pack(cfg, p, inputs, keys, valid, even_tiles(0, keys.shape[1], tiles_for(cfg).ATTN_K_TILE),
                          trace)
    buffers = {"kv_cache": kv_cache, "cmp_kv": cmp_kv, "cmp_state": cmp_state, "idx_kv_cache": idx_kv_cache,
               "idx_kv_scale": idx_kv_scale, "idx_cmp_state": idx_state}
    return Front(packed, p.post, p.comb, buffers)


def front_hca(cfg: ModelConfig, inputs: dict, trace: dict | None = None) -> Front:
    """HCA: r=R compressor, kv rows, then the window stream followed by the visible compressed rows in
    ascending work items (§6.2 two-stream form, §10)."""
    p = attention_prefix(cfg, inputs, trace)
    cmp_state, cmp_kv = main_compressor(cfg, hca_spec(cfg), p, inputs)
    kv_cache = write_rows(inputs["kv_cache"], inputs["swa_slot_mapping"], p.qkv["kv"])
    win_keys, win_valid = gather_keys(kv_cache, *sparse_window(inputs["swa_indices"]))
    cmp_rows = hca_compressed_rows(cfg, p.positions, inputs["kv_seq_len"], inputs["cmp_block_table"])
    cmp_keys, cmp_valid = gather_keys(cmp_kv, cmp_rows)
    keys = np.concatenate([win_keys, cmp_keys], axis=1)
    valid = np.concatenate([win_valid, cmp_valid], axis=1)
    win = win_keys.shape[1]
    bounds = [(0, win)] + even_tiles(win, keys.shape[1], work_rows(cfg))
    _record(trace, attn__cmp_rows=cmp_rows)
    packed = _attend_pack(cfg, p, inputs, keys, valid, bounds, trace)
    return Front(packed, p.post, p.comb, {"kv_cache": kv_cache, "cmp_kv": cmp_kv, "cmp_state": cmp_state})


def _finish_tp1(cfg: ModelConfig, inputs: dict, front: Front, trace: dict | None) -> dict[str, np.ndarray]:
    attn_out = o_proj(cfg, front.packed, inputs["wo_a"], inputs["wo_b"], inputs["wo_b_scale"])
    _record(trace, o__attn_out=attn_out)
    return {"x_out": hc_post(attn_out, inputs["x_hc"], front.post, front.comb), **front.buffers}


def _run_tp(cfg: ModelConfig, per_rank: list[dict], front_fn) -> list[dict[str, np.ndarray]]:
    if len(per_rank) != cfg.tp:
        raise ValueError(f"per_rank_inputs: expected tp={cfg.tp} ranks, got {len(per_rank)}")
    fronts = [front_fn(cfg, inputs) for inputs in per_rank]
    attn = o_proj_tp(cfg, [f.packed for f in fronts], [i["wo_a"] for i in per_rank], [i["wo_b"] for i in per_rank],
                     per_rank[0]["wo_b_scale"])
    return [{"x_out": hc_post(a, i["x_hc"], f.post, f.comb), **f.buffers} for a, i, f in zip(attn, per_rank, fronts)]


def decode_swa(cfg: ModelConfig, inputs: dict, trace: dict | None = None) -> dict[str, np.ndarray]:
    """SWA decode layer, TP1 form. Outputs: x_out, kv_cache."""
    return _finish_tp1(cfg, inputs, front_swa(cfg, inputs, trace), trace)


def decode_csa(cfg: ModelConfig, inputs: dict, trace: dict | None = None,
               bypass: bool = False) -> dict[str, np.ndarray]:
    """CSA decode layer, TP1 form. Outputs: x_out, kv_cache, cmp_kv, cmp_state, idx_kv_cache, idx_kv_scale,
    idx_cmp_state. bypass=True: the top-k bypass form (dspark-model.md §6(a))."""
    return _finish_tp1(cfg, inputs, front_csa(cfg, inputs, trace, bypass), trace)


def decode_hca(cfg: ModelConfig, inputs: dict, trace: dict | None = None) -> dict[str, np.ndarray]:
    """HCA decode layer, TP1 form. Outputs: x_out, kv_cache, cmp_kv, cmp_state."""
    return _finish_tp1(cfg, inputs, front_hca(cfg, inputs, trace), trace)


def decode_swa_tp(cfg: ModelConfig, per_rank_inputs: list[dict]) -> list[dict[str, np.ndarray]]:
    return _run_tp(cfg, per_rank_inputs, front_swa)


def decode_csa_tp(cfg: ModelConfig, per_rank_inputs: list[dict]) -> list[dict[str, np.ndarray]]:
    return _run_tp(cfg, per_rank_inputs, front_csa)


def decode_hca_tp(cfg: ModelConfig, per_rank_inputs: list[dict]) -> list[dict[str, np.ndarray]]:
    return _run_tp(cfg, per_rank_inputs, front_hca)


def moe_layer(cfg: ModelConfig, inputs: dict, trace: dict | None = None) -> dict[str, np.ndarray]:
    """FFN half: hc_pre(ffn) → gate → shared ∥ routed → combine → hc_post (§10). Hash routing iff the inputs
    carry tid2eid and input_ids. Outputs: x_out."""
    x_mixed, post, comb = hc_pre(cfg, inputs["x_hc"], inputs["hc_fn"], inputs["hc_scale"], inputs["hc_base"])
    _record(trace, hc__x_mixed=x_mixed, hc__post=post, hc__comb=comb)
    ffn_out = moe_ffn(cfg, x_mixed, inputs, trace)
    _record(trace, moe__ffn_out=ffn_out)
    return {"x_out": hc_post(ffn_out, inputs["x_hc"], post, comb)}


def moe_layer_ep(cfg: ModelConfig, per_rank_inputs: list[dict]) -> list[dict[str, np.ndarray]]:
    """EP form over cfg.ep ranks; rank r's w1/w3/w2 hold experts r·local_experts … (dspark-model.md §3.6)."""
    if len(per_rank_inputs) != cfg.ep:
        raise ValueError(f"per_rank_inputs: expected ep={cfg.ep} ranks, got {len(per_rank_inputs)}")
    pres = [hc_pre(cfg, i["x_hc"], i["hc_fn"], i["hc_scale"], i["hc_base"]) for i in per_rank_inputs]
    ffn = moe_ffn_ep(cfg, [x for x, _, _ in pres], per_rank_inputs)
    return [{"x_out": hc_post(f, i["x_hc"], post, comb)} for f, i, (_, post, comb) in zip(ffn, per_rank_inputs, pres)]


LAYERS = {"swa": decode_swa, "csa": decode_csa, "hca": decode_hca, "moe": moe_layer, "moe_hash": moe_layer}
LAYERS_MULTI = {"swa": decode_swa_tp, "csa": decode_csa_tp, "hca": decode_hca_tp, "moe": moe_layer_ep,
                "moe_hash": moe_layer_ep}


def run_layer(kind: str, cfg: ModelConfig, inputs: dict) -> dict[str, np.ndarray]:
    """The single-rank golden of a layer kind."""
    return LAYERS[kind](cfg, inputs)


def run_layer_ranks(kind: str, cfg: ModelConfig, per_rank_inputs: list[dict]) -> list[dict[str, np.ndarray]]:
    """The multi-rank golden (TP for attention kinds, EP for MoE kinds)."""
    return LAYERS_MULTI[kind](cfg, per_rank_inputs)

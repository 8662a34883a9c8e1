"""decode-swa: the SWA decode layer (ratio 0; layers 0-1), dspark-model.md §3.1, §3.2, §3.5; dsv4-math §10.

shared prefix (hc_pre, rms_norm, late_dep, qkv_proj_rope); at TP > 1 the seed's context-parallel form: x_normed,
  positions and the slot mapping are all-gathered over the TP group (cp_allgather + read-back) and the KV side
  (kv_rope_prepare, kv_proj, kv_rms_norm_rope, the cache insert's row loop) runs on the group's tp·T rows, the
  other ranks' slots masked to −1 (docs/seed-baselines.md "SWA")
→ swa_cache_insert_valid_bias (ONE fused `at` task: kv rows scattered into kv_cache in place, then the window's
  valid bias; the `split-writeback-bias` pass splits it)
→ swa_gather_kv → qk_pv → rope_cs → merge_norm (sink, inverse RoPE, group-major pack)
→ O path (TP1 grouped o_proj, or all-to-all + per-group O + reduce-scatter at TP > 1) → hc_post.
Returns x_out and the updated kv_cache.
"""
from __future__ import annotations

from ..dims import ceildiv
from .builder import GraphBuilder
from .common import (
    AttnParams,
    attention_params,
    attention_prefix,
    attn_norm,
    cp_gather,
    hc_post,
    hc_pre,
    o_proj,
    qkv_proj_rope,
)


def build_swa(b: GraphBuilder, *, token_capacity: int | None = None) -> None:
    """token_capacity: the seed's TP1 token capacity (LOCAL_T) when the step holds fewer tokens (rows mostly
    padding): the O projection's proj_b then covers the padded rows as before pypto-lib #1226 (default: T)."""
    swa_layer(b, attention_params(b), token_capacity=token_capacity)


def swa_layer(b: GraphBuilder, p: AttnParams, own_rows: bool = True, token_capacity: int | None = None) -> None:
    """The layer on declared params. `own_rows`: at TP > 1, mask the other ranks' gathered slots to −1 (decode:
    every rank owns its requests); prefill-swa's context-parallel ranks share one request and write every row."""
    c, t = b.cfg, b.tiles
    T = b.T
    if b.tp == 1:
        pre, _x_normed, _late, qkv = attention_prefix(b, p)
        slots = p.swa_slot_mapping
    else:
        # the seed's context-parallel form: the KV side runs on the TP group's tokens (docs/seed-baselines.md)
        # the group's positions and slot mapping: inputs of the seed (host metadata), gathered here since the
        # goldens' inputs are per rank; the own-rows mask keeps each rank's cache its own (modelling glue).
        # Anchored after the layer's first task (hc_pre_rms reads x_hc): gathers that read graph inputs only
        # would float ahead of earlier layers' collectives in a chained model, and every rank must meet its peers
        # in one order (each later release would then edge them: deps growing with the square of the layers).
        pre = hc_pre(b, p.x_hc, p.hc_fn, p.hc_scale, p.hc_base)
        anchor = b.graph.nodes["hc.hc_pre_rms"].result
        pos_group = cp_gather(b, p.positions, "cp.positions_allgather", after=anchor)
        slots_group = cp_gather(b, p.swa_slot_mapping, "cp.slot_mapping_allgather", after=pos_group)
        slots = slots_group
        if own_rows:
            slots = b.op("cp_own_rows", slots_group, name="cp.slot_mapping_own_rows", tp=b.tp, fill=-1)
        x_normed, late = attn_norm(b, pre.x_mixed, p.norm_w)
        x_group = cp_gather(b, x_normed, "cp.x_normed_allgather", after=slots)   # one collective order per rank
        qkv = qkv_proj_rope(b, x_normed, late, p.wq_a, p.gamma_cq, p.wq_b, p.wq_b_scale, p.wkv, p.gamma_ckv,
                            p.rope_cos, p.rope_sin, p.positions, kv_x=x_group, kv_positions=pos_group)

    kv_cache, bias = b.op("swa_cache_insert_valid_bias", qkv.kv, p.kv_cache, slots, p.swa_lens,
                          name="swa.swa_cache_insert_valid_bias", window=c.window, tile=[t.BIAS_T_TILE], blocks=1,
                          core="vector", **b.clamp(T, t.BIAS_T_TILE))
    rows = b.op("swa_gather_kv", kv_cache, p.swa_indices, name="swa.swa_gather_kv",
                tile=[c.window // t.GATHER_SPLITS], blocks=T * t.GATHER_SPLITS)
    m, l, o = b.op("qk_pv", qkv.q, rows, bias, p.swa_indices, name="swa.qk_pv", scale=c.softmax_scale,
                   k_tile=t.ATTN_K_TILE, blocks=T, aer=True)
    cos_il, sin_signed = b.op("rope_tables", p.rope_cos, p.rope_sin, p.positions, name="swa.rope_cs",
                              rope_dim=c.rope_dim, blocks=1)
    packed = b.op("merge_norm", m, l, o, p.attn_sink, cos_il, sin_signed, name="swa.merge_norm",
                  o_groups=c.o_groups, tile=[t.H_TILE], blocks=T * ceildiv(c.heads, t.H_TILE), aer=True)

    attn_out = o_proj(b, packed, p.wo_a, p.wo_b, p.wo_b_scale, token_capacity=token_capacity)
    x_out = hc_post(b, attn_out, p.x_hc, pre)
    b.ret(x_out=x_out, kv_cache=kv_cache)

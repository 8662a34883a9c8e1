"""decode-swa: the SWA decode layer (ratio 0; layers 0-1), dspark-model.md §3.1, §3.2, §3.5; dsv4-math §10.

shared prefix (hc_pre, rms_norm, late_dep, qkv_proj_rope)
→ swa_cache_insert_valid_bias (ONE fused `at` task: kv rows scattered into kv_cache in place, then the window's
  valid bias; the `split-writeback-bias` pass splits it)
→ swa_gather_kv → qk_pv → rope_cs → merge_norm (sink, inverse RoPE, group-major pack)
→ O path (TP1 grouped o_proj, or all-to-all + per-group O + reduce-scatter at TP > 1) → hc_post.
Returns x_out and the updated kv_cache.
"""
from __future__ import annotations

from ..dims import ceildiv
from .builder import GraphBuilder
from .common import attention_params, attention_prefix, hc_post, o_proj


def build_swa(b: GraphBuilder) -> None:
    c, t = b.cfg, b.tiles
    T = b.T
    p = attention_params(b)
    pre, _x_normed, _late, qkv = attention_prefix(b, p)

    kv_cache, bias = b.op("swa_cache_insert_valid_bias", qkv.kv, p.kv_cache, p.swa_slot_mapping, p.swa_lens,
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

    attn_out = o_proj(b, packed, p.wo_a, p.wo_b, p.wo_b_scale)
    x_out = hc_post(b, attn_out, p.x_hc, pre)
    b.ret(x_out=x_out, kv_cache=kv_cache)

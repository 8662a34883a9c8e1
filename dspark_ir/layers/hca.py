"""decode-hca: the HCA decode layer (ratio R = 128, TINY 16; odd layers), dspark-model.md §3.1, §3.3, §3.5;
dsv4-math §4, §6, §10.

Stages, in the seed's *before* structure (node = `<block>.<seed stage>`):
  shared prefix (hc.*, attn.rms_norm, attn.late_dep, qkv.*)
  2'      hca.cmp_rope_rows (rows at the entry pooled this step, R·(first // R)) → hca.rope_interleave
  5       hca.hca_cache_writeback                      kv → kv_cache (in place)
  6a-c    cmp.kv_score_proj → cmp.scatter_softmax_pool → cmp.rmsnorm_rope_cache_write      r=R compressor
  7       hca.cache_ready_dep                          join of both cache writes
  8a-b    hca.hca_gather_kv → hca.hca_raw_transpose
  8c-d    hca.rope_swap, hca.rope_cs
  8e      hca.hca_raw_attn                             raw-window stream state (m, l, unnormalised heads)
  8f-g    hca.hca_cmp_work_gather → hca.hca_cmp_qk_pv   compressed partials per work item of CMP_PAGES_PER_WORK pages
  8h      hca.hca_stream_merge                         normalised f32 stream heads
  8i      hca.hca_stream_pack                          inverse RoPE, bf16, group-major pack
          (8h and 8i stay TWO ops: the `fuse-merge-rope-pack` pass fuses them into hca_stream_merge_pack)
  9-11    O path (o.*), hca.hca_output_bridge (TP > 1), hc.hc_post
Returns x_out and the updated kv_cache, cmp_kv, cmp_state.
"""
from __future__ import annotations

from ..dims import ceildiv
from ..errors import ConfigError
from ..graph import Value
from .builder import GraphBuilder
from .common import AttnParams, attention_params, attention_prefix, compressor_params, hc_post, o_proj
from .cp_payload import HCA_WIRE_WORKERS, CompressorGathers
from .csa import compressor, finish_tiles, max_visible_entries, request_rope


def build_hca(b: GraphBuilder, *, max_context: int | None = None, token_capacity: int | None = None,
              cmp_pages_per_work: int | None = None) -> None:
    """max_context: an upper bound on kv_seq_len the caller guarantees (default: the cache capacity). It bounds the
    number of compressed work items (`works` on hca.hca_cmp_work_gather); beyond the cache capacity (FLASH 8K)
    the caches grow to hold it (GraphBuilder.set_context), e.g. 131072 for the 128K-context cases.
    token_capacity: the seed's TP1 token capacity (LOCAL_T) when the step holds fewer tokens (rows mostly
    padding): the O projection's proj_b then covers the padded rows as before pypto-lib #1226 (default: T).
    cmp_pages_per_work: cache pages per compressed work item, i.e. hca_cmp_qk_pv's K tile in pages (default: the
    tiles' CMP_PAGES_PER_WORK). 1 is the seed's TP1 form before pypto-lib #1228 (a 32-row K tile per page at
    flash), which the `hca-cmp-wide-k-tile` pass widens."""
    b.set_context(max_context)
    c, t, geo = b.cfg, b.tiles, b.geo
    T, B, HD, R = b.T, b.B, c.head_dim, c.hca_ratio
    p = attention_params(b)
    cmp_rows = b.bind("CMP", geo.rows(geo.hca_blocks))
    state_rows = b.bind("STATE", geo.rows(geo.hca_state_blocks))
    cmp = compressor_params(b, ratio=R, overlap=False, cmp_rows=cmp_rows, state_rows=state_rows, requests=B,
                            blocks=geo.hca_blocks, state_blocks=geo.hca_state_blocks)

    pre, x_normed, late, qkv = attention_prefix(b, p)

    # 2': RoPE rows of the entry pooled this step
    ent_cos, ent_sin = request_rope(b, "hca", "cmp_rope_rows", "hca.rope_interleave", p.rope_cos, p.rope_sin,
                                    p.positions, at="boundary", ratio=R)

    # 5 ∥ 6: original-KV writeback and the ratio-R compressor, joined by cache_ready_dep
    # (at TP > 1 the writeback takes the kv rows the compressor payload's CP all-gather carries: after it)
    def cache_writeback(kv):
        return b.op("kv_cache_writeback", kv, p.kv_cache, p.swa_slot_mapping, name="hca.hca_cache_writeback",
                    tile=[t.T_TILE], blocks=ceildiv(T, t.T_TILE), **b.clamp(T, t.T_TILE))
    cp = CompressorGathers(b)      # the seed base's CP all-gather of the compressor payload (TP > 1)
    kv_cache = cache_writeback(qkv.kv) if b.tp == 1 else None
    cmp_state, pooled = compressor(b, "cmp", x_normed, late, cmp.wkv, cmp.wgate, cmp.ape, cmp.state,
                                   cmp.state_block_table, p.positions, ratio=R, head_dim=HD, overlap=False,
                                   out_tile=t.CMP_OUT_TILE,
                                   payload=cp.payload("cp.hca_allgather", kv=qkv.kv, wire_workers=HCA_WIRE_WORKERS))
    if kv_cache is None:
        kv_cache = cache_writeback(cp.kv)
    cmp_kv = b.op("cmp_rmsnorm_rope_cache_write", pooled, cmp.norm_w, ent_cos, ent_sin, cmp.kv, cmp.slot_mapping,
                  p.positions, name="cmp.rmsnorm_rope_cache_write", ratio=R, seq=c.seq, eps=c.rms_eps,
                  **finish_tiles(b))   # ratio 128: not marked early-resolve upstream (ratio 4's is, #915)
    ready = b.op("join", name="hca.cache_ready_dep", deps=[kv_cache, cmp_kv])

    # 8a-i: the sparse attention, compressed partials per work item (neutral past the visible rows)
    pages = t.CMP_PAGES_PER_WORK if cmp_pages_per_work is None else cmp_pages_per_work
    if pages < 1:
        raise ConfigError(f"cmp_pages_per_work: must be ≥ 1, got {pages}")
    work_rows = pages * c.block_size
    works = max(1, -(-max_visible_entries(b, R, geo.hca_blocks, max_context) // work_rows))
    packed = hca_attention(b, p, qkv.q, kv_cache, cmp_kv, cmp.block_table, ready, work_rows=work_rows, works=works,
                           gather_blocks=B * works, seq=c.seq, max_rows=c.max_pos // R)
    x_out = hca_output(b, p, packed, pre, token_capacity=token_capacity)
    b.ret(x_out=x_out, kv_cache=kv_cache, cmp_kv=cmp_kv, cmp_state=cmp_state)


def hca_attention(b: GraphBuilder, p: AttnParams, q: Value, kv_cache: Value, cmp_kv: Value, cmp_block_table: Value,
                  ready: Value, *, work_rows: int, works: int, gather_blocks: int, seq: int, max_rows: int) -> Value:
    """Stages 8a-8i of the HCA attention (decode, and prefill's chunk as one request), after `ready` (both cache
    writes): the raw-window stream (8a-e), the compressed partials of `works` items of `work_rows` rows gathered
    by `gather_blocks` blocks (8f-g; `seq` tokens per request, `max_rows` the compressed rows' bound), the merge
    and the pack (8h-i; two ops, which `fuse-merge-rope-pack` fuses). Returns the packed attention output."""
    c, t, T = b.cfg, b.tiles, b.T
    rows = b.op("swa_gather_kv", kv_cache, p.swa_indices, name="hca.hca_gather_kv",
                tile=[c.window // t.GATHER_SPLITS], blocks=T * t.GATHER_SPLITS, deps=[ready])
    rows_t = b.op("hca_raw_transpose", rows, name="hca.hca_raw_transpose", tile=[t.RAW_K_TILE],
                  blocks=T * ceildiv(c.window, t.RAW_K_TILE))
    swap = b.op("rope_swap_idx", name="hca.rope_swap", rope_dim=c.rope_dim, blocks=1)
    cos_il, sin_signed = b.op("rope_tables", p.rope_cos, p.rope_sin, p.positions,
                              names=["hca.rope_cs", "hca.rope_cs.sin"], rope_dim=c.rope_dim, blocks=2)
    head_blocks = T * ceildiv(c.heads, t.H_TILE)
    sm, sl, sheads = b.op("hca_raw_attn", q, rows, rows_t, p.swa_indices,
                          names=["hca.hca_raw_attn", "hca.stream_state_l", "hca.stream_heads"],
                          scale=c.softmax_scale, tile=[1, t.H_TILE], blocks=head_blocks)
    crow, cphys = b.op("hca_cmp_work_gather", cmp_kv, cmp_block_table,
                       names=["hca.hca_cmp_work_gather", "hca.hca_cmp_work_gather.phys"], block_size=c.block_size,
                       work_rows=work_rows, works=works, blocks=gather_blocks, deps=[ready])
    cm, cl, co = b.op("hca_cmp_qk_pv", q, crow, cphys, p.positions, p.kv_seq_len,
                      names=["hca.hca_cmp_qk_pv", "hca.hca_cmp_qk_pv.l", "hca.hca_cmp_qk_pv.o"],
                      scale=c.softmax_scale, ratio=c.hca_ratio, seq=seq, work_rows=work_rows, max_rows=max_rows,
                      tile=[1], blocks=T * works)
    merged = b.op("hca_stream_merge", sm, sl, sheads, cm, cl, co, p.attn_sink, name="hca.hca_stream_merge",
                  tile=[1, t.H_TILE], blocks=head_blocks)
    return b.op("hca_stream_pack", merged, cos_il, sin_signed, swap, name="hca.hca_stream_pack",
                o_groups=c.o_groups, tile=[1, t.H_TILE], blocks=head_blocks)


def hca_output(b: GraphBuilder, p: AttnParams, packed: Value, pre, token_capacity: int | None = None) -> Value:
    """Stages 9-11: the O path, the output bridge at TP > 1, hc_post. Returns x_out."""
    t, T = b.tiles, b.T
    attn_out = o_proj(b, packed, p.wo_a, p.wo_b, p.wo_b_scale, token_capacity=token_capacity)
    if b.tp > 1:
        attn_out = b.op("o_local_bridge", attn_out, name="hca.hca_output_bridge", tile=[t.T_TILE],
                        blocks=ceildiv(T, t.T_TILE), **b.clamp(T, t.T_TILE))
    return hc_post(b, attn_out, p.x_hc, pre)

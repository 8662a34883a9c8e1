"""decode-csa: the CSA decode layer (ratio 4; even layers ≥ 2), dspark-model.md §3.1, §3.4, §3.5; dsv4-math §4-§6, §10.

Stages, in the seed's *before* structure (node = `<block>.<seed stage>`):
  shared prefix (hc.*, attn.rms_norm, attn.late_dep, qkv.*)
  2'/2''  csa.csa_rope_step (indexer step rows at each request's first position) → csa.rope_interleave.step;
          csa.csa_cmp_rope (rows at the entry pooled this step, r·j) → csa.rope_interleave.cmp
  5       csa.csa_cache_writeback                       kv → kv_cache (in place)
  6       cmp.kv_score_proj → cmp.scatter_softmax_pool → cmp.rmsnorm_rope_cache_write      main r=4 compressor
  7a-f    idx.idx_qr_proj_matmul → idx.idx_qr_proj_dequant → idx.qr_rope_swap_idx → idx.qr_rope →
          idx.qr_hadamard_matmul → idx.qr_hadamard_quant                                  indexer q side
  7g-h    idx.weights_proj → idx.weights_proj_reduce                                      head weights
  7i      icmp.kv_score_proj → icmp.scatter_softmax_pool → icmp.rmsnorm_rope → icmp.kv_hadamard →
          icmp.kv_and_cache_write                                                         inner C8 compressor
  7j-k    idx.score → idx.topk                     (the pair the `topk-bypass` pass replaces by idx_topk_bounded)
  8a-e    csa.kv_touch → csa.csa_slots_build_valid_qk_plan → csa.qk_pv; csa.rope_cs; csa.merge_norm
  9-13    O path (o.*), csa.csa_o_local_bridge (TP > 1), hc.hc_post
Returns x_out and the updated kv_cache, cmp_kv, cmp_state, idx_kv_cache, idx_kv_scale, idx_cmp_state.
Early-resolve hints (`aer`) are the studied snapshot's (pypto-lib 634e77bd) less the six pypto-lib #915 added
(cmp.rmsnorm_rope_cache_write, idx.weights_proj_reduce, icmp.kv_and_cache_write, csa.kv_touch, csa.qk_pv,
csa.rope_cs): the `early-resolve-csa-producers` pass adds them, and the seed cases run it on both sides (the base
had #915), as they do deterministic-split-k for #982.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..dims import ceildiv
from ..graph import Value
from .builder import GraphBuilder
from .common import AttnParams, attention_params, attention_prefix, compressor_params, hc_post, o_proj
from .cp_payload import AUX_WORKERS, CompressorGathers

RMS_PAD_TILE = 16  # seed literal: the compressor finish stages run ceil(B/16) blocks of 16 requests


def finish_tiles(b: GraphBuilder) -> dict:
    """tile / blocks of the compressor finish stages: ceil(B/16) blocks of RMS_PAD_TILE requests (clamped tail)."""
    return dict(tile=[RMS_PAD_TILE], blocks=ceildiv(b.B, RMS_PAD_TILE), **b.clamp(b.B, RMS_PAD_TILE))


def max_visible_entries(b: GraphBuilder, ratio: int, table_blocks: int, max_context: int | None) -> int:
    """Static bound on the compressed entries a token can see: min(max_pos // r, table pages · BS, ctx // r)."""
    ctx = b.geo.ctx_cap if max_context is None else min(max_context, b.geo.ctx_cap)
    return min(b.cfg.max_pos // ratio, table_blocks * b.cfg.block_size, ctx // ratio)


def live_qk_blocks(window: int, topk: int, max_visible: int, k_tile: int) -> dict:
    """`live_blocks` of csa.qk_pv when the context bound leaves blocks that can hold no valid row: the top-k list
    has at most min(topk, max_visible) valid (leading) entries, so only the first ceil((window + that) / k_tile)
    blocks of [window | top-k] are live (upstream runs the non-empty blocks of its valid-block mask). {} when
    every block is."""
    live = -(-(window + min(topk, max_visible)) // k_tile)
    return {} if live >= (window + topk) // k_tile else {"live_blocks": max(1, live)}


def compressor(b: GraphBuilder, block: str, x_normed, late, wkv, wgate, ape, state, state_table, positions, *,
               ratio: int, head_dim: int, overlap: bool, out_tile: int, payload=None, pool_aer: bool = False):
    """kv_score_proj (after late_dep) → scatter_softmax_pool (in place on the ring state): (state', pooled).
    `payload`: (values, scores) → (values, scores), what the projections go through before the pool (at TP > 1
    the CP all-gather of the seed's base, layers/cp_payload.py). `pool_aer`: the pool allows early resolve (the
    indexer compressor's does upstream, decode_indexer_compressor.py; the ratio-4 and ratio-128 ones do not)."""
    c, t = b.cfg, b.tiles
    out = (2 if overlap else 1) * head_dim
    kvp, scp = b.op("cmp_kv_score_proj", x_normed, wkv, wgate, names=[f"{block}.kv_score_proj",
                                                                      f"{block}.kv_score_proj.score"],
                    tile=[t.MM_B_TILE, out_tile, t.CMP_K_TILE], blocks=ceildiv(b.T, t.MM_B_TILE) * (out // out_tile),
                    deps=[late], **b.clamp(b.T, t.MM_B_TILE))
    if payload is not None:
        kvp, scp = payload(kvp, scp)
    return b.op("cmp_scatter_softmax_pool", kvp, scp, ape, state, state_table, positions,
                names=[f"{block}.scatter_softmax_pool", f"{block}.scatter_softmax_pool.pooled"], ratio=ratio,
                head_dim=head_dim, overlap=overlap, block_size=c.block_size, seq=c.seq, blocks=1,
                aer=pool_aer or None)


def request_rope(b: GraphBuilder, block: str, gather_stage: str, interleave_name: str, rope_cos, rope_sin,
                 positions, *, at: str, ratio: int = 1):
    """Per-request RoPE rows at `at` (first position / entry boundary) → interleaved (cos_il, sin_signed) [B, R]."""
    c = b.cfg
    cos, sin = b.op("rope_gather_rows", rope_cos, rope_sin, positions, names=[f"{block}.{gather_stage}",
                                                                              f"{block}.{gather_stage}.sin"],
                    at=at, seq=c.seq, ratio=ratio, batch=b.B, blocks=1)
    return b.op("rope_interleave", cos, sin, names=[interleave_name, f"{interleave_name}.sin"], blocks=1, aer=True)


@dataclass
class IndexerParams:
    """The CSA indexer's parameters (idx_*; names = goldens.inputs keys): its query side and head weights, the
    Hadamard both sides share, and its inner C8 compressor with the int8 cache it writes."""
    wq_b: Value
    wq_b_scale: Value
    weights_proj: Value
    hadamard: Value
    cmp_wkv: Value
    cmp_wgate: Value
    cmp_ape: Value
    cmp_norm_w: Value
    kv_cache: Value             # inout, with kv_scale
    kv_scale: Value
    block_table: Value
    slot_mapping: Value
    cmp_state: Value            # inout
    cmp_state_block_table: Value


def indexer_params(b: GraphBuilder, *, cmp_rows, state_rows, requests, blocks: int,
                   state_blocks: int) -> IndexerParams:
    """Declare the indexer's inputs: its cache and state have the main compressor's rows and tables' shapes."""
    c, IHD = b.cfg, b.cfg.idx_head_dim
    p = b.param
    return IndexerParams(
        wq_b=p("idx_wq_b", "i8", [c.q_lora, c.idx_heads * IHD]),
        wq_b_scale=p("idx_wq_b_scale", "f32", [c.idx_heads * IHD]),
        weights_proj=p("idx_weights_proj", "bf16", [c.hidden, c.idx_heads]),
        hadamard=p("idx_hadamard", "bf16", [IHD, IHD]),
        cmp_wkv=p("idx_cmp_wkv", "bf16", [2 * IHD, c.hidden]),
        cmp_wgate=p("idx_cmp_wgate", "bf16", [2 * IHD, c.hidden]),
        cmp_ape=p("idx_cmp_ape", "f32", [c.csa_ratio, 2 * IHD]),
        cmp_norm_w=p("idx_cmp_norm_w", "bf16", [IHD]),
        kv_cache=p("idx_kv_cache", "i8", [cmp_rows, IHD], inout=True),
        kv_scale=p("idx_kv_scale", "f32", [cmp_rows], inout=True),
        block_table=p("idx_block_table", "i32", [requests, blocks]),
        slot_mapping=p("idx_slot_mapping", "i32", [b.T]),
        cmp_state=p("idx_cmp_state", "f32", [state_rows, 4 * IHD], inout=True),
        cmp_state_block_table=p("idx_cmp_state_block_table", "i32", [requests, state_blocks]),
    )


def build_csa(b: GraphBuilder, *, max_context: int | None = None, token_capacity: int | None = None) -> None:
    """max_context: an upper bound on kv_seq_len the caller guarantees (default: the cache capacity). It tightens
    `max_visible` on idx.score / idx.topk (the fact the topk-bypass pass checks; idx.score then reads only the
    pages below it, idx.topk sorts only max(k, max_visible) entries) and, when blocks of csa.qk_pv can hold no
    valid row, sets its `live_blocks` (the partials, and so the merge, cover only those blocks). Beyond the cache
    capacity (FLASH 8K) the caches and the indexer's score_len grow to hold it (GraphBuilder.set_context).
    token_capacity: the seed's TP1 token capacity (LOCAL_T) when the step holds fewer tokens (rows mostly
    padding): the O projection's proj_b then covers the padded rows as before pypto-lib #1226 (default: T)."""
    b.set_context(max_context)
    c, t, geo = b.cfg, b.tiles, b.geo
    T, B, HD, IHD, r = b.T, b.B, c.head_dim, c.idx_head_dim, c.csa_ratio
    p = attention_params(b)
    cmp_rows = b.bind("CMP", geo.rows(geo.csa_blocks))
    state_rows = b.bind("STATE", geo.rows(geo.csa_state_blocks))
    cmp = compressor_params(b, ratio=r, overlap=True, cmp_rows=cmp_rows, state_rows=state_rows, requests=B,
                            blocks=geo.csa_blocks, state_blocks=geo.csa_state_blocks)
    idx = indexer_params(b, cmp_rows=cmp_rows, state_rows=state_rows, requests=B, blocks=geo.csa_blocks,
                         state_blocks=geo.csa_state_blocks)

    pre, x_normed, late, qkv = attention_prefix(b, p)

    # 2'/2'': per-request RoPE rows (indexer step rows; compressed-entry rows shared by both compressors)
    step_cos, step_sin = request_rope(b, "csa", "csa_rope_step", "csa.rope_interleave.step", p.rope_cos, p.rope_sin,
                                      p.positions, at="first")
    ent_cos, ent_sin = request_rope(b, "csa", "csa_cmp_rope", "csa.rope_interleave.cmp", p.rope_cos, p.rope_sin,
                                    p.positions, at="boundary", ratio=r)

    # 5: original-KV cache writeback (at TP > 1 of the kv rows the aux all-gather carries: after it, as in the seed)
    def cache_writeback(kv):
        return b.op("kv_cache_writeback", kv, p.kv_cache, p.swa_slot_mapping, name="csa.csa_cache_writeback",
                    tile=[t.T_TILE], blocks=ceildiv(T, t.T_TILE), **b.clamp(T, t.T_TILE))
    cp = CompressorGathers(b)      # the seed base's CP all-gathers of the compressor payloads (TP > 1)
    kv_cache = cache_writeback(qkv.kv) if b.tp == 1 else None

    # 6: main ratio-4 compressor
    fin = finish_tiles(b)
    cmp_state, pooled = compressor(b, "cmp", x_normed, late, cmp.wkv, cmp.wgate, cmp.ape, cmp.state,
                                   cmp.state_block_table, p.positions, ratio=r, head_dim=HD, overlap=True,
                                   out_tile=t.CMP_OUT_TILE, payload=cp.payload("cp.csa_main_allgather"))
    cmp_kv = b.op("cmp_rmsnorm_rope_cache_write", pooled, cmp.norm_w, ent_cos, ent_sin, cmp.kv, cmp.slot_mapping,
                  p.positions, name="cmp.rmsnorm_rope_cache_write", ratio=r, seq=c.seq, eps=c.rms_eps,
                  **fin)

    # 7a-f: indexer query side (reuses qr / qr_scale of qkv_proj_rope)
    n_idx = c.idx_heads * IHD
    rows_idx = ceildiv(T, t.MM_ROW_TILE)
    acc = b.op("matmul", qkv.qr, idx.wq_b, name="idx.idx_qr_proj_matmul", out="i32",
               tile=[t.MM_ROW_TILE, t.Q_OUT_TILE, c.q_lora], blocks=rows_idx * (n_idx // t.Q_OUT_TILE), aer=True,
               **b.clamp(T, t.MM_ROW_TILE))
    q_idx = b.op("idx_qr_dequant", acc, qkv.qr_scale, idx.wq_b_scale, name="idx.idx_qr_proj_dequant",
                 heads=c.idx_heads, tile=[t.DEQUANT_T_TILE, t.Q_OUT_TILE], blocks=n_idx // t.Q_OUT_TILE, aer=True,
                 **b.clamp(T, t.DEQUANT_T_TILE))
    swap = b.op("rope_swap_idx", name="idx.qr_rope_swap_idx", rope_dim=c.rope_dim, blocks=1, aer=True)
    head_rows = T * c.idx_heads
    q_idx = b.op("idx_qr_rope", q_idx, step_cos, step_sin, swap, name="idx.qr_rope", seq=c.seq,
                 tile=[t.ROPE_ROW_TILE], blocks=ceildiv(head_rows, t.ROPE_ROW_TILE), aer=True,
                 **b.clamp(head_rows, t.ROPE_ROW_TILE))
    q_had = b.op("idx_hadamard_matmul", q_idx, idx.hadamard, name="idx.qr_hadamard_matmul", tile=[t.QH_MM_TILE],
                 blocks=ceildiv(head_rows, t.QH_MM_TILE), aer=True, **b.clamp(head_rows, t.QH_MM_TILE))
    q_i8, q_scale = b.op("idx_q_quant", q_had, names=["idx.qr_hadamard_quant", "idx.qr_hadamard_quant.scale"],
                         tile=[t.QH_QUANT_TILE], blocks=ceildiv(head_rows, t.QH_QUANT_TILE), aer=True,
                         **b.clamp(head_rows, t.QH_QUANT_TILE))

    # 7g-h: head weights, K-split partials + ascending reduce
    partials = b.op("idx_weights_proj", x_normed, idx.weights_proj, name="idx.weights_proj", k_split=t.WEIGHTS_OK,
                    tile=[t.MM_ROW_TILE, c.hidden // t.WEIGHTS_OK], blocks=rows_idx * t.WEIGHTS_OK, deps=[late],
                    **b.clamp(T, t.MM_ROW_TILE))
    weights = b.op("idx_weights_reduce", partials, name="idx.weights_proj_reduce", scale=c.index_weights_scale,
                   tile=[t.MM_ROW_TILE], blocks=rows_idx, **b.clamp(T, t.MM_ROW_TILE))

    # 7i: inner C8 compressor → idx_kv_cache / idx_kv_scale
    idx_cmp_state, ipooled = compressor(b, "icmp", x_normed, late, idx.cmp_wkv, idx.cmp_wgate, idx.cmp_ape,
                                        idx.cmp_state, idx.cmp_state_block_table, p.positions, ratio=r,
                                        head_dim=IHD, overlap=True, out_tile=max(1, t.CMP_OUT_TILE // 2), pool_aer=True,
                                        payload=cp.payload("cp.csa_aux_allgather", kv=qkv.kv, workers=AUX_WORKERS))
    if kv_cache is None:
        kv_cache = cache_writeback(cp.kv)
    y = b.op("cmp_rmsnorm_rope", ipooled, idx.cmp_norm_w, ent_cos, ent_sin, name="icmp.rmsnorm_rope",
             eps=c.rms_eps, **fin)
    k = b.op("cmp_kv_hadamard", y, idx.hadamard, name="icmp.kv_hadamard", **fin)
    idx_kv_cache, idx_kv_scale = b.op("idx_kv_cache_write", k, idx.kv_cache, idx.kv_scale, idx.slot_mapping,
                                      p.positions, names=["icmp.kv_and_cache_write",
                                                          "icmp.kv_and_cache_write.scale"],
                                      ratio=r, seq=c.seq, **fin)

    # 7j-k: score and top-k
    max_visible = max_visible_entries(b, r, geo.csa_blocks, max_context)
    vis = dict(ratio=r, seq=c.seq, score_len=c.score_len, max_visible=max_visible)
    score = b.op("idx_score", q_i8, q_scale, weights, idx_kv_cache, idx_kv_scale, idx.block_table, p.positions,
                 p.kv_seq_len, name="idx.score", block_size=c.block_size,
                 tile=[1, c.score_len // t.REDUCE_NSPLIT], blocks=T * t.REDUCE_NSPLIT, aer=True, **vis)
    topk = b.op("idx_topk", score, p.positions, p.kv_seq_len, name="idx.topk", k=c.idx_topk, tile=[1], blocks=T,
                aer=True, **vis)

    # 8a-e: sparse attention over window + masked top-k
    kv_cache = b.op("kv_touch", kv_cache, name="csa.kv_touch", blocks=1)
    cmp_idx, _mask, bias, order = b.op(
        "csa_slots_build_valid_qk_plan", topk, p.positions, cmp.block_table, p.swa_indices,
        names=["csa.csa_slots_build_valid_qk_plan", "csa.valid_block_mask", "csa.sparse_bias", "csa.qk_order"],
        ratio=r, seq=c.seq, block_size=c.block_size, idx_topk=c.idx_topk, k_tile=t.ATTN_K_TILE,
        tile=[t.BIAS_T_TILE], blocks=1, aer=True, **b.clamp(T, t.BIAS_T_TILE))
    packed = csa_attention(b, p, qkv.q, kv_cache, cmp_kv, cmp_idx, bias, order, max_visible=max_visible)

    # 9-13: O path, bridge, hc_post
    x_out = csa_output(b, p, packed, pre, token_capacity=token_capacity)
    b.ret(x_out=x_out, kv_cache=kv_cache, cmp_kv=cmp_kv, cmp_state=cmp_state, idx_kv_cache=idx_kv_cache,
          idx_kv_scale=idx_kv_scale, idx_cmp_state=idx_cmp_state)


def csa_attention(b: GraphBuilder, p: AttnParams, q: Value, kv_cache: Value, cmp_kv: Value, cmp_idx: Value,
                  bias: Value, order: Value, *, max_visible: int) -> Value:
    """Stages 8c-e of the CSA attention (decode, and prefill's chunk as one request), after the plan: qk_pv over
    the window and the selected compressed rows (`max_visible` bounds the live blocks), the RoPE rows, the merge
    with the sink, inverse RoPE and group pack. Returns the packed attention output."""
    c, t = b.cfg, b.tiles
    m, l, o = b.op("csa_qk_pv", q, kv_cache, p.swa_indices, cmp_kv, cmp_idx, bias, order,
                   names=["csa.qk_pv", "csa.qk_pv.l", "csa.qk_pv.o"], scale=c.softmax_scale,
                   k_tile=t.ATTN_K_TILE, tile=[1, t.H_TILE], blocks=t.NUM_QK_CORES, workers=t.NUM_QK_CORES,
                   **live_qk_blocks(c.window, c.idx_topk, max_visible, t.ATTN_K_TILE))
    cos_il, sin_signed = b.op("rope_tables", p.rope_cos, p.rope_sin, p.positions,
                              names=["csa.rope_cs", "csa.rope_cs.sin"], rope_dim=c.rope_dim, blocks=1)
    return b.op("csa_merge_norm", m, l, o, p.attn_sink, cos_il, sin_signed, name="csa.merge_norm",
                o_groups=c.o_groups, tile=[t.H_TILE], blocks=b.T * ceildiv(c.heads, t.H_TILE))


def csa_output(b: GraphBuilder, p: AttnParams, packed: Value, pre, token_capacity: int | None = None) -> Value:
    """Stages 9-13: the O path, the output bridge at TP > 1, hc_post. Returns x_out."""
    t, T = b.tiles, b.T
    attn_out = o_proj(b, packed, p.wo_a, p.wo_b, p.wo_b_scale, token_capacity=token_capacity)
    if b.tp > 1:
        attn_out = b.op("o_local_bridge", attn_out, name="csa.csa_o_local_bridge", tile=[t.T_TILE],
                        blocks=ceildiv(T, t.T_TILE), **b.clamp(T, t.T_TILE))
    return hc_post(b, attn_out, p.x_hc, pre)

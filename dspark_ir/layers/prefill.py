"""prefill-swa, prefill-hca: one request's prompt chunk through an attention layer (upstream prefill_swa.py,
prefill_hca.py, prefill_compressor_ratio128.py; dsv4-math §4 and §6 "prefill"; goldens/prefill.py).

The chunk: `chunk` tokens per rank (the graph's T) at position `start` (earlier chunks already in the caches).
At TP > 1 the form is context-parallel: the request's tp·chunk tokens are split rank-major, x_normed, positions
and the slot mappings are all-gathered over the group (cp_allgather + read-back), the KV side (kv projection,
cache rows, compressor) runs on the group's rows into every rank's replica of the request's caches, and each
rank attends its own queries; the O path is the TP one. The graph's config is the layer config with
batch = chunk, seq = 1 (T = chunk one-token rows; `goldens.prefill.chunk_config`); the request's caches are
declared by `goldens.config.prefill_geometry` (tables [1, pages]).

prefill-swa: the decode-swa graph on these parameters (its window attention is the prefill one: the compacted
valid window is one tile), every gathered slot written (no own-rows mask).
prefill-hca: shared prefix → kv write-back → r = R compressor over the chunk (cmp.kv_score_proj →
cmp.prefill_pool: EVERY boundary of the chunk pools its entry → cmp.prefill_finish_write) → the decode HCA
attention (raw window stream + compressed work items over the request's entries 0 … (pos+1)//R − 1) → O → hc_post.
"""
from __future__ import annotations

from dataclasses import dataclass

from goldens.config import prefill_geometry, prefill_score_len

from ..dims import ceildiv
from ..errors import ConfigError
from ..graph import Value
from ..ops.indexer import SEED_PREFILL_SORT_STAGES
from .builder import GraphBuilder
from .common import (
    AttnParams,
    attention_params,
    attention_prefix,
    attn_norm,
    compressor_params,
    cp_gather,
    hc_pre,
    qkv_proj_rope,
)
from .csa import csa_attention, csa_output, indexer_params
from .hca import hca_attention, hca_output
from .swa import swa_layer

MAX_CHUNK = 8192      # tokens per rank (the range; the prefill indexer caps at 8192 raw tokens)
DEFAULT_CHUNK = 512   # upstream PREFILL_SEQ


def prefill_setup(b: GraphBuilder, kind: str, chunk: int, start: int) -> dict[str, int]:
    """Rebind the builder to the chunk (T = B = chunk, S = 1) and return the request's cache geometry."""
    if not 1 <= chunk <= MAX_CHUNK:
        raise ConfigError(f"chunk: {chunk} tokens per rank is outside 1 … {MAX_CHUNK}")
    if start < 0:
        raise ConfigError(f"start: the chunk's first position must be non-negative, got {start}")
    b.cfg = b.cfg.with_(seq=1, batch=chunk)
    b.graph.symbols.update(T=chunk, B=chunk, S=1)
    b.graph.attributes["start"] = int(start)
    return prefill_geometry(kind, b.cfg, chunk, start)


def build_prefill_swa(b: GraphBuilder, *, chunk: int = DEFAULT_CHUNK, start: int = 0) -> None:
    """chunk: tokens per rank; start: the chunk's first position."""
    geo = prefill_setup(b, "prefill_swa", chunk, start)
    swa_layer(b, attention_params(b, geo), own_rows=False)


def build_prefill_hca(b: GraphBuilder, *, chunk: int = DEFAULT_CHUNK, start: int = 0) -> None:
    """chunk: tokens per rank; start: the chunk's first position."""
    geo = prefill_setup(b, "prefill_hca", chunk, start)
    c, t = b.cfg, b.tiles
    HD, R, bs = c.head_dim, c.hca_ratio, c.block_size
    p = attention_params(b, geo)
    cmp = compressor_params(b, ratio=R, overlap=False, cmp_rows=b.bind("CMP", (geo["cmp_blocks"] + 1) * bs),
                            state_rows=b.bind("STATE", geo["state_blocks"] * bs), requests=1,
                            blocks=geo["cmp_blocks"], state_blocks=geo["state_blocks"])

    pre, late, qkv, group = _prefix(b, p, cmp.slot_mapping)
    kv_cache = b.op("kv_cache_writeback", qkv.kv, p.kv_cache, group.slots, name="hca.hca_cache_writeback",
                    tile=[t.T_TILE], blocks=ceildiv(group.rows, t.T_TILE), **b.clamp(group.rows, t.T_TILE))
    cmp_state, pooled = _prefill_pool(b, "cmp", group, late, cmp.wkv, cmp.wgate, cmp.ape, cmp.state,
                                      cmp.state_block_table, head_dim=HD, overlap=False, out_tile=t.CMP_OUT_TILE)
    cmp_kv = b.op("prefill_cmp_finish_write", pooled, cmp.norm_w, p.rope_cos, p.rope_sin, cmp.kv,
                  group.cmp_slots, group.positions, name="cmp.prefill_finish_write", ratio=R, eps=c.rms_eps,
                  blocks=1)
    ready = b.op("join", name="hca.cache_ready_dep", deps=[kv_cache, cmp_kv])

    # the decode HCA attention, the chunk as one request (seq = chunk) over its entries 0 … (pos+1)//R − 1
    work_rows = t.CMP_PAGES_PER_WORK * bs
    entries = (start + b.tp * chunk) // R
    works = max(1, -(-entries // work_rows))
    packed = hca_attention(b, p, qkv.q, kv_cache, cmp_kv, cmp.block_table, ready, work_rows=work_rows, works=works,
                           gather_blocks=works, seq=chunk, max_rows=max(1, entries))
    x_out = hca_output(b, p, packed, pre)
    b.ret(x_out=x_out, kv_cache=kv_cache, cmp_kv=cmp_kv, cmp_state=cmp_state)


@dataclass
class _Group:
    """The KV side's rows: this rank's (TP1) or the TP group's gathered ones (context-parallel)."""
    x: Value               # x_normed of the KV side's rows
    x_local: Value         # this rank's x_normed
    positions: Value
    slots: Value           # swa_slot_mapping
    cmp_slots: Value
    idx_slots: Value | None
    rows: object           # the row count (a dim)


def _prefix(b: GraphBuilder, p: AttnParams, cmp_slot_mapping, idx_slot_mapping=None):
    """hc_pre → rms_norm → qkv; at TP > 1 the group's positions, slot mappings and x_normed gathered first (one
    collective order on every rank) and the KV side on the gathered rows. Returns (pre, late, qkv, group)."""
    if b.tp == 1:
        pre, x_normed, late, qkv = attention_prefix(b, p)
        return pre, late, qkv, _Group(x_normed, x_normed, p.positions, p.swa_slot_mapping, cmp_slot_mapping,
                                      idx_slot_mapping, b.T)
    pre = hc_pre(b, p.x_hc, p.hc_fn, p.hc_scale, p.hc_base)
    anchor = b.graph.nodes["hc.hc_pre_rms"].result
    pos_group = cp_gather(b, p.positions, "cp.positions_allgather", after=anchor)
    slots_group = cp_gather(b, p.swa_slot_mapping, "cp.slot_mapping_allgather", after=pos_group)
    cmp_group = cp_gather(b, cmp_slot_mapping, "cp.cmp_slot_mapping_allgather", after=slots_group)
    last, idx_group = cmp_group, None
    if idx_slot_mapping is not None:
        idx_group = last = cp_gather(b, idx_slot_mapping, "cp.idx_slot_mapping_allgather", after=cmp_group)
    x_normed, late = attn_norm(b, pre.x_mixed, p.norm_w)
    x_group = cp_gather(b, x_normed, "cp.x_normed_allgather", after=last)
    qkv = qkv_proj_rope(b, x_normed, late, p.wq_a, p.gamma_cq, p.wq_b, p.wq_b_scale, p.wkv, p.gamma_ckv,
                        p.rope_cos, p.rope_sin, p.positions, kv_x=x_group, kv_positions=pos_group)
    return pre, late, qkv, _Group(x_group, x_normed, pos_group, slots_group, cmp_group, idx_group, b.tp * b.T)


def build_prefill_csa(b: GraphBuilder, *, chunk: int = DEFAULT_CHUNK, start: int = 0) -> None:
    """chunk: tokens per rank; start: the chunk's first position. The indexer's top-k is `idx_topk` with the
    seed's staged sort (SEED_PREFILL_SORT_STAGES, widest 256: wrong keys once a token sees more than 256 entries;
    the topk-merge-stage pass adds the 1024 stage)."""
    geo = prefill_setup(b, "prefill_csa", chunk, start)
    c, t = b.cfg, b.tiles
    T, HD, IHD, r, bs = b.T, c.head_dim, c.idx_head_dim, c.csa_ratio, c.block_size
    p = attention_params(b, geo)
    cmp_rows = b.bind("CMP", (geo["cmp_blocks"] + 1) * bs)
    state_rows = b.bind("STATE", geo["state_blocks"] * bs)
    cmp = compressor_params(b, ratio=r, overlap=True, cmp_rows=cmp_rows, state_rows=state_rows, requests=1,
                            blocks=geo["cmp_blocks"], state_blocks=geo["state_blocks"])
    idx = indexer_params(b, cmp_rows=cmp_rows, state_rows=state_rows, requests=1, blocks=geo["cmp_blocks"],
                         state_blocks=geo["state_blocks"])

    pre, late, qkv, group = _prefix(b, p, cmp.slot_mapping, idx.slot_mapping)
    kv_cache = b.op("kv_cache_writeback", qkv.kv, p.kv_cache, group.slots, name="csa.csa_cache_writeback",
                    tile=[t.T_TILE], blocks=ceildiv(group.rows, t.T_TILE), **b.clamp(group.rows, t.T_TILE))
    # main ratio-4 compressor: every boundary of the group's chunk
    cmp_state, pooled = _prefill_pool(b, "cmp", group, late, cmp.wkv, cmp.wgate, cmp.ape, cmp.state,
                                      cmp.state_block_table, head_dim=HD, overlap=True, out_tile=t.CMP_OUT_TILE)
    cmp_kv = b.op("prefill_cmp_finish_write", pooled, cmp.norm_w, p.rope_cos, p.rope_sin, cmp.kv,
                  group.cmp_slots, group.positions, name="cmp.prefill_finish_write", ratio=r, eps=c.rms_eps,
                  blocks=1)
    # indexer inner C8 compressor: every boundary → rmsnorm + RoPE at the entry (one-token rows, seq 1) → Hadamard
    # → int8 cache rows
    idx_cmp_state, ipooled = _prefill_pool(b, "icmp", group, late, idx.cmp_wkv, idx.cmp_wgate, idx.cmp_ape,
                                           idx.cmp_state, idx.cmp_state_block_table, head_dim=IHD, overlap=True,
                                           out_tile=max(1, t.CMP_OUT_TILE // 2))
    ent_cos, ent_sin = b.op("rope_gather_rows", p.rope_cos, p.rope_sin, group.positions,
                            names=["icmp.entry_rope_rows", "icmp.entry_rope_rows.sin"], at="boundary", seq=1,
                            ratio=r, batch=group.rows, blocks=1)
    ent_cos, ent_sin = b.op("rope_interleave", ent_cos, ent_sin,
                            names=["icmp.rope_interleave", "icmp.rope_interleave.sin"], blocks=1)
    y = b.op("cmp_rmsnorm_rope", ipooled, idx.cmp_norm_w, ent_cos, ent_sin, name="icmp.rmsnorm_rope",
             eps=c.rms_eps, blocks=1)
    k = b.op("cmp_kv_hadamard", y, idx.hadamard, name="icmp.kv_hadamard", blocks=1)
    idx_kv_cache, idx_kv_scale = b.op("idx_kv_cache_write", k, idx.kv_cache, idx.kv_scale, group.idx_slots,
                                      group.positions, names=["icmp.kv_and_cache_write",
                                                              "icmp.kv_and_cache_write.scale"],
                                      ratio=r, seq=1, blocks=1)
    # indexer query side at each token's own position (seq 1), head weights
    n_idx = c.idx_heads * IHD
    rows_idx = ceildiv(T, t.MM_ROW_TILE)
    acc = b.op("matmul", qkv.qr, idx.wq_b, name="idx.idx_qr_proj_matmul", out="i32",
               tile=[t.MM_ROW_TILE, t.Q_OUT_TILE, c.q_lora], blocks=rows_idx * (n_idx // t.Q_OUT_TILE),
               **b.clamp(T, t.MM_ROW_TILE))
    q_idx = b.op("idx_qr_dequant", acc, qkv.qr_scale, idx.wq_b_scale, name="idx.idx_qr_proj_dequant",
                 heads=c.idx_heads, tile=[t.DEQUANT_T_TILE, t.Q_OUT_TILE], blocks=n_idx // t.Q_OUT_TILE,
                 **b.clamp(T, t.DEQUANT_T_TILE))
    swap = b.op("rope_swap_idx", name="idx.qr_rope_swap_idx", rope_dim=c.rope_dim, blocks=1)
    tok_cos, tok_sin = b.op("rope_tables", p.rope_cos, p.rope_sin, p.positions,
                            names=["idx.q_rope_rows", "idx.q_rope_rows.sin"], rope_dim=c.rope_dim, blocks=1)
    head_rows = T * c.idx_heads
    q_idx = b.op("idx_qr_rope", q_idx, tok_cos, tok_sin, swap, name="idx.qr_rope", seq=1,
                 tile=[t.ROPE_ROW_TILE], blocks=ceildiv(head_rows, t.ROPE_ROW_TILE),
                 **b.clamp(head_rows, t.ROPE_ROW_TILE))
    q_had = b.op("idx_hadamard_matmul", q_idx, idx.hadamard, name="idx.qr_hadamard_matmul", tile=[t.QH_MM_TILE],
                 blocks=ceildiv(head_rows, t.QH_MM_TILE), **b.clamp(head_rows, t.QH_MM_TILE))
    q_i8, q_scale = b.op("idx_q_quant", q_had, names=["idx.qr_hadamard_quant", "idx.qr_hadamard_quant.scale"],
                         tile=[t.QH_QUANT_TILE], blocks=ceildiv(head_rows, t.QH_QUANT_TILE),
                         **b.clamp(head_rows, t.QH_QUANT_TILE))
    partials = b.op("idx_weights_proj", group.x_local, idx.weights_proj, name="idx.weights_proj",
                    k_split=t.WEIGHTS_OK, tile=[t.MM_ROW_TILE, c.hidden // t.WEIGHTS_OK],
                    blocks=rows_idx * t.WEIGHTS_OK, deps=[late], **b.clamp(T, t.MM_ROW_TILE))
    weights = b.op("idx_weights_reduce", partials, name="idx.weights_proj_reduce", scale=c.index_weights_scale,
                   tile=[t.MM_ROW_TILE], blocks=rows_idx, **b.clamp(T, t.MM_ROW_TILE))
    # score over the chunk's prefix (the request: seq = chunk) and the staged top-k. The cap is the score prefix
    # (max_visible); the rows are at least k wide, as the top-k consumer reads k columns (a short flash chunk).
    score_cap = prefill_score_len(c, chunk, start)
    vis = dict(ratio=r, seq=chunk, score_len=max(score_cap, c.idx_topk), max_visible=score_cap)
    score = b.op("idx_score", q_i8, q_scale, weights, idx_kv_cache, idx_kv_scale, idx.block_table, p.positions,
                 p.kv_seq_len, name="idx.score", block_size=bs, tile=[1, vis["score_len"]], blocks=T, **vis)
    topk = b.op("idx_topk", score, p.positions, p.kv_seq_len, name="idx.topk", k=c.idx_topk,
                sort_stages=SEED_PREFILL_SORT_STAGES, tile=[1], blocks=T, **vis)
    # sparse attention over window + masked top-k (the decode CSA attention, the chunk as one request)
    cmp_idx, _mask, bias, order = b.op(
        "csa_slots_build_valid_qk_plan", topk, p.positions, cmp.block_table, p.swa_indices,
        names=["csa.csa_slots_build_valid_qk_plan", "csa.valid_block_mask", "csa.sparse_bias", "csa.qk_order"],
        ratio=r, seq=chunk, block_size=bs, idx_topk=c.idx_topk, k_tile=t.ATTN_K_TILE, blocks=1, deps=[cmp_kv])
    packed = csa_attention(b, p, qkv.q, kv_cache, cmp_kv, cmp_idx, bias, order, max_visible=score_cap)
    x_out = csa_output(b, p, packed, pre)
    b.ret(x_out=x_out, kv_cache=kv_cache, cmp_kv=cmp_kv, cmp_state=cmp_state, idx_kv_cache=idx_kv_cache,
          idx_kv_scale=idx_kv_scale, idx_cmp_state=idx_cmp_state)


def _prefill_pool(b: GraphBuilder, block: str, group, late, wkv, wgate, ape, state, table, *, head_dim: int,
                  overlap: bool, out_tile: int):
    """kv_score_proj over the group's rows (after late_dep) → prefill_cmp_pool: (state', pooled [rows, HD])."""
    c, t = b.cfg, b.tiles
    ratio = c.csa_ratio if overlap else c.hca_ratio
    out = (2 if overlap else 1) * head_dim
    kvp, scp = b.op("cmp_kv_score_proj", group.x, wkv, wgate,
                    names=[f"{block}.kv_score_proj", f"{block}.kv_score_proj.score"],
                    tile=[t.MM_B_TILE, out_tile, t.CMP_K_TILE],
                    blocks=ceildiv(group.rows, t.MM_B_TILE) * (out // out_tile), deps=[late],
                    **b.clamp(group.rows, t.MM_B_TILE))
    return b.op("prefill_cmp_pool", kvp, scp, ape, state, table, group.positions,
                names=[f"{block}.prefill_pool", f"{block}.prefill_pool.pooled"], ratio=ratio, head_dim=head_dim,
                overlap=overlap, block_size=c.block_size, blocks=1)

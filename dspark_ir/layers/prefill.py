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

from goldens.config import prefill_geometry

from ..dims import ceildiv
from ..errors import ConfigError
from .builder import GraphBuilder
from .common import AttnParams, attention_params, attention_prefix, attn_norm, cp_gather, hc_post, hc_pre, o_proj
from .common import qkv_proj_rope
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
    T, HD, R, bs = b.T, c.head_dim, c.hca_ratio, c.block_size
    p = attention_params(b, geo)
    par = b.param
    cmp_wkv = par("cmp_wkv", "bf16", [HD, c.hidden])
    cmp_wgate = par("cmp_wgate", "bf16", [HD, c.hidden])
    cmp_ape = par("cmp_ape", "f32", [R, HD])
    cmp_norm_w = par("cmp_norm_w", "bf16", [HD])
    cmp_kv = par("cmp_kv", "bf16", [b.bind("CMP", (geo["cmp_blocks"] + 1) * bs), HD], inout=True)
    cmp_block_table = par("cmp_block_table", "i32", [1, geo["cmp_blocks"]])
    cmp_slot_mapping = par("cmp_slot_mapping", "i32", [T])
    cmp_state = par("cmp_state", "f32", [b.bind("STATE", geo["state_blocks"] * bs), 2 * HD], inout=True)
    cmp_state_block_table = par("cmp_state_block_table", "i32", [1, geo["state_blocks"]])

    pre, late, qkv, group = _prefix(b, p, cmp_slot_mapping)
    kv_cache = b.op("kv_cache_writeback", qkv.kv, p.kv_cache, group.slots, name="hca.hca_cache_writeback",
                    tile=[t.T_TILE], blocks=ceildiv(group.rows, t.T_TILE), **b.clamp(group.rows, t.T_TILE))
    kvp, scp = b.op("cmp_kv_score_proj", group.x, cmp_wkv, cmp_wgate,
                    names=["cmp.kv_score_proj", "cmp.kv_score_proj.score"],
                    tile=[t.MM_B_TILE, t.CMP_OUT_TILE, t.CMP_K_TILE],
                    blocks=ceildiv(group.rows, t.MM_B_TILE) * (HD // t.CMP_OUT_TILE), deps=[late],
                    **b.clamp(group.rows, t.MM_B_TILE))
    cmp_state, pooled = b.op("prefill_cmp_pool", kvp, scp, cmp_ape, cmp_state, cmp_state_block_table,
                             group.positions, names=["cmp.prefill_pool", "cmp.prefill_pool.pooled"], ratio=R,
                             head_dim=HD, overlap=False, block_size=bs, blocks=1)
    cmp_kv = b.op("prefill_cmp_finish_write", pooled, cmp_norm_w, p.rope_cos, p.rope_sin, cmp_kv,
                  group.cmp_slots, group.positions, name="cmp.prefill_finish_write", ratio=R, eps=c.rms_eps,
                  blocks=1)
    ready = b.op("join", name="hca.cache_ready_dep", deps=[kv_cache, cmp_kv])

    # the decode HCA attention, the chunk as one request (seq = chunk) over its entries 0 … (pos+1)//R − 1
    rows = b.op("swa_gather_kv", kv_cache, p.swa_indices, name="hca.hca_gather_kv",
                tile=[c.window // t.GATHER_SPLITS], blocks=T * t.GATHER_SPLITS, deps=[ready])
    rows_t = b.op("hca_raw_transpose", rows, name="hca.hca_raw_transpose", tile=[t.RAW_K_TILE],
                  blocks=T * ceildiv(c.window, t.RAW_K_TILE))
    swap = b.op("rope_swap_idx", name="hca.rope_swap", rope_dim=c.rope_dim, blocks=1)
    cos_il, sin_signed = b.op("rope_tables", p.rope_cos, p.rope_sin, p.positions,
                              names=["hca.rope_cs", "hca.rope_cs.sin"], rope_dim=c.rope_dim, blocks=2)
    head_blocks = T * ceildiv(c.heads, t.H_TILE)
    sm, sl, sheads = b.op("hca_raw_attn", qkv.q, rows, rows_t, p.swa_indices,
                          names=["hca.hca_raw_attn", "hca.stream_state_l", "hca.stream_heads"],
                          scale=c.softmax_scale, tile=[1, t.H_TILE], blocks=head_blocks)
    work_rows = t.CMP_PAGES_PER_WORK * bs
    entries = (start + b.tp * chunk) // R
    works = max(1, -(-entries // work_rows))
    crow, cphys = b.op("hca_cmp_work_gather", cmp_kv, cmp_block_table,
                       names=["hca.hca_cmp_work_gather", "hca.hca_cmp_work_gather.phys"], block_size=bs,
                       work_rows=work_rows, works=works, blocks=works, deps=[ready])
    cm, cl, co = b.op("hca_cmp_qk_pv", qkv.q, crow, cphys, p.positions, p.kv_seq_len,
                      names=["hca.hca_cmp_qk_pv", "hca.hca_cmp_qk_pv.l", "hca.hca_cmp_qk_pv.o"],
                      scale=c.softmax_scale, ratio=R, seq=chunk, work_rows=work_rows, max_rows=max(1, entries),
                      tile=[1], blocks=T * works)
    merged = b.op("hca_stream_merge", sm, sl, sheads, cm, cl, co, p.attn_sink, name="hca.hca_stream_merge",
                  tile=[1, t.H_TILE], blocks=head_blocks)
    packed = b.op("hca_stream_pack", merged, cos_il, sin_signed, swap, name="hca.hca_stream_pack",
                  o_groups=c.o_groups, tile=[1, t.H_TILE], blocks=head_blocks)
    attn_out = o_proj(b, packed, p.wo_a, p.wo_b, p.wo_b_scale)
    if b.tp > 1:
        attn_out = b.op("o_local_bridge", attn_out, name="hca.hca_output_bridge", tile=[t.T_TILE],
                        blocks=ceildiv(T, t.T_TILE), **b.clamp(T, t.T_TILE))
    x_out = hc_post(b, attn_out, p.x_hc, pre)
    b.ret(x_out=x_out, kv_cache=kv_cache, cmp_kv=cmp_kv, cmp_state=cmp_state)


class _Group:
    """The KV side's rows: this rank's (TP1) or the TP group's gathered ones (context-parallel)."""

    def __init__(self, x, positions, slots, cmp_slots, rows):
        self.x, self.positions, self.slots, self.cmp_slots, self.rows = x, positions, slots, cmp_slots, rows


def _prefix(b: GraphBuilder, p: AttnParams, cmp_slot_mapping):
    """hc_pre → rms_norm → qkv; at TP > 1 the group's positions, slot mappings and x_normed gathered first (one
    collective order on every rank) and the KV side on the gathered rows. Returns (pre, late, qkv, group)."""
    if b.tp == 1:
        pre, x_normed, late, qkv = attention_prefix(b, p)
        return pre, late, qkv, _Group(x_normed, p.positions, p.swa_slot_mapping, cmp_slot_mapping, b.T)
    pre = hc_pre(b, p.x_hc, p.hc_fn, p.hc_scale, p.hc_base)
    anchor = b.graph.nodes["hc.hc_pre_rms"].result
    pos_group = cp_gather(b, p.positions, "cp.positions_allgather", after=anchor)
    slots_group = cp_gather(b, p.swa_slot_mapping, "cp.slot_mapping_allgather", after=pos_group)
    cmp_group = cp_gather(b, cmp_slot_mapping, "cp.cmp_slot_mapping_allgather", after=slots_group)
    x_normed, late = attn_norm(b, pre.x_mixed, p.norm_w)
    x_group = cp_gather(b, x_normed, "cp.x_normed_allgather", after=cmp_group)
    qkv = qkv_proj_rope(b, x_normed, late, p.wq_a, p.gamma_cq, p.wq_b, p.wq_b_scale, p.wkv, p.gamma_ckv,
                        p.rope_cos, p.rope_sin, p.positions, kv_x=x_group, kv_positions=pos_group)
    return pre, late, qkv, _Group(x_group, pos_group, slots_group, cmp_group, b.tp * b.T)

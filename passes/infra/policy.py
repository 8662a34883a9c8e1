"""Policy: the tiles and worker counts the DSpark passes choose, apart from the rewrites that apply them.

A pass module is the rewrite (when a site is sound, how to rewrite it, why the result is equal); which tile,
how many workers, for which config, is a choice made here once, with where it comes from. Each option of a
pass defaults to the value below, and a pipeline option overrides it for one run (`quant-workers{workers=12}`).
Facts of the chip come from `dspark_ir.hardware`; a choice that depends on the model config is a function
of the graph's `config` attribute.
"""
from __future__ import annotations

from dspark_ir.graph import Graph
from dspark_ir.hardware import HARDWARE
from dspark_ir.ops.core import Matmul
from dspark_ir.ops.qkv import KvRmsNormRope, RopeTables

# ---- topk-merge-stage -------------------------------------------------------------------------------------
TOPK_MERGE_STAGE = 1024                  # the seed's prefill fix: mrgsort(block_len = 1024) after 64 and 256
TOPK_MERGE_FAN_IN = 4                    # mrgsort merges four runs: a prefix past one stage takes the next ×4

# ---- split-m-fanout ---------------------------------------------------------------------------------------
SPLIT_M_OPS = ("kv_proj_matmul",)        # the seed PR's one under-occupied matmul
SPLIT_M_WAYS = 4                         # the seed's KV_OM: M tiles fanned out 4 ways
SPLIT_M_CORES = HARDWARE.cube_cores      # fan out only while the grid leaves cube cores idle

# ---- widen-tile -------------------------------------------------------------------------------------------
WIDEN_OPS = (KvRmsNormRope.name,)       # the seed PR's scheduling-bound row task
WIDEN_FOLLOW = (RopeTables.name,)        # its rope-row materialiser shares the token tile
WIDEN_MIN_ROWS = 16                      # the seed PR doubled KV_RMS_T_TILE 8 → 16
WIDEN_FACTOR = 2
WIDEN_MAX_UB_BYTES = HARDWARE.ub_bytes   # pypto 0.2.0 budgets one op group in the UB (notes §5)

# ---- tile-choice ------------------------------------------------------------------------------------------
TILE_CHOICE_OPS = (Matmul.name,)
TILE_CHOICE_MAX_M = 128                  # the largest M tile pypto's cube templates use (128×256 bf16 in L0A)
TILE_CHOICE_N = 128                      # the N tile the accumulator holds next to the M tile
TILE_CHOICE_MIN_GAIN = 1.25              # apply only when the modelled GM traffic drops at least this much

# ---- pool-fanout, quant-workers, dequant-workers, fuse-merge-rope-pack (later public pypto-lib forms) -----
POOL_REQUESTS = 2                        # POOL_REQUEST_TILE of decode_compressor_ratio128
QUANT_OPS = ("tp_o_a_quant",)            # the TP O path's per-group quant (the TP1 `quant` stays one block)
QUANT_WORKERS = 24                       # O_A_QUANT_WORKERS of decode_o_proj: 6 for each of 4 owners' rows
QUANT_ROWS = 8                           # QUANT_T_TILE
DEQUANT_WORKERS = HARDWARE.vector_cores  # Q_DEQUANT_WORKERS = 48 of qkv_proj_rope: one per AIV
DEQUANT_TOKEN_TILE = 8                   # the seed's Q_ROPE_T_TILE: tokens per (token, head tile) unit
MERGE_WORKERS = HARDWARE.vector_cores    # the seed's MERGE_WORKERS = 48: one per AIV
# ---- hca-merge-pack-publish ----------------------------------------------------------------------------------
ATTENTION_PUBLISH_WORKERS = HARDWARE.vector_cores   # decode_sparse_attn_hca ATTENTION_PUBLISH_WORKERS = 48
ATTENTION_PUBLISH_TOKENS = 4             # #1170: ATTENTION_PUBLISH_T_TILE 8 -> 4, the publish tile's tokens

# ---- early-resolve-csa-producers ---------------------------------------------------------------------------
# pypto-lib #915: the six CSA decode producers it marks allow_early_resolve, by their seed stage names (the
# compressor's and the indexer compressor's cache writes, the head-weight reduce, the WAR marker on kv_cache,
# the sparse attention and its inverse-RoPE tables). `rope_cs` is a stage name on purpose: the layer's other
# rope_tables task (qkv.q_rope_prepare) is the shared q side, which #915 leaves alone.
EARLY_RESOLVE_CSA_STAGES = ("rmsnorm_rope_cache_write", "weights_proj_reduce", "kv_and_cache_write", "kv_touch",
                            "qk_pv", "rope_cs")

# ---- dequant-into-owner-windows (pypto-lib #980 / #998, decode_sharded_o_projection_reduce_scatter) ----------
OWNER_PUBLISH_WORKERS = 24               # O_RS_PUBLISH_WORKERS: vector workers dequantising into the owners' windows
OWNER_REDUCE_WORKERS = 8                 # O_RS_REDUCE_WORKERS: owner-side workers summing the source lanes
OWNER_PUBLISH_SLOTS = 2                  # #998: cross_core_slot(slot_num=2) on the publish scope (#980 alone: 0)

# ---- kv-score-token-groups, hca-cmp-gather-pages, hca-attn-dual-aiv (post-seed pypto-lib PRs) ------------
KV_SCORE_TOKEN_TILES = 2                 # KV_SCORE_T_GROUP of decode_compressor_ratio128 (#1155)
CMP_GATHER_PAGES = 8                     # #1227: 8 compressed-cache pages per hca_cmp_work_gather block
HCA_ATTN_HEAD_TILE = 64                  # #1187: one 64-head matmul per query (all of a flash rank's heads)
HCA_ATTN_AIV_SPLIT = 2                   # #1187: the vector work over both AIVs of a core group
HCA_CMP_WORKERS = HARDWARE.cube_cores    # #1187: CMP on 24 workers (one per core group) instead of 16
HCA_RAW_QK_LOOKAHEAD = 2                 # #1187: QK_PRE_LAUNCH = 2, query i + 2's QK issued before query i's PV
# ---- hca-attn-workers, o-dequant-workers (the grids of the code the chip swimlane captured, pypto-lib fa5bf7e) --
HCA_RAW_WORKERS = 20                     # decode_sparse_attn_hca RAW_WORKERS: tokens w, w + 20, ... per raw worker
O_DEQUANT_WORKERS = 48                   # decode_o_proj O_RS_DEQUANT_WORKERS = 12 per owner x 4 owners: one AIV wave
O_DEQUANT_ROWS = 16                      # its ACT_T_TILE: rows per [16, 512] dequant item
# ---- hca-cmp-wide-k-tile ------------------------------------------------------------------------------------
# The compressed QK/PV K tile in rows by the graph's `config`: 128 at flash (pypto-lib #1228: CMP_ATTN_K_TILE =
# 128 at TP1, four 32-row pages with per-page masks), 16 at tiny (the tiny tiles' CMP_PAGES_PER_WORK · block_size,
# the goldens' work item); 128 for any other graph. Upstream keeps one-page tiles at TP > 1 (CMP_MAX_TP).
CMP_K_TILE_ROWS = {"flash": 128, "tiny": 16}
CMP_K_TILE_ROWS_OTHER = 128
CMP_MAX_TP = 1


def cmp_k_tile_rows(g: Graph) -> int:
    """hca_cmp_qk_pv's wide K tile (rows per work item) for this graph's config."""
    return CMP_K_TILE_ROWS.get(str(g.attributes.get("config")), CMP_K_TILE_ROWS_OTHER)


# ---- retiled-cse ------------------------------------------------------------------------------------------
RETILED_CSE_OPS = (RopeTables.name,)     # built twice per attention layer (q side, output pack); grid-independent

# ---- split-writeback-bias ---------------------------------------------------------------------------------
# Writeback row tile by the graph's `config`: 32 at flash (the later public pypto-lib version: 4 blocks at
# T = 128), 8 at tiny (2-4 blocks at T = 16-32); 32 for any other graph.
WRITEBACK_TILE_ROWS = {"flash": 32, "tiny": 8}
WRITEBACK_TILE_ROWS_OTHER = 32


def writeback_tile_rows(g: Graph) -> int:
    """The SWA cache writeback's row tile for this graph's config."""
    return WRITEBACK_TILE_ROWS.get(str(g.attributes.get("config")), WRITEBACK_TILE_ROWS_OTHER)

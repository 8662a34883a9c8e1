"""Model configurations, tile constants, cache geometry and the layer sequence.

Field names are the contract of docs/design.md ("Configs"). Values: FLASH from dspark-model.md §2.1, TINY from
§2.2 (ours, not upstream). Tiles from dspark-model.md §3.1-§3.4.

TINY notes:
* TINY is valid at tp = 1, 2 (default) and 4 without changing any value: o_groups = 4 is divisible by 4 and
  decode_batch = 8 gives B = 2 requests per rank at TP4 (T = 8, T_PAD = 16).
* TINY keeps FLASH's RoPE profiles (θ 1e4 / 1.6e5, YaRN factor 16 over 65 536, β 32/1). With rope_dim = 16 the
  YaRN ramp runs from i = 3 to i = 7, so the compress profile really differs from the plain one.
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass


class ConfigError(ValueError):
    """An invalid configuration. The one-line message starts with the offending field."""


@dataclass(frozen=True)
class ModelConfig:
    """One model/deployment configuration (dspark-model.md §2). Build with `config_by_name`, vary with `with_`."""

    name: str
    hidden: int
    heads: int
    head_dim: int
    rope_dim: int
    q_lora: int
    o_lora: int
    o_groups: int
    window: int
    idx_heads: int
    idx_head_dim: int
    idx_topk: int
    hc_mult: int
    sinkhorn_iters: int
    hc_eps: float
    rms_eps: float
    vocab: int
    n_experts: int
    topk_experts: int
    n_shared: int
    moe_inter: int
    routed_scale: float
    swiglu_limit: float
    n_hash_layers: int
    csa_ratio: int
    hca_ratio: int
    block_size: int
    max_pos: int
    decode_batch: int
    seq: int
    tp: int
    ep: int
    rope_theta: float
    compress_rope_theta: float
    yarn_factor: float
    yarn_orig: int
    yarn_beta_fast: float
    yarn_beta_slow: float
    context: int = 0   # cache capacity in tokens per request; 0 = the default, min(max_pos, 4·csa_ratio·idx_topk)

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def batch(self) -> int:
        """Requests per TP rank: B = decode_batch // tp."""
        return self.decode_batch // self.tp

    @property
    def tokens(self) -> int:
        """Tokens per TP rank: T = B·S."""
        return self.batch * self.seq

    @property
    def t_pad(self) -> int:
        """T rounded up to 16 (rows of the packed attention output, dsv4-math §6.3)."""
        return -(-self.tokens // 16) * 16

    @property
    def group_tokens(self) -> int:
        """GROUP_T = tp·T: rows every rank's O projection sees after the all-to-all."""
        return self.tp * self.tokens

    @property
    def nope_dim(self) -> int:
        return self.head_dim - self.rope_dim

    @property
    def idx_nope_dim(self) -> int:
        return self.idx_head_dim - self.rope_dim

    @property
    def heads_per_group(self) -> int:
        return self.heads // self.o_groups

    @property
    def local_o_groups(self) -> int:
        return self.o_groups // self.tp

    @property
    def local_experts(self) -> int:
        return self.n_experts // self.ep

    @property
    def score_len(self) -> int:
        """Width of the decode indexer score / top-k rows: max_pos // csa_ratio."""
        return self.max_pos // self.csa_ratio

    @property
    def mix_hc(self) -> int:
        return (2 + self.hc_mult) * self.hc_mult

    @property
    def hc_dim(self) -> int:
        return self.hc_mult * self.hidden

    @property
    def softmax_scale(self) -> float:
        """Main attention scale head_dim^-1/2, no YaRN mscale (dsv4-math §0, §12.5)."""
        return self.head_dim ** -0.5

    @property
    def index_weights_scale(self) -> float:
        """idx_head_dim^-1/2 · idx_heads^-1/2 (dsv4-math §0)."""
        return self.idx_head_dim ** -0.5 * self.idx_heads ** -0.5

    def with_(self, **overrides) -> ModelConfig:
        """A new validated config. Besides the fields, `batch=` (sets decode_batch = batch·tp) and `tokens=`
        (sets the batch from T = B·S) are accepted."""
        fields = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - fields - {"batch", "tokens"})
        if unknown:
            raise ConfigError(f"{unknown[0]}: not a ModelConfig field")
        overrides = _resolve_batch(self, dict(overrides))
        return dataclasses.replace(self, **overrides)


def _resolve_batch(cfg: ModelConfig, overrides: dict) -> dict:
    seq = overrides.get("seq", cfg.seq)
    tp = overrides.get("tp", cfg.tp)
    tokens = overrides.pop("tokens", None)
    if tokens is not None:
        if seq <= 0 or tokens % seq:
            raise ConfigError(f"tokens: T={tokens} is not a multiple of seq S={seq}")
        overrides.setdefault("batch", tokens // seq)
    batch = overrides.pop("batch", None)
    if batch is not None:
        overrides["decode_batch"] = batch * tp
    return overrides


_NON_NEGATIVE = ("n_hash_layers", "n_shared", "yarn_orig", "swiglu_limit", "context")


def _validate(cfg: ModelConfig) -> None:
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        if f.name == "name" or isinstance(value, bool):
            continue
        if value < 0 or (value == 0 and f.name not in _NON_NEGATIVE):
            raise ConfigError(f"{f.name}: must be positive, got {value}")
    for ok, field, message in _rules(cfg):
        if not ok:
            raise ConfigError(f"{field}: {message}")


def _rules(c: ModelConfig):
    return [
        (c.hc_mult == 4, "hc_mult", f"must be 4 (hc_pre sums the streams as (0+1)+(2+3)), got {c.hc_mult}"),
        (c.rope_dim % 2 == 0, "rope_dim", f"must be even, got {c.rope_dim}"),
        (c.rope_dim < c.head_dim, "rope_dim", f"{c.rope_dim} must be < head_dim={c.head_dim}"),
        (c.rope_dim < c.idx_head_dim, "idx_head_dim", f"{c.idx_head_dim} must exceed rope_dim={c.rope_dim}"),
        (c.heads % c.o_groups == 0, "o_groups", f"{c.o_groups} does not divide heads={c.heads}"),
        (c.o_groups % c.tp == 0, "tp", f"{c.tp} does not divide o_groups={c.o_groups}"),
        (c.decode_batch % c.tp == 0, "tp", f"{c.tp} does not divide decode_batch={c.decode_batch}"),
        (c.n_experts % c.ep == 0, "ep", f"{c.ep} does not divide n_experts={c.n_experts}"),
        (c.topk_experts <= c.n_experts, "topk_experts", f"{c.topk_experts} > n_experts={c.n_experts}"),
        (c.hc_dim % 16 == 0, "hidden", f"hc_mult·hidden={c.hc_dim} must be a multiple of 16 (4 splits × 4)"),
        (c.max_pos % c.csa_ratio == 0, "csa_ratio", f"{c.csa_ratio} does not divide max_pos={c.max_pos}"),
        (c.max_pos % c.hca_ratio == 0, "hca_ratio", f"{c.hca_ratio} does not divide max_pos={c.max_pos}"),
        (c.max_pos % c.block_size == 0, "block_size", f"{c.block_size} does not divide max_pos={c.max_pos}"),
        (c.idx_topk <= c.score_len, "idx_topk", f"{c.idx_topk} > score_len={c.score_len}"),
        (c.window <= c.max_pos, "window", f"{c.window} > max_pos={c.max_pos}"),
        (c.context <= c.max_pos, "context", f"{c.context} > max_pos={c.max_pos}"),
        (c.seq <= c.hca_ratio, "seq", f"S={c.seq} > hca_ratio={c.hca_ratio} (≤ 1 HCA boundary per step)"),
        (c.seq <= c.window, "seq", f"S={c.seq} > window={c.window}"),
    ]


FLASH = ModelConfig(
    name="flash", hidden=4096, heads=64, head_dim=512, rope_dim=64, q_lora=1024, o_lora=1024, o_groups=8,
    window=128, idx_heads=64, idx_head_dim=128, idx_topk=512, hc_mult=4, sinkhorn_iters=20, hc_eps=1e-6,
    rms_eps=1e-6, vocab=129280, n_experts=256, topk_experts=6, n_shared=1, moe_inter=2048, routed_scale=1.5,
    swiglu_limit=10.0, n_hash_layers=3, csa_ratio=4, hca_ratio=128, block_size=32, max_pos=16384,
    decode_batch=64, seq=8, tp=4, ep=16, rope_theta=10000.0, compress_rope_theta=160000.0, yarn_factor=16.0,
    yarn_orig=65536, yarn_beta_fast=32.0, yarn_beta_slow=1.0,
)

TINY = dataclasses.replace(
    FLASH, name="tiny", hidden=256, heads=8, head_dim=64, rope_dim=16, q_lora=64, o_lora=64, o_groups=4,
    window=16, idx_heads=4, idx_head_dim=32, idx_topk=16, vocab=512, n_experts=8, topk_experts=2,
    moe_inter=128, n_hash_layers=1, hca_ratio=16, block_size=8, max_pos=512, decode_batch=8, seq=4, tp=2, ep=2,
)

_CONFIGS = {"flash": FLASH, "tiny": TINY}
CONFIG_NAMES = tuple(_CONFIGS)


def config_by_name(name: str) -> ModelConfig:
    if name not in _CONFIGS:
        raise ConfigError(f"name: unknown config {name!r} (known: {', '.join(_CONFIGS)})")
    return _CONFIGS[name]


_LAYER_KINDS = {
    "flash": ("swa", "swa") + ("csa", "hca") * 20 + ("csa",),
    "tiny": ("swa", "csa", "hca", "csa"),
}


def layer_kinds(cfg: ModelConfig) -> tuple[str, ...]:
    """Attention kind of every decoder layer (dsv4-math §10; dspark-model.md §2.1, §2.2)."""
    if cfg.name not in _LAYER_KINDS:
        raise ConfigError(f"name: no layer sequence for config {cfg.name!r}")
    return _LAYER_KINDS[cfg.name]


@dataclass(frozen=True)
class TileConfig:
    """Tile constants of the decode kernels (dspark-model.md §3.1-§3.4), named as in the notes.

    Only LINEAR_OK, RMS_K_CHUNK, ATTN_K_TILE and CMP_PAGES_PER_WORK change golden numerics (hc_pre split order,
    hc_pre sum-of-squares chunks, attention tile boundaries, HCA compressed work items). KV_OM is the split-M factor
    the kv-proj fan-out pass (d) introduces; the baseline graph uses 1 and the pass doubles KV_RMS_T_TILE.
    TINY values are ours: each tile divides its TINY extent.
    """

    # hc_pre (§3.1)
    T_TILE: int
    LINEAR_T_TILE: int
    LINEAR_K_CHUNK: int
    RMS_K_CHUNK: int
    D_SPMD: int
    LINEAR_OK: int
    MIX_PAD: int
    # qkv (§3.1)
    QR_N_TILE: int
    QR_K_TILE: int
    QR_OK: int
    QPROJ_MM_N_TILE: int
    QPROJ_M_TILE: int
    KV_M_TILE: int
    KV_N_TILE: int
    KV_K_TILE: int
    KV_OK: int
    KV_OM: int
    KV_RMS_T_TILE: int
    Q_ROPE_H_TILE: int
    PREFILL_DENSE_TILE: int
    # attention (§3.2-§3.4)
    GATHER_SPLITS: int
    GATHER_RUN: int
    H_TILE: int
    QK_M_TILE: int
    ATTN_K_TILE: int
    ATTN_D_TILE: int
    BIAS_T_TILE: int
    RAW_K_TILE: int
    CMP_PAGES_PER_WORK: int
    HCA_MAX_COMPRESSED_ROWS: int
    MERGE_WORKERS: int
    NUM_QK_CORES: int
    SPARSE_BLOCKS: int
    SWA_RUNS: int
    # compressor (§3.3)
    CMP_K_TILE: int
    CMP_OUT_TILE: int
    MM_B_TILE: int
    # indexer (§3.4)
    CACHE_TILE: int
    REDUCE_TILE: int
    REDUCE_NSPLIT: int
    Q_OUT_TILE: int
    DEQUANT_T_TILE: int
    MM_ROW_TILE: int
    QR_OT_COUNT: int
    WEIGHTS_OK: int
    QH_MM_TILE: int
    QH_QUANT_TILE: int
    ROPE_ROW_TILE: int
    TOPK_HALF_LEN: int
    SCORE_LEN: int


FLASH_TILES = TileConfig(
    T_TILE=8, LINEAR_T_TILE=16, LINEAR_K_CHUNK=256, RMS_K_CHUNK=512, D_SPMD=1024, LINEAR_OK=4, MIX_PAD=32,
    QR_N_TILE=128, QR_K_TILE=256, QR_OK=2, QPROJ_MM_N_TILE=512, QPROJ_M_TILE=64, KV_M_TILE=16, KV_N_TILE=128,
    KV_K_TILE=256, KV_OK=4, KV_OM=4, KV_RMS_T_TILE=8, Q_ROPE_H_TILE=4, PREFILL_DENSE_TILE=512,
    GATHER_SPLITS=4, GATHER_RUN=16, H_TILE=16, QK_M_TILE=32, ATTN_K_TILE=128, ATTN_D_TILE=256, BIAS_T_TILE=8,
    RAW_K_TILE=32, CMP_PAGES_PER_WORK=4, HCA_MAX_COMPRESSED_ROWS=8192, MERGE_WORKERS=48, NUM_QK_CORES=24,
    SPARSE_BLOCKS=5, SWA_RUNS=5,
    CMP_K_TILE=512, CMP_OUT_TILE=64, MM_B_TILE=16,
    CACHE_TILE=32, REDUCE_TILE=32, REDUCE_NSPLIT=2, Q_OUT_TILE=1024, DEQUANT_T_TILE=8, MM_ROW_TILE=16, QR_OT_COUNT=8,
    WEIGHTS_OK=4, QH_MM_TILE=64, QH_QUANT_TILE=64, ROPE_ROW_TILE=32, TOPK_HALF_LEN=2048, SCORE_LEN=4096,
)

TINY_TILES = TileConfig(
    T_TILE=4, LINEAR_T_TILE=8, LINEAR_K_CHUNK=64, RMS_K_CHUNK=128, D_SPMD=64, LINEAR_OK=4, MIX_PAD=32,
    QR_N_TILE=32, QR_K_TILE=64, QR_OK=2, QPROJ_MM_N_TILE=64, QPROJ_M_TILE=8, KV_M_TILE=8, KV_N_TILE=32,
    KV_K_TILE=64, KV_OK=4, KV_OM=2, KV_RMS_T_TILE=4, Q_ROPE_H_TILE=4, PREFILL_DENSE_TILE=64,
    GATHER_SPLITS=4, GATHER_RUN=4, H_TILE=4, QK_M_TILE=8, ATTN_K_TILE=16, ATTN_D_TILE=32, BIAS_T_TILE=4,
    RAW_K_TILE=4, CMP_PAGES_PER_WORK=2, HCA_MAX_COMPRESSED_ROWS=32, MERGE_WORKERS=4, NUM_QK_CORES=4,
    SPARSE_BLOCKS=2, SWA_RUNS=3,
    CMP_K_TILE=64, CMP_OUT_TILE=16, MM_B_TILE=4,
    CACHE_TILE=8, REDUCE_TILE=8, REDUCE_NSPLIT=2, Q_OUT_TILE=32, DEQUANT_T_TILE=4, MM_ROW_TILE=8, QR_OT_COUNT=4,
    WEIGHTS_OK=4, QH_MM_TILE=8, QH_QUANT_TILE=8, ROPE_ROW_TILE=8, TOPK_HALF_LEN=64, SCORE_LEN=128,
)

_TILES = {"flash": FLASH_TILES, "tiny": TINY_TILES}


def tiles_for(cfg: ModelConfig) -> TileConfig:
    """Tile constants for `cfg` (chosen by cfg.name). Checks the tile invariants of dspark-model.md §2.2."""
    if cfg.name not in _TILES:
        raise ConfigError(f"name: no tile constants for config {cfg.name!r}")
    tiles = _TILES[cfg.name]
    checks = [
        (cfg.window == tiles.ATTN_K_TILE, "window", f"{cfg.window} must equal ATTN_K_TILE={tiles.ATTN_K_TILE}"),
        (cfg.hc_dim % (4 * tiles.LINEAR_OK) == 0, "hidden", "hc_dim must split into LINEAR_OK groups of 4"),
        (cfg.hc_dim % tiles.RMS_K_CHUNK == 0, "hidden", f"hc_dim must be a multiple of {tiles.RMS_K_CHUNK}"),
        (tiles.H_TILE % cfg.heads_per_group == 0, "o_groups", "H_TILE must be a multiple of heads_per_group"),
        (tiles.SCORE_LEN == cfg.score_len or (cfg.context > 0 and cfg.score_len > tiles.SCORE_LEN), "max_pos",
         f"score_len must be SCORE_LEN={tiles.SCORE_LEN} (a longer one only with a grown context: with_context)"),
    ]
    for ok, field, message in checks:
        if not ok:
            raise ConfigError(f"{field}: {message}")
    return tiles


@dataclass(frozen=True)
class CacheGeometry:
    """Shapes of the paged caches that make_inputs builds for one rank (B = cfg.batch requests).

    Every request gets its own table row of `*_blocks` logical pages; pools hold batch·blocks pages of
    block_size rows, so shapes depend on the config only. `ctx_cap` bounds kv_seq_len: the config's `context`
    when set (`with_context`), else min(max_pos, 4·csa_ratio·idx_topk) (TINY 256, FLASH 8192), enough for the
    long_cache regime. Compressor state is a ring of `*_state_blocks` pages per request (dsv4-math §10:
    block % block_count): it does not grow with the context.
    """

    ctx_cap: int
    kv_blocks: int
    csa_blocks: int
    hca_blocks: int
    csa_state_blocks: int
    hca_state_blocks: int
    block_size: int
    batch: int

    def rows(self, blocks: int) -> int:
        """Pool rows for a per-request table width of `blocks` pages."""
        return self.batch * blocks * self.block_size


def cache_geometry(cfg: ModelConfig) -> CacheGeometry:
    cap = cfg.context or min(cfg.max_pos, 4 * cfg.csa_ratio * cfg.idx_topk)
    bs = cfg.block_size
    return CacheGeometry(
        ctx_cap=cap,
        kv_blocks=_ceil_div(cap, bs),
        csa_blocks=_ceil_div(_ceil_div(cap, cfg.csa_ratio), bs),
        hca_blocks=_ceil_div(_ceil_div(cap, cfg.hca_ratio), bs),
        csa_state_blocks=_state_blocks(cfg, 2 * cfg.csa_ratio),
        hca_state_blocks=_state_blocks(cfg, cfg.hca_ratio),
        block_size=bs,
        batch=cfg.batch,
    )


def with_context(cfg: ModelConfig, context: int) -> ModelConfig:
    """`cfg` whose caches hold `context` tokens per request, when that is more than they hold (else `cfg`): the
    page tables and pools follow from it (cache_geometry), and so does the position ceiling max_pos (RoPE table
    rows, the indexer's score_len = max_pos // csa_ratio), raised to `context` rounded up to a multiple of both
    ratios and the page size, as upstream's MAX_SEQ_LEN = max_position_embeddings sizes those (its HCA decode
    took a 1M ceiling of its own, pypto-lib #1008)."""
    if context <= 0:
        raise ConfigError(f"context: must be positive, got {context}")
    if context <= cache_geometry(cfg).ctx_cap:
        return cfg
    unit = math.lcm(cfg.csa_ratio, cfg.hca_ratio, cfg.block_size)
    return cfg.with_(context=context, max_pos=max(cfg.max_pos, _ceil_div(context, unit) * unit))


def _state_blocks(cfg: ModelConfig, rows_per_entry: int) -> int:
    """Ring pages: two entries' rows, and at least the rows one entry plus one chunk can touch (FLASH 2 / 8)."""
    needed = max(2 * rows_per_entry, rows_per_entry + cfg.seq - 1)
    return max(2, _ceil_div(needed, cfg.block_size))


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


PREFILL_KINDS = ("prefill_swa", "prefill_hca", "prefill_csa")
PREFILL_INDEXER_SCORE_CAP = 2048   # prefill indexer: compressed positions ≥ this are dropped (dsv4-math §5.3)


def prefill_score_len(cfg: ModelConfig, tokens: int, start: int) -> int:
    """Width of the prefill indexer's score prefix: the request's compressed-entry pages (≥ the chunk's last entry
    count: the indexer kernels read whole pages), capped at PREFILL_INDEXER_SCORE_CAP."""
    pages = prefill_geometry("prefill_csa", cfg, tokens, start)["cmp_blocks"]
    return min(pages * cfg.block_size, PREFILL_INDEXER_SCORE_CAP)


# ---- prefill geometry ----------------------------------------------------------------------------------------
def prefill_geometry(kind: str, cfg: ModelConfig, tokens: int, start: int) -> dict[str, int]:
    """One request's chunk of tp·tokens prompt tokens at `start` (goldens/prefill.py): page counts of its caches
    (table widths; the pools hold one spare page more), the compressor state ring pages and the RoPE table rows."""
    if kind not in PREFILL_KINDS:
        raise ConfigError(f"kind: unknown prefill kind {kind!r} (known: {', '.join(PREFILL_KINDS)})")
    if tokens <= 0 or start < 0:
        raise ConfigError(f"chunk: tokens must be positive and start non-negative, got {tokens} at {start}")
    bs, end = cfg.block_size, start + cfg.tp * tokens
    geo = cache_geometry(cfg.with_(seq=1))
    out = {"kv_blocks": _ceil(end, bs), "rope_rows": _ceil(end, bs) * bs}
    if kind == "prefill_hca":
        out |= {"cmp_blocks": _ceil(_ceil(end, cfg.hca_ratio), bs), "state_blocks": geo.hca_state_blocks}
    if kind == "prefill_csa":
        out |= {"cmp_blocks": _ceil(_ceil(end, cfg.csa_ratio), bs), "state_blocks": geo.csa_state_blocks}
    return out


def _ceil(a: int, b: int) -> int:
    return max(1, -(-a // b))


__all__ = [
    "ConfigError", "ModelConfig", "TileConfig", "CacheGeometry", "FLASH", "TINY", "FLASH_TILES", "TINY_TILES",
    "CONFIG_NAMES", "config_by_name", "layer_kinds", "tiles_for", "cache_geometry", "PREFILL_KINDS",
    "PREFILL_INDEXER_SCORE_CAP", "prefill_geometry", "prefill_score_len",
]

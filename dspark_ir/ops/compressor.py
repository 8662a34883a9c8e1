"""KV-compressor ops (dspark-model.md §3.3 6a-6c, §3.4 6 and 7i; dsv4-math §4, §5.1) and the per-request RoPE
rows they use (§3.3 2', §3.4 2'/2'').

One op per seed stage: `cmp_kv_score_proj` (kv_score_proj) → `cmp_scatter_softmax_pool` (scatter_softmax_pool,
in place on the ring state) → `cmp_rmsnorm_rope_cache_write` (main compressors, in place on cmp_kv), or for the
indexer's inner "C8" compressor `cmp_rmsnorm_rope` → `cmp_kv_hadamard` → `idx_kv_cache_write` (in place on
idx_kv_cache and idx_kv_scale). The same op kinds serve the CSA main (r = 4, overlap), the inner (r = 4, overlap,
HD = idx_head_dim) and the HCA (r = R, no overlap) compressors; the node names carry the block (`cmp.`, `icmp.`).
"""
from __future__ import annotations

from .. import dims as D
from ..types import DType, TensorType
from .base import (
    REQUIRED,
    Attr,
    OpDef,
    expect,
    expect_dtype,
    expect_rank,
    expect_same_dim,
    numpy_reference,
    register_op,
)

F32, BF16, I8, I32 = DType.fp32, DType.bf16, DType.i8, DType.i32
FLOATS = (BF16, DType.fp16, F32)


class _CmpOp(OpDef):
    family = "compressor"


def expect_index_vector(t: TensorType, what: str, rows: D.Dim | None = None) -> None:
    """An i32 vector (token positions, slot mappings, ...), optionally with `rows` entries."""
    expect(t.rank == 1 and t.dtype == I32, f"{what} must be i32[n], got {t}")
    if rows is not None:
        expect_same_dim(t.shape[0], rows, f"{what} length")


def expect_table(t: TensorType, what: str, rows: D.Dim | None = None) -> None:
    """A block table i32[B, pages]."""
    expect(t.rank == 2 and t.dtype == I32, f"{what} must be i32[B, pages], got {t}")
    if rows is not None:
        expect_same_dim(t.shape[0], rows, f"{what} rows (requests)")


def expect_rope_pair(cos: TensorType, sin: TensorType, rows: D.Dim, what: str = "rope tables") -> D.Dim:
    """Interleaved (cos_il, sin_signed) [rows, rope_dim]; returns rope_dim."""
    for name, t in (("cos_il", cos), ("sin_signed", sin)):
        expect_rank(t, 2, f"{what} {name} [rows, rope_dim]")
        expect_dtype(t, FLOATS, f"{what} {name}")
        expect_same_dim(t.shape[0], rows, f"{what} {name} rows")
    expect_same_dim(cos.shape[1], sin.shape[1], f"{what}: cos_il vs sin_signed width")
    return cos.shape[1]


def expect_rope_fits(width: D.Dim, rope: D.Dim, what: str) -> None:
    w, r = width.value(), rope.value()
    expect(w is None or r is None or r < w, f"{what}: rope width {rope} must be narrower than {width}")


def _positive(attrs, *names) -> None:
    for n in names:
        expect(attrs[n] > 0, f"{n} must be positive, got {attrs[n]}")


# ---- RoPE rows at per-request positions ---------------------------------------------------------------------
@register_op
class RopeGatherRows(_CmpOp):
    """(cos, sin) half rows [B, rope_dim/2] of the RoPE tables at each request's first position (`at = first`: the
    indexer's step rows, csa_rope_step) or at r·(first // r) (`at = boundary`: the entry pooled this step,
    csa_cmp_rope and the HCA boundary rows)."""
    name = "rope_gather_rows"
    operands = ("rope_cos", "rope_sin", "positions")
    results = ("cos", "sin")
    attrs = {
        "at": Attr("enum", REQUIRED, choices=("first", "boundary")),
        "seq": Attr("int", REQUIRED),
        "ratio": Attr("int", 1),
        "batch": Attr("dim", REQUIRED, doc="requests B (= T / seq)"),
    }
    core = "vector"
    reference = numpy_reference("compressor", "rope_gather_rows")

    def infer(self, ins, attrs):
        cos, sin, pos = ins
        _positive(attrs, "seq", "ratio")
        for name, t in (("rope_cos", cos), ("rope_sin", sin)):
            expect_rank(t, 2, f"{name} [max_pos, rope_dim]")
            expect_dtype(t, FLOATS, name)
        expect(cos.shape == sin.shape, f"rope_cos {cos} and rope_sin {sin} differ")
        expect_index_vector(pos, "positions")
        n_t, n_b = pos.shape[0].value(), attrs["batch"].value()
        expect(n_t is None or n_b is None or n_t == n_b * attrs["seq"],
               f"positions ({pos.shape[0]}) must be batch·seq = {attrs['batch']}·{attrs['seq']}")
        half = D.floordiv(cos.shape[1], 2)
        t = TensorType(cos.dtype, (attrs["batch"], half))
        return [t, t]


@register_op
class RopeInterleave(_CmpOp):
    """Interleaved tables from half rows: cos_il[j] = c[j>>1], sin_signed[j] = s[j>>1]·(−1 if j even else +1),
    bf16 [rows, rope_dim] (rope_interleave)."""
    name = "rope_interleave"
    operands = ("cos", "sin")
    results = ("cos_il", "sin_signed")
    reference = numpy_reference("compressor", "rope_interleave")

    def infer(self, ins, attrs):
        cos, sin = ins
        for name, t in (("cos", cos), ("sin", sin)):
            expect_rank(t, 2, f"{name} half rows [rows, rope_dim/2]")
            expect_dtype(t, FLOATS, name)
        expect(cos.shape == sin.shape, f"cos {cos} and sin {sin} differ")
        t = TensorType(BF16, (cos.shape[0], D.mul(cos.shape[1], 2)))
        return [t, t]


@register_op
class RopeSwapIdx(_CmpOp):
    """The interleaved-RoPE lane permutation j ^ 1, i32[rope_dim] (qr_rope_swap_idx, rope_swap)."""
    name = "rope_swap_idx"
    operands = ()
    attrs = {"rope_dim": Attr("int", REQUIRED)}
    reference = numpy_reference("compressor", "rope_swap_idx")

    def infer(self, ins, attrs):
        rd = attrs["rope_dim"]
        expect(rd > 0 and rd % 2 == 0, f"rope_dim must be positive and even, got {rd}")
        return [TensorType(I32, (D.Const(rd),))]


# ---- kv_score_proj ------------------------------------------------------------------------------------------
@register_op
class CmpKvScoreProj(_CmpOp):
    """kvp = x @ wkv.T and scp = x @ wgate.T, f32 [T, OUT] each (kv_score_proj; weights stored [OUT, D])."""
    name = "cmp_kv_score_proj"
    operands = ("x", "wkv", "wgate")
    results = ("kv", "score")
    attrs = {"token_tiles": Attr("int", doc="token tiles (of tile[0] rows) one block runs in turn with the same "
                                             "weight tiles (pypto-lib #1155 KV_SCORE_T_GROUP)")}
    core = "cube"
    reference = numpy_reference("compressor", "cmp_kv_score_proj")

    def infer(self, ins, attrs):
        x, wkv, wgate = ins
        expect_rank(x, 2, "x [T, D]")
        expect_dtype(x, FLOATS, "x")
        for name, w in (("wkv", wkv), ("wgate", wgate)):
            expect_rank(w, 2, f"{name} [OUT, D]")
            expect_dtype(w, FLOATS, name)
            expect_same_dim(w.shape[1], x.shape[1], f"{name} columns vs hidden")
        expect(wkv.shape == wgate.shape, f"wkv {wkv} and wgate {wgate} differ")
        t = TensorType(F32, (x.shape[0], wkv.shape[0]))
        return [t, t]

    def tile_axes(self, ins, outs, attrs):
        return [("m", ins[0].shape[0]), ("n", ins[1].shape[0]), ("k", ins[0].shape[1])]


# ---- scatter_softmax_pool -----------------------------------------------------------------------------------
def _scatter_pool_operands(ins, attrs, positive: tuple[str, ...], one_request: bool) -> None:
    """The operand checks shared by the decode and prefill pools (kv, score, ape, state, state_block_table,
    positions): `positive` attributes > 0, then the operands in order; `one_request`: the table has one row."""
    kv, score, ape, state, table, pos = ins
    _positive(attrs, *positive)
    out = (2 if attrs["overlap"] else 1) * attrs["head_dim"]
    for name, t in (("kv", kv), ("score", score)):
        expect(t.rank == 2 and t.dtype == F32, f"{name} must be f32[T, OUT], got {t}")
        expect(t.shape[1].value() in (None, out), f"{name} width {t.shape[1]} must be OUT = {out}")
    expect(kv.shape == score.shape, f"kv {kv} and score {score} differ")
    expect(ape.rank == 2 and ape.dtype == F32, f"ape must be f32[ratio, OUT], got {ape}")
    expect(ape.shape[0].value() in (None, attrs["ratio"]), f"ape rows {ape.shape[0]} must be the ratio")
    expect_same_dim(ape.shape[1], kv.shape[1], "ape width vs OUT")
    expect(state.rank == 2 and state.dtype == F32, f"state must be f32[rows, 2·OUT], got {state}")
    expect(state.shape[1].value() in (None, 2 * out), f"state width {state.shape[1]} must be 2·OUT = {2 * out}")
    expect_table(table, "state_block_table")
    if one_request:
        expect(table.shape[0].value() in (None, 1), f"state_block_table must have one request row, got {table}")
    expect_index_vector(pos, "positions", kv.shape[0])


@register_op
class CmpScatterSoftmaxPool(_CmpOp):
    """Scatter [kvp | scp + ape[pos % r]] of every token into the paged ring state (in place), then pool each
    request's first closed entry (plain softmax over 2r overlap rows or r rows) → pooled f32 [B, HD]
    (scatter_softmax_pool)."""
    name = "cmp_scatter_softmax_pool"
    operands = ("kv", "score", "ape", "state", "state_block_table", "positions")
    index_operands = {4: (3, 0, "block_size")}
    results = ("state", "pooled")
    aliases = {0: 3}
    attrs = {
        "ratio": Attr("int", REQUIRED),
        "head_dim": Attr("int", REQUIRED),
        "overlap": Attr("bool", REQUIRED),
        "block_size": Attr("int", REQUIRED),
        "seq": Attr("int", REQUIRED),
    }
    reference = numpy_reference("compressor", "cmp_scatter_softmax_pool")

    def infer(self, ins, attrs):
        _scatter_pool_operands(ins, attrs, ("ratio", "head_dim", "block_size", "seq"), one_request=False)
        state, table = ins[3], ins[4]
        return [state, TensorType(F32, (table.shape[0], D.Const(attrs["head_dim"])))]

    def tile_axes(self, ins, outs, attrs):
        return [("requests", ins[4].shape[0])]     # requests per SPMD block (one `pl.at` block when untiled)


# ---- finish --------------------------------------------------------------------------------------------------
def _finish_operands(pooled: TensorType, norm_w: TensorType, cos: TensorType, sin: TensorType) -> None:
    expect(pooled.rank == 2 and pooled.dtype == F32, f"pooled must be f32[B, HD], got {pooled}")
    expect(norm_w.rank == 1, f"norm_w must be rank 1, got {norm_w}")
    expect_dtype(norm_w, FLOATS, "norm_w")
    expect_same_dim(norm_w.shape[0], pooled.shape[1], "norm_w length vs HD")
    rope = expect_rope_pair(cos, sin, pooled.shape[0], "entry rope")
    expect_rope_fits(pooled.shape[1], rope, "pooled")


@register_op
class CmpRmsnormRope(_CmpOp):
    """y = rope(pooled · rsqrt(mean(pooled²) + eps) · norm_w) at the entry position, f32 [B, HD], not rounded
    (inner compressor rmsnorm_rope)."""
    name = "cmp_rmsnorm_rope"
    operands = ("pooled", "norm_w", "cos_il", "sin_signed")
    attrs = {"eps": Attr("float", 1e-6)}
    reference = numpy_reference("compressor", "cmp_rmsnorm_rope")

    def infer(self, ins, attrs):
        _finish_operands(*ins)
        return [ins[0]]

    def tile_axes(self, ins, outs, attrs):
        return [("requests", ins[0].shape[0])]


@register_op
class CmpRmsnormRopeCacheWrite(_CmpOp):
    """y as in cmp_rmsnorm_rope; rb(y) stored at slot_mapping[pooling token] of every request that pooled an
    entry (in place on cmp_kv; slot −1 skipped) (rmsnorm_rope_cache_write)."""
    name = "cmp_rmsnorm_rope_cache_write"
    operands = ("pooled", "norm_w", "cos_il", "sin_signed", "cmp_kv", "slot_mapping", "positions")
    index_operands = {5: (4, 0)}
    aliases = {0: 4}
    attrs = {"ratio": Attr("int", REQUIRED), "seq": Attr("int", REQUIRED), "eps": Attr("float", 1e-6)}
    reference = numpy_reference("compressor", "cmp_rmsnorm_rope_cache_write")

    def infer(self, ins, attrs):
        pooled, norm_w, cos, sin, cache, slots, pos = ins
        _positive(attrs, "ratio", "seq")
        _finish_operands(pooled, norm_w, cos, sin)
        expect(cache.rank == 2, f"cmp_kv must be [rows, HD], got {cache}")
        expect_dtype(cache, FLOATS, "cmp_kv")
        expect_same_dim(cache.shape[1], pooled.shape[1], "cmp_kv width vs HD")
        expect_index_vector(slots, "slot_mapping")
        expect_index_vector(pos, "positions", slots.shape[0])
        return [cache]

    def tile_axes(self, ins, outs, attrs):
        return [("requests", ins[0].shape[0])]


@register_op
class CmpKvHadamard(_CmpOp):
    """k = rb(rb(y) @ H), bf16 [B, IHD] (inner compressor kv_hadamard)."""
    name = "cmp_kv_hadamard"
    operands = ("y", "hadamard")
    core = "cube"
    reference = numpy_reference("compressor", "cmp_kv_hadamard")

    def infer(self, ins, attrs):
        y, h = ins
        expect(y.rank == 2 and y.dtype == F32, f"y must be f32[B, IHD], got {y}")
        expect_rank(h, 2, "hadamard [IHD, IHD]")
        expect_dtype(h, FLOATS, "hadamard")
        expect_same_dim(h.shape[0], y.shape[1], "hadamard rows vs IHD")
        return [TensorType(BF16, (y.shape[0], h.shape[1]))]

    def tile_axes(self, ins, outs, attrs):
        return [("requests", ins[0].shape[0])]


@register_op
class IdxKvCacheWrite(_CmpOp):
    """q8 per entry of k; int8 row and f32 scale stored at slot_mapping[pooling token] (in place on idx_kv_cache
    and idx_kv_scale; slot −1 skipped) (kv_and_cache_write)."""
    name = "idx_kv_cache_write"
    operands = ("k", "idx_kv_cache", "idx_kv_scale", "slot_mapping", "positions")
    index_operands = {3: (1, 0)}
    results = ("idx_kv_cache", "idx_kv_scale")
    aliases = {0: 1, 1: 2}
    attrs = {"ratio": Attr("int", REQUIRED), "seq": Attr("int", REQUIRED)}
    reference = numpy_reference("compressor", "idx_kv_cache_write")

    def infer(self, ins, attrs):
        k, cache, scale, slots, pos = ins
        _positive(attrs, "ratio", "seq")
        expect_rank(k, 2, "k [B, IHD]")
        expect_dtype(k, FLOATS, "k")
        expect(cache.rank == 2 and cache.dtype == I8, f"idx_kv_cache must be i8[rows, IHD], got {cache}")
        expect_same_dim(cache.shape[1], k.shape[1], "idx_kv_cache width vs IHD")
        expect(scale.rank == 1 and scale.dtype == F32, f"idx_kv_scale must be f32[rows], got {scale}")
        expect_same_dim(scale.shape[0], cache.shape[0], "idx_kv_scale rows vs idx_kv_cache rows")
        expect_index_vector(slots, "slot_mapping")
        expect_index_vector(pos, "positions", slots.shape[0])
        return [cache, scale]

    def tile_axes(self, ins, outs, attrs):
        return [("requests", ins[0].shape[0])]


# ---- prefill ------------------------------------------------------------------------------------------------
@register_op
class PrefillCmpPool(_CmpOp):
    """The prefill pool of one request's chunk: every token closing a window pools its entry (rows in the chunk
    from its own [kv | score + ape[pos % r]], earlier rows from the state as received), then every token's row is
    written into the ring state (in place) → (state, pooled f32 [T, HD], 0 for tokens closing no window)
    (upstream prefill_compressor_ratio4/128: scatter the tile's rows, pool every boundary in it)."""
    name = "prefill_cmp_pool"
    operands = ("kv", "score", "ape", "state", "state_block_table", "positions")
    index_operands = {4: (3, 0, "block_size")}
    results = ("state", "pooled")
    aliases = {0: 3}
    attrs = {
        "ratio": Attr("int", REQUIRED),
        "head_dim": Attr("int", REQUIRED),
        "overlap": Attr("bool", REQUIRED),
        "block_size": Attr("int", REQUIRED),
    }
    reference = numpy_reference("compressor", "prefill_cmp_pool")

    def infer(self, ins, attrs):
        _scatter_pool_operands(ins, attrs, ("ratio", "head_dim", "block_size"), one_request=True)
        kv, state = ins[0], ins[3]
        return [state, TensorType(F32, (kv.shape[0], D.Const(attrs["head_dim"])))]

    def tile_axes(self, ins, outs, attrs):
        return [("m", ins[0].shape[0])]


@register_op
class PrefillCmpFinishWrite(_CmpOp):
    """rb(y) of every token closing a window stored at slot_mapping[token] (in place on cmp_kv; −1 skipped),
    y = rmsnorm(pooled)·norm_w with RoPE at the entry's first position pos + 1 − r, read from the [P, rope_dim]
    tables (upstream prefill compressors' rmsnorm_rope_cache_write)."""
    name = "prefill_cmp_finish_write"
    operands = ("pooled", "norm_w", "rope_cos", "rope_sin", "cmp_kv", "slot_mapping", "positions")
    index_operands = {5: (4, 0)}
    aliases = {0: 4}
    attrs = {"ratio": Attr("int", REQUIRED), "eps": Attr("float", 1e-6)}
    reference = numpy_reference("compressor", "prefill_cmp_finish_write")

    def infer(self, ins, attrs):
        pooled, norm_w, cos, sin, cache, slots, pos = ins
        _positive(attrs, "ratio")
        expect(pooled.rank == 2 and pooled.dtype == F32, f"pooled must be f32[T, HD], got {pooled}")
        expect(norm_w.rank == 1, f"norm_w must be rank 1, got {norm_w}")
        expect_dtype(norm_w, FLOATS, "norm_w")
        expect_same_dim(norm_w.shape[0], pooled.shape[1], "norm_w length vs HD")
        for name, t in (("rope_cos", cos), ("rope_sin", sin)):
            expect_rank(t, 2, f"{name} [P, rope_dim]")
            expect_dtype(t, FLOATS, name)
        expect(cos.shape == sin.shape, f"rope_cos {cos} and rope_sin {sin} differ")
        expect_rope_fits(pooled.shape[1], cos.shape[1], "pooled")
        expect(cache.rank == 2, f"cmp_kv must be [rows, HD], got {cache}")
        expect_dtype(cache, FLOATS, "cmp_kv")
        expect_same_dim(cache.shape[1], pooled.shape[1], "cmp_kv width vs HD")
        expect_index_vector(slots, "slot_mapping", pooled.shape[0])
        expect_index_vector(pos, "positions", pooled.shape[0])
        return [cache]

    def tile_axes(self, ins, outs, attrs):
        return [("m", ins[0].shape[0])]

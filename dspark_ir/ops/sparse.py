"""Sparse-attention ops of the CSA and HCA decode layers (dspark-model.md §3.3 5-8i, §3.4 5, 8a-8e; dsv4-math §6).

CSA: `kv_cache_writeback` (csa_cache_writeback) … `kv_touch` (WAR marker) → `csa_slots_build_valid_qk_plan` →
`csa_qk_pv` (per-(token, block) partials, 24 cyclic lanes) → `csa_merge_norm` (block merge, sink, inverse RoPE,
group-major pack).
HCA two-stream form: `kv_cache_writeback` (hca_cache_writeback) ∥ compressor → `join` (cache_ready_dep) →
`swa_gather_kv` (hca_gather_kv) → `hca_raw_transpose` → `hca_raw_attn` (raw-window stream state; or
`hca_raw_attn_direct` on the rows alone, the `hca-raw-kv-no-transpose` pass's form; or `hca_request_kv_gather` →
`hca_raw_attn_request`, one gather per request, the `raw-kv-gather-per-request` pass's form) ∥
`hca_cmp_work_gather` → `hca_cmp_qk_pv` (per-work-item partials) → `hca_stream_merge` (normalised f32 stream
heads) → `hca_stream_pack` (inverse RoPE, bf16, pack). `hca_stream_merge_pack` is the fused form the
`fuse-merge-rope-pack` pass introduces.
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
from .compressor import expect_index_vector, expect_rope_fits, expect_rope_pair, expect_table

F32, BF16, I32 = DType.fp32, DType.bf16, DType.i32
FLOATS = (BF16, DType.fp16, F32)


class _SparseOp(OpDef):
    family = "sparse"


def _q(q: TensorType) -> None:
    expect_rank(q, 3, "q [T, H, HD]")
    expect_dtype(q, FLOATS, "q")


def _pool(t: TensorType, what: str, width: D.Dim) -> None:
    expect_rank(t, 2, f"{what} [rows, HD]")
    expect_dtype(t, FLOATS, what)
    expect_same_dim(t.shape[1], width, f"{what} width vs head_dim")


def _index_matrix(t: TensorType, what: str, rows: D.Dim) -> None:
    expect(t.rank == 2 and t.dtype == I32, f"{what} must be i32[T, n], got {t}")
    expect_same_dim(t.shape[0], rows, f"{what} rows")


def _partials(m: TensorType, l: TensorType, o: TensorType, what: str) -> None:
    """(m, l) f32 [T, n, H] and o f32 [T, n, H, HD] per-item partials."""
    expect(o.rank == 4 and o.dtype == F32, f"{what} o must be f32[T, n, H, HD], got {o}")
    for name, t in (("m", m), ("l", l)):
        expect(t.rank == 3 and t.dtype == F32 and t.shape == o.shape[:3],
               f"{what} {name} must be f32{list(o.shape[:3])}, got {t}")


def _stream(m: TensorType, l: TensorType, o: TensorType, what: str) -> None:
    """(m, l) f32 [T, H] and o f32 [T, H, HD]."""
    expect(o.rank == 3 and o.dtype == F32, f"{what} heads must be f32[T, H, HD], got {o}")
    for name, t in (("m", m), ("l", l)):
        expect(t.rank == 2 and t.dtype == F32 and t.shape == o.shape[:2],
               f"{what} {name} must be f32{list(o.shape[:2])}, got {t}")


def _sink(sink: TensorType, heads: D.Dim) -> None:
    expect(sink.rank == 1 and sink.dtype == F32, f"sink must be f32[H], got {sink}")
    expect_same_dim(sink.shape[0], heads, "sink length vs heads")


def _packed(heads: TensorType, cos: TensorType, sin: TensorType, o_groups: int) -> TensorType:
    rope = expect_rope_pair(cos, sin, heads.shape[0], "query rope")
    expect_rope_fits(heads.shape[2], rope, "heads")
    h = heads.shape[1].value()
    expect(o_groups > 0 and (h is None or h % o_groups == 0), f"{o_groups} o_groups do not divide {heads.shape[1]}")
    width = D.mul(D.floordiv(heads.shape[1], o_groups), heads.shape[2])
    return TensorType(BF16, (D.Const(o_groups), heads.shape[0], width))


def _swap(swap: TensorType, cos: TensorType) -> None:
    expect(swap.rank == 1 and swap.dtype == I32, f"swap must be i32[rope_dim], got {swap}")
    expect_same_dim(swap.shape[0], cos.shape[1], "swap length vs rope_dim")


# ---- cache writeback, WAR marker, output bridge -------------------------------------------------------------
@register_op
class KvCacheWriteback(_SparseOp):
    """kv_cache[slot[t]] = kv[t] in place, slot −1 skipped (csa_cache_writeback, hca_cache_writeback)."""
    name = "kv_cache_writeback"
    operands = ("kv", "kv_cache", "slot_mapping")
    index_operands = {2: (1, 0)}
    aliases = {0: 1}
    reference = numpy_reference("sparse", "kv_cache_writeback")

    def infer(self, ins, attrs):
        kv, cache, slots = ins
        expect_rank(kv, 2, "kv [T, HD]")
        _pool(cache, "kv_cache", kv.shape[1])
        expect(cache.dtype == kv.dtype, f"kv_cache dtype {cache.dtype} differs from kv {kv.dtype}")
        expect_index_vector(slots, "slot_mapping", kv.shape[0])
        return [cache]

    def tile_axes(self, ins, outs, attrs):
        return [("rows", ins[0].shape[0])]


@register_op
class KvTouch(_SparseOp):
    """No-op self-copy of kv_cache (in place): the WAR marker that makes the sparse stage an InOut user (kv_touch)."""
    name = "kv_touch"
    operands = ("kv_cache",)
    aliases = {0: 0}
    reference = numpy_reference("sparse", "kv_touch")

    def infer(self, ins, attrs):
        return [ins[0]]


@register_op
class OLocalBridge(_SparseOp):
    """Copy of the reduce-scattered O rows into the attention output (csa_o_local_bridge, hca_output_bridge)."""
    name = "o_local_bridge"
    operands = ("x",)
    reference = numpy_reference("sparse", "o_local_bridge")

    def infer(self, ins, attrs):
        expect_rank(ins[0], 2, "x [T, D]")
        return [ins[0]]

    def tile_axes(self, ins, outs, attrs):
        return [("rows", ins[0].shape[0])]


# ---- CSA ----------------------------------------------------------------------------------------------------
@register_op
class CsaSlotsBuildValidQkPlan(_SparseOp):
    """Keep top-k entries 0 ≤ raw < (pos+1)//r, map them through cmp_block_table → cmp_sparse_indices
    i32 [T, idx_topk] (−1 invalid); valid_block_mask i32 [T, blocks]; sparse_bias f32 [T, window + idx_topk]
    (0 / −1e20); qk_order i32 [T·blocks] (non-empty items first) (csa_slots_build_valid_qk_plan)."""
    name = "csa_slots_build_valid_qk_plan"
    operands = ("topk", "positions", "cmp_block_table", "swa_indices")
    results = ("cmp_sparse_indices", "valid_block_mask", "sparse_bias", "qk_order")
    attrs = {
        "ratio": Attr("int", REQUIRED),
        "seq": Attr("int", REQUIRED),
        "block_size": Attr("int", REQUIRED),
        "idx_topk": Attr("int", REQUIRED),
        "k_tile": Attr("int", REQUIRED),
    }
    reference = numpy_reference("sparse", "csa_slots_build_valid_qk_plan")

    def infer(self, ins, attrs):
        topk, pos, table, swa = ins
        for n in ("ratio", "seq", "block_size", "idx_topk", "k_tile"):
            expect(attrs[n] > 0, f"{n} must be positive, got {attrs[n]}")
        expect_index_vector(pos, "positions")
        _index_matrix(topk, "topk", pos.shape[0])
        k = attrs["idx_topk"]
        expect(topk.shape[1].value() is None or topk.shape[1].value() >= k, f"topk narrower than idx_topk={k}")
        expect_table(table, "cmp_block_table")
        _index_matrix(swa, "swa_indices", pos.shape[0])
        width = D.add(swa.shape[1], k)
        w = width.value()
        expect(w is None or w % attrs["k_tile"] == 0,
               f"k_tile {attrs['k_tile']} does not divide window + top-k {width}")
        blocks = D.floordiv(width, attrs["k_tile"])
        T = pos.shape[0]
        return [TensorType(I32, (T, D.Const(k))), TensorType(I32, (T, blocks)), TensorType(F32, (T, width)),
                TensorType(I32, (D.mul(T, blocks),))]

    def tile_axes(self, ins, outs, attrs):
        return [("rows", ins[1].shape[0])]


@register_op
class CsaQkPv(_SparseOp):
    """Per-(token, block) partials over [window rows of kv_cache | top-k rows of cmp_kv] in k_tile-wide blocks,
    masked where sparse_bias < 0: (m, l) f32 [T, blocks, H], o f32 [T, blocks, H, HD] (qk_pv; cyclic lanes over
    the T·blocks items in qk_order). With `live_blocks`, only the first live_blocks blocks: the caller's bound
    says no later block holds a valid row (its partial would be neutral, m = −1e20, l = 0, o = 0, and leave the
    merge unchanged), as upstream runs only the non-empty blocks of its valid-block mask."""
    name = "csa_qk_pv"
    operands = ("q", "kv_cache", "swa_indices", "cmp_kv", "cmp_sparse_indices", "sparse_bias", "qk_order")
    results = ("m", "l", "o")
    attrs = {"scale": Attr("float", REQUIRED), "k_tile": Attr("int", REQUIRED),
             "live_blocks": Attr("int", doc="static bound on the blocks that can hold a valid row (case extent)")}
    core = "mix"
    reference = numpy_reference("sparse", "csa_qk_pv")

    def infer(self, ins, attrs):
        q, cache, swa, cmp_kv, cmp_idx, bias, order = ins
        _q(q)
        T, H, HD = q.shape
        _pool(cache, "kv_cache", HD)
        _pool(cmp_kv, "cmp_kv", HD)
        _index_matrix(swa, "swa_indices", T)
        _index_matrix(cmp_idx, "cmp_sparse_indices", T)
        width = D.add(swa.shape[1], cmp_idx.shape[1])
        expect(bias.rank == 2 and bias.dtype == F32, f"sparse_bias must be f32[T, n], got {bias}")
        expect_same_dim(bias.shape[1], width, "sparse_bias width vs window + top-k")
        kt, w = attrs["k_tile"], width.value()
        expect(kt > 0 and (w is None or w % kt == 0), f"k_tile {kt} does not divide window + top-k {width}")
        blocks = D.floordiv(width, kt)
        expect_index_vector(order, "qk_order", D.mul(T, blocks))
        live, nb = attrs.get("live_blocks"), blocks.value()
        if live is not None:
            expect(live > 0 and (nb is None or live <= nb), f"live_blocks must be in [1, {blocks}], got {live}")
            blocks = D.Const(live)
        th = TensorType(F32, (T, blocks, H))
        return [th, th, TensorType(F32, (T, blocks, H, HD))]

    def tile_axes(self, ins, outs, attrs):
        return [("items", outs[0].shape[0] * outs[0].shape[1]), ("heads", ins[0].shape[1])]


@register_op
class CsaMergeNorm(_SparseOp):
    """Merge the per-block partials in block order, out = o / (l + exp(sink − m)), inverse RoPE at the query
    position, bf16, heads packed group-major → [o_groups, T, hpg·HD] (merge_norm)."""
    name = "csa_merge_norm"
    operands = ("m", "l", "o", "sink", "cos_il", "sin_signed")
    attrs = {"o_groups": Attr("int", REQUIRED)}
    reference = numpy_reference("sparse", "csa_merge_norm")

    def infer(self, ins, attrs):
        m, l, o, sink, cos, sin = ins
        _partials(m, l, o, "block")
        _sink(sink, o.shape[2])
        heads = TensorType(F32, (o.shape[0], o.shape[2], o.shape[3]))
        return [_packed(heads, cos, sin, attrs["o_groups"])]

    def tile_axes(self, ins, outs, attrs):
        return [("heads", ins[2].shape[2])]


# ---- HCA ----------------------------------------------------------------------------------------------------
@register_op
class HcaRawTranspose(_SparseOp):
    """Window rows [T, W, HD] → Kᵀ tiles [T, HD, W] (hca_raw_transpose)."""
    name = "hca_raw_transpose"
    operands = ("rows",)
    reference = numpy_reference("sparse", "hca_raw_transpose")

    def infer(self, ins, attrs):
        rows = ins[0]
        expect_rank(rows, 3, "rows [T, W, HD]")
        return [rows.with_shape((rows.shape[0], rows.shape[2], rows.shape[1]))]

    def tile_axes(self, ins, outs, attrs):
        return [("window", ins[0].shape[1])]


def _raw_window_attn(q: TensorType, rows: TensorType, idx: TensorType,
                     rows_t: TensorType | None = None) -> list[TensorType]:
    """The raw-window stream's shape rule (hca_raw_attn with its Kᵀ copy, hca_raw_attn_direct without):
    rows [T, W, HD] gathered per token, indices [T, W] → m, l f32 [T, H] and heads f32 [T, H, HD]."""
    _q(q)
    T, H, HD = q.shape
    expect_rank(rows, 3, "rows [T, W, HD]")
    expect_same_dim(rows.shape[0], T, "rows tokens")
    expect_same_dim(rows.shape[2], HD, "rows width vs head_dim")
    if rows_t is not None:
        expect(rows_t.shape == (rows.shape[0], rows.shape[2], rows.shape[1]), f"rows_t {rows_t} is not rows {rows}ᵀ")
    _index_matrix(idx, "indices", T)
    expect_same_dim(idx.shape[1], rows.shape[1], "indices width vs window")
    th = TensorType(F32, (T, H))
    return [th, th, TensorType(F32, q.shape)]


_LOOKAHEAD = Attr("int", doc="QK look-ahead across queries (pypto-lib #1187), a kernel-template option: the "
                              "template issues the q·Kᵀ of the query this many ahead before the softmax and P·V of "
                              "the current one (absent: in order)")


def _lookahead(attrs) -> None:
    la = attrs.get("lookahead")
    expect(la is None or la >= 0, f"lookahead must be non-negative, got {la}")


@register_op
class HcaRawAttn(_SparseOp):
    """The raw-window stream: one tile over the gathered window rows (valid where index ≥ 0) → stream state
    m, l f32 [T, H] and unnormalised heads f32 [T, H, HD] (hca_raw_attn)."""
    name = "hca_raw_attn"
    operands = ("q", "rows", "rows_t", "indices")
    results = ("m", "l", "heads")
    attrs = {"scale": Attr("float", REQUIRED), "lookahead": _LOOKAHEAD}
    core = "mix"
    reference = numpy_reference("sparse", "hca_raw_attn")

    def infer(self, ins, attrs):
        q, rows, rows_t, idx = ins
        _lookahead(attrs)
        return _raw_window_attn(q, rows, idx, rows_t)

    def tile_axes(self, ins, outs, attrs):
        return [("tokens", ins[0].shape[0]), ("heads", ins[0].shape[1])]


@register_op
class HcaRawAttnDirect(_SparseOp):
    """The raw-window stream reading the gathered rows only: the kernel loads each token's window rows into the
    cube's buffer and takes q·Kᵀ on a transposed view of them, so no Kᵀ copy exists (pypto-lib #1035). Same
    results as hca_raw_attn: m, l f32 [T, H], unnormalised heads f32 [T, H, HD] (hca_raw_attn_direct)."""
    name = "hca_raw_attn_direct"
    operands = ("q", "rows", "indices")
    results = ("m", "l", "heads")
    attrs = {"scale": Attr("float", REQUIRED), "lookahead": _LOOKAHEAD}
    core = "mix"
    reference = numpy_reference("sparse", "hca_raw_attn_direct")

    def infer(self, ins, attrs):
        q, rows, idx = ins
        _lookahead(attrs)
        return _raw_window_attn(q, rows, idx)

    def tile_axes(self, ins, outs, attrs):
        return [("tokens", ins[0].shape[0]), ("heads", ins[0].shape[1])]


@register_op
class HcaRequestKvGather(_SparseOp):
    """One raw-window gather per request (pypto-lib #1098): the rows its `seq` tokens attend, W + seq − 1 of
    them, in window order: the first token's window rows, then each later token's newest row. rows[b] =
    kv_cache[ridx[b]] (−1 → zeros), ridx[b] = indices[t0, :e0] ++ [indices[t0+k, e_k − 1] for k = 1 … seq−1],
    −1 past it, where e_t = 1 + the last column of token t that holds an index (hca_request_kv_gather).
    `contiguous`: the kernel copies the W + seq − 1 rows as one run when they are consecutive cache rows
    (pypto-lib #1170 (a)), else row runs; the same values either way."""
    name = "hca_request_kv_gather"
    operands = ("kv_cache", "indices")
    results = ("rows",)
    attrs = {"seq": Attr("int", REQUIRED), "contiguous": Attr("bool", False, doc="one-run copy when consecutive")}
    reference = numpy_reference("sparse", "hca_request_kv_gather")

    def infer(self, ins, attrs):
        cache, idx = ins
        expect_rank(cache, 2, "kv_cache [rows, HD]")
        expect(idx.rank == 2 and idx.dtype == I32, f"indices must be i32[T, W], got {idx}")
        seq, width = attrs["seq"], idx.shape[1].value()
        expect(seq > 0, f"seq must be positive, got {seq}")
        expect(width is not None, f"the window {idx.shape[1]} must be a known integer")
        tokens = idx.shape[0].value()
        expect(tokens is None or tokens % seq == 0, f"T = {tokens} is not a whole number of requests of {seq}")
        return [TensorType(cache.dtype, (D.floordiv(idx.shape[0], seq), D.Const(width + seq - 1), cache.shape[1]))]

    def tile_axes(self, ins, outs, attrs):
        return [("requests", outs[0].shape[0])]


@register_op
class HcaRawAttnRequest(_SparseOp):
    """The raw-window stream on the per-request rows of hca_request_kv_gather (pypto-lib #1098): token t, the k-th
    of request b, attends rows[b, d_t : d_t + W] with d_t = e_{t0} + k − e_t (its window's first row in the
    request's list), valid where indices[t] ≥ 0 (keys zero elsewhere, as the per-token gather had them). m, l f32
    [T, H], unnormalised heads f32 [T, H, HD] (hca_raw_attn_request)."""
    name = "hca_raw_attn_request"
    operands = ("q", "rows", "indices")
    results = ("m", "l", "heads")
    attrs = {"scale": Attr("float", REQUIRED), "seq": Attr("int", REQUIRED), "lookahead": _LOOKAHEAD}
    core = "mix"
    reference = numpy_reference("sparse", "hca_raw_attn_request")

    def infer(self, ins, attrs):
        q, rows, idx = ins
        _q(q)
        _lookahead(attrs)
        T, H, HD = q.shape
        seq = attrs["seq"]
        expect(seq > 0, f"seq must be positive, got {seq}")
        expect_rank(rows, 3, "rows [B, W + seq − 1, HD]")
        expect_same_dim(rows.shape[2], HD, "rows width vs head_dim")
        _index_matrix(idx, "indices", T)
        expect_same_dim(rows.shape[0], D.floordiv(T, seq), "rows requests vs T / seq")
        width = idx.shape[1].value()
        expect(width is not None and rows.shape[1].value() == width + seq - 1,
               f"rows {rows} must hold W + seq − 1 = {idx.shape[1]} + {seq - 1} rows per request")
        th = TensorType(F32, (T, H))
        return [th, th, TensorType(F32, q.shape)]

    def tile_axes(self, ins, outs, attrs):
        return [("tokens", ins[0].shape[0]), ("heads", ins[0].shape[1])]


@register_op
class HcaCmpWorkGather(_SparseOp):
    """Per request, compressed rows 0 … works·work_rows − 1 through cmp_block_table: rows [B, works·work_rows, HD]
    (unmapped → 0) and their physical rows i32 [B, works·work_rows] (−1 unmapped) (hca_cmp_work_gather)."""
    name = "hca_cmp_work_gather"
    operands = ("cmp_kv", "cmp_block_table")
    index_operands = {1: (0, 0, "block_size")}
    results = ("rows", "phys")
    attrs = {"block_size": Attr("int", REQUIRED), "work_rows": Attr("int", REQUIRED), "works": Attr("int", REQUIRED),
             "items_per_block": Attr("int", doc="(request, work item) pairs one block gathers in turn "
                                                   "(pypto-lib #1227 CMP_GATHER_WORK_TILE)")}
    reference = numpy_reference("sparse", "hca_cmp_work_gather")

    def infer(self, ins, attrs):
        cache, table = ins
        expect_rank(cache, 2, "cmp_kv [rows, HD]")
        expect_table(table, "cmp_block_table")
        for n in ("block_size", "work_rows", "works"):
            expect(attrs[n] > 0, f"{n} must be positive, got {attrs[n]}")
        width = D.Const(attrs["works"] * attrs["work_rows"])
        return [TensorType(cache.dtype, (table.shape[0], width, cache.shape[1])),
                TensorType(I32, (table.shape[0], width))]


@register_op
class HcaCmpQkPv(_SparseOp):
    """Per-(token, work item) partials over the request's compressed rows, valid where row < n[t] =
    min((pos+1)//R, kv_seq_len//R, max_rows) and mapped; items past n are neutral. (m, l) f32 [T, works, H],
    o f32 [T, works, H, HD] (hca_cmp_qk_pv)."""
    name = "hca_cmp_qk_pv"
    operands = ("q", "cmp_rows", "cmp_phys", "positions", "kv_seq_len")
    results = ("m", "l", "o")
    attrs = {
        "scale": Attr("float", REQUIRED),
        "ratio": Attr("int", REQUIRED),
        "seq": Attr("int", REQUIRED),
        "work_rows": Attr("int", REQUIRED),
        "max_rows": Attr("int", REQUIRED),
        "aiv_split": Attr("int", doc="vector softmax of each token group split over this many subgraphs (the "
                                        "AIVs of a core group, pypto-lib #1187)"),
    }
    core = "mix"
    reference = numpy_reference("sparse", "hca_cmp_qk_pv")

    def infer(self, ins, attrs):
        q, rows, phys, pos, kv_len = ins
        _q(q)
        T, H, HD = q.shape
        expect_rank(rows, 3, "cmp_rows [B, L, HD]")
        expect_same_dim(rows.shape[2], HD, "cmp_rows width vs head_dim")
        expect(phys.rank == 2 and phys.dtype == I32 and phys.shape == rows.shape[:2],
               f"cmp_phys must be i32{list(rows.shape[:2])}, got {phys}")
        expect_index_vector(pos, "positions", T)
        expect_index_vector(kv_len, "kv_seq_len", rows.shape[0])
        wr, n = attrs["work_rows"], rows.shape[1].value()
        expect(wr > 0 and (n is None or n % wr == 0), f"work_rows {wr} does not divide {rows.shape[1]} rows")
        works = D.floordiv(rows.shape[1], wr)
        th = TensorType(F32, (T, works, H))
        return [th, th, TensorType(F32, (T, works, H, HD))]

    def tile_axes(self, ins, outs, attrs):
        return [("items", outs[0].shape[0] * outs[0].shape[1])]


@register_op
class HcaStreamMerge(_SparseOp):
    """Fold the work-item partials into the raw stream in ascending work order, then out = o / (l + exp(sink − m)):
    normalised f32 [T, H, HD] written back to stream_heads (hca_stream_merge)."""
    name = "hca_stream_merge"
    operands = ("m", "l", "heads", "cmp_m", "cmp_l", "cmp_o", "sink")
    reference = numpy_reference("sparse", "hca_stream_merge")

    def infer(self, ins, attrs):
        m, l, heads, cm, cl, co, sink = ins
        _stream(m, l, heads, "stream")
        _partials(cm, cl, co, "work-item")
        expect_same_dim(co.shape[0], heads.shape[0], "work-item tokens")
        expect(co.shape[2:] == heads.shape[1:], f"work-item partials {co} do not match the stream {heads}")
        _sink(sink, heads.shape[1])
        return [heads]

    def tile_axes(self, ins, outs, attrs):
        return [("tokens", ins[2].shape[0]), ("heads", ins[2].shape[1])]


@register_op
class HcaStreamPack(_SparseOp):
    """Inverse RoPE at the query position, bf16, heads packed group-major → [o_groups, T, hpg·HD]
    (hca_stream_pack)."""
    name = "hca_stream_pack"
    operands = ("heads", "cos_il", "sin_signed", "swap")
    attrs = {"o_groups": Attr("int", REQUIRED)}
    reference = numpy_reference("sparse", "hca_stream_pack")

    def infer(self, ins, attrs):
        heads, cos, sin, swap = ins
        expect(heads.rank == 3 and heads.dtype == F32, f"heads must be f32[T, H, HD], got {heads}")
        packed = _packed(heads, cos, sin, attrs["o_groups"])
        _swap(swap, cos)
        return [packed]

    def tile_axes(self, ins, outs, attrs):
        return [("tokens", ins[0].shape[0]), ("heads", ins[0].shape[1])]


@register_op
class HcaStreamMergePack(_SparseOp):
    """hca_stream_merge → hca_stream_pack fused (dspark-model.md §6(c), 48 cyclic workers): merge the raw stream
    with the work-item partials (ascending), sink, inverse RoPE, bf16, pack. Bit-identical to the two ops.
    `stage_heads` (a kernel-template option): the seed's form, each item's normalised f32 heads stored to a GM
    scratch and read back for the inverse RoPE and pack (before pypto-lib #1229); the values are the same."""
    name = "hca_stream_merge_pack"
    operands = ("m", "l", "heads", "cmp_m", "cmp_l", "cmp_o", "sink", "cos_il", "sin_signed", "swap")
    attrs = {"o_groups": Attr("int", REQUIRED), "stage_heads": Attr("bool")}   # absent: on chip
    reference = numpy_reference("sparse", "hca_stream_merge_pack")

    def infer(self, ins, attrs):
        merged = HcaStreamMerge().infer(ins[:7], {})[0]
        return HcaStreamPack().infer([merged, *ins[7:]], attrs)

    def tile_axes(self, ins, outs, attrs):
        return [("items", ins[2].shape[0] * ins[2].shape[1])]

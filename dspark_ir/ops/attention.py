"""SWA sparse-attention ops (seed §3.2 stages 5, 6a, 6b, 6d). dsv4-math §6.

`swa_cache_insert_valid_bias` is the fused pre-#e form: one `at` task that scatters the current tokens' kv rows
into the cache (in place) and builds the window's additive valid bias. `swa_cache_writeback` and
`swa_valid_bias` are its two halves (the split form of dspark-model.md §6(e)); together they compute the same
bits. `rope_cs` (6c) is a `rope_tables` node.
"""
from __future__ import annotations

from .. import dims as D
from ..types import DType, TensorType
from .base import REQUIRED, Attr, OpDef, expect, expect_rank, expect_same_dim, numpy_reference, register_op

F32, BF16, I32 = DType.fp32, DType.bf16, DType.i32


class _AttnOp(OpDef):
    family = "attention"


def _index_rows(t: TensorType, what: str, rows: D.Dim | None = None) -> None:
    expect(t.dtype == I32, f"{what} must be i32, got {t}")
    if rows is not None:
        expect_same_dim(t.shape[0], rows, f"{what} rows")


def _cache_insert(kv: TensorType, cache: TensorType, slots: TensorType) -> TensorType:
    """The kv_cache written in place by kv[t] at slot_mapping[t] (the fused insert's and the writeback's rule)."""
    expect_rank(kv, 2, "kv [T, head_dim]")
    expect_rank(cache, 2, "kv_cache [rows, head_dim]")
    expect(cache.dtype == kv.dtype, f"kv_cache dtype {cache.dtype} differs from kv {kv.dtype}")
    expect_same_dim(cache.shape[1], kv.shape[1], "kv_cache width vs head_dim")
    expect(slots.rank == 1, f"slot_mapping must be rank 1, got {slots}")
    _index_rows(slots, "slot_mapping", kv.shape[0])
    return cache


def _valid_bias(lens: TensorType, window: int) -> TensorType:
    """sparse_bias [rows of lens, window] f32 (the fused insert's and the bias half's rule)."""
    expect(lens.rank == 1, f"lens must be rank 1, got {lens}")
    _index_rows(lens, "lens")
    expect(window > 0, f"window must be positive, got {window}")
    return TensorType(F32, (lens.shape[0], D.Const(window)))


@register_op
class SwaCacheInsertValidBias(_AttnOp):
    """kv_cache[slot[t]] = kv[t] (slot −1 skipped; in place) and sparse_bias[T, window] = 0 for columns < lens[t],
    −1e20 elsewhere (swa_cache_insert_valid_bias). The kv rows (the KV side's: the TP group's at TP > 1) and the
    lens rows (the rank's query tokens) may differ."""
    name = "swa_cache_insert_valid_bias"
    operands = ("kv", "kv_cache", "slot_mapping", "lens")
    index_operands = {2: (1, 0)}
    results = ("kv_cache", "bias")
    aliases = {0: 1}
    attrs = {"window": Attr("int", REQUIRED)}
    reference = numpy_reference("attention", "swa_cache_insert_valid_bias")

    def infer(self, ins, attrs):
        kv, cache, slots, lens = ins
        return [_cache_insert(kv, cache, slots), _valid_bias(lens, attrs["window"])]

    def tile_axes(self, ins, outs, attrs):
        return [("rows", ins[0].shape[0])]


@register_op
class SwaCacheWriteback(_AttnOp):
    """kv_cache[slot[t]] = kv[t] (slot −1 skipped; in place): the writeback half of the split form (#e)."""
    name = "swa_cache_writeback"
    operands = ("kv", "kv_cache", "slot_mapping")
    index_operands = {2: (1, 0)}
    aliases = {0: 1}
    reference = numpy_reference("attention", "swa_cache_writeback")

    def infer(self, ins, attrs):
        return [_cache_insert(*ins)]

    def tile_axes(self, ins, outs, attrs):
        return [("rows", ins[0].shape[0])]


@register_op
class SwaValidBias(_AttnOp):
    """sparse_bias[T, window] = 0 for columns < lens[t], −1e20 elsewhere: the bias half of the split form (#e)."""
    name = "swa_valid_bias"
    operands = ("lens",)
    attrs = {"window": Attr("int", REQUIRED)}
    reference = numpy_reference("attention", "swa_valid_bias")

    def infer(self, ins, attrs):
        return [_valid_bias(ins[0], attrs["window"])]

    def tile_axes(self, ins, outs, attrs):
        return [("rows", ins[0].shape[0])]


@register_op
class SwaGatherKv(_AttnOp):
    """rows[t, j] = kv_cache[indices[t, j]] (−1 → zeros) → [T, W, head_dim] (swa_gather_kv)."""
    name = "swa_gather_kv"
    operands = ("kv_cache", "indices")
    reference = numpy_reference("attention", "swa_gather_kv")

    def infer(self, ins, attrs):
        cache, idx = ins
        expect_rank(cache, 2, "kv_cache [rows, head_dim]")
        expect_rank(idx, 2, "indices [T, window]")
        _index_rows(idx, "indices")
        return [TensorType(cache.dtype, (idx.shape[0], idx.shape[1], cache.shape[1]))]

    def tile_axes(self, ins, outs, attrs):
        return [("window", ins[1].shape[1])]


@register_op
class QkPv(_AttnOp):
    """Tile softmax partials over the gathered rows: (m, l) f32[T, H] and o f32[T, H, head_dim]; k_tile-wide tiles
    merged in order; masked where bias < 0 or index < 0 (qk_pv)."""
    name = "qk_pv"
    operands = ("q", "kv_rows", "bias", "indices")
    results = ("m", "l", "o")
    attrs = {"scale": Attr("float", REQUIRED), "k_tile": Attr("int", REQUIRED)}
    core = "mix"
    reference = numpy_reference("attention", "qk_pv")

    def infer(self, ins, attrs):
        q, rows, bias, idx = ins
        expect_rank(q, 3, "q [T, heads, head_dim]")
        expect_rank(rows, 3, "kv_rows [T, window, head_dim]")
        expect_same_dim(rows.shape[0], q.shape[0], "kv_rows tokens vs q tokens")
        expect_same_dim(rows.shape[2], q.shape[2], "kv_rows width vs head_dim")
        expect(bias.rank == 2 and bias.dtype == F32, f"bias must be f32[T, window], got {bias}")
        expect_same_dim(bias.shape[0], q.shape[0], "bias rows")
        expect_same_dim(bias.shape[1], rows.shape[1], "bias width vs window")
        expect_rank(idx, 2, "indices [T, window]")
        _index_rows(idx, "indices", q.shape[0])
        expect_same_dim(idx.shape[1], rows.shape[1], "indices width vs window")
        kt, w = attrs["k_tile"], rows.shape[1].value()
        expect(kt > 0 and (w is None or w % kt == 0), f"k_tile {kt} does not divide the window {rows.shape[1]}")
        th = TensorType(F32, (q.shape[0], q.shape[1]))
        return [th, th, TensorType(F32, q.shape)]

    def tile_axes(self, ins, outs, attrs):
        return [("tokens", ins[0].shape[0])]


@register_op
class MergeNorm(_AttnOp):
    """o / (l + exp(sink − m)), inverse RoPE at the query position, bf16, heads packed group-major →
    [o_groups, T, heads_per_group·head_dim] (merge_norm)."""
    name = "merge_norm"
    operands = ("m", "l", "o", "sink", "cos_il", "sin_signed")
    attrs = {"o_groups": Attr("int", REQUIRED)}
    reference = numpy_reference("attention", "merge_norm")

    def infer(self, ins, attrs):
        m, l, o, sink, cos, sin = ins
        expect(o.rank == 3 and o.dtype == F32, f"o must be f32[T, heads, head_dim], got {o}")
        for name, t in (("m", m), ("l", l)):
            expect(t.rank == 2 and t.dtype == F32, f"{name} must be f32[T, heads], got {t}")
            expect(t.shape == o.shape[:2], f"{name} {t} does not match o {o}")
        expect(sink.rank == 1 and sink.dtype == F32, f"sink must be f32[heads], got {sink}")
        expect_same_dim(sink.shape[0], o.shape[1], "sink length vs heads")
        for name, t in (("cos_il", cos), ("sin_signed", sin)):
            expect_rank(t, 2, name)
            expect_same_dim(t.shape[0], o.shape[0], f"{name} rows")
        g, h = attrs["o_groups"], o.shape[1].value()
        expect(g > 0 and (h is None or h % g == 0), f"{g} o_groups do not divide {o.shape[1]} heads")
        width = D.mul(D.floordiv(o.shape[1], g), o.shape[2])
        return [TensorType(BF16, (D.Const(g), o.shape[0], width))]

    def tile_axes(self, ins, outs, attrs):
        return [("heads", ins[2].shape[1])]

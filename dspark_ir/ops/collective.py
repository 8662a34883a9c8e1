"""Collective ops of the TP O path (seed §3.5, §4): the all-to-all of O groups and the f32 reduce-scatter.

Collective references receive every rank's operands and return one result per rank (design.md "Collective ops").
In the seed each exchange is one incore / `at` task per rank (put → barrier 1 → copy-out or sum → barrier 2 →
reset). The all-to-all is written as two ops so that its copy-out wave is visible to passes (dspark-model.md §6(b)):

    %o.o_group_a2a          = o_group_a2a(%packed) {tp, t_pad}          put + barrier 1: this rank's exchange
                                                                        window (pad rows zero)
    %o.o_group_a2a.copy_out = window_copy_out(%o.o_group_a2a) {axis = 1, rows = tp*T}
                                                                        copy-out wave of the data rows into a local
                                                                        tensor, barrier 2 (every peer has copied
                                                                        out: the window may be rewritten), reset

The `typed-gather` pass removes the copy-out: consumers read the window rows directly and a `window_release`
(dspark_ir/ops/window_release.py) after the last consumer takes over barrier 2 and the reset.
The context-parallel all-gather of a payload over the TP group (the seed's decode_cp_allgather /
decode_cp_token_allgather steps: push → payload wait → read-back → read-back wait → retire) is written the same way:

    %x.cp_allgather          = cp_allgather(%payload) {tp}                 push + payload wait: this rank's window
                                                                        [tp·T, …] holding every rank's rows
    %x.cp_allgather.copy_out = window_copy_out(%x.cp_allgather) {axis = 0, rows = tp*T}
                                                                        read-back + read-back wait + retire

All of them are rendezvous collectives: every rank's task meets its peers (the barrier); the credit
signal window of the TP credit barrier (§5) is implicit in them.

The `dequant-into-owner-windows` pass (pypto-lib #980 / #998) fuses the O-B dequant into the reduce-scatter:

    %o.tp_o_b_dequant_publish = tp_o_dequant_reduce_scatter(%wo_b_scale, %acc_0, %s_0, …) {tp, workers, …}
        each publish worker dequantises its O-B tiles of every owner's rows and stores them straight into the
        owner's reduce window (no f32 partial in GM), notifies the owners after its stores drained; then the owner
        waits for every source's workers, sums its window's source lanes in ascending rank order in f32 and
        rounds once (`reduce_workers` workers), meets its peers (barrier 2) and resets the credits.
"""
from __future__ import annotations

from .. import dims as D
from ..types import DType, TensorType
from .base import (
    REQUIRED,
    Attr,
    CrossRank,
    OpDef,
    expect,
    expect_dtype,
    expect_rank,
    expect_same_dim,
    numpy_reference,
    register_op,
)
from .oproj import OProjBDequant
from .sparse import HcaStreamMergePack
from .wire import check_typed_payload, check_wire, typed_results, wire_width


def exact_div(d: D.Dim, k: int) -> D.Dim:
    """d // k, simplified when d is k·x (the dims module does not fold (k·x)//k)."""
    if isinstance(d, D.BinOp) and d.op == "*":
        for a, b in ((d.a, d.b), (d.b, d.a)):
            if a == D.Const(k):
                return b
            if isinstance(a, D.Const) and a.n % k == 0:
                return D.mul(a.n // k, b)
    return D.floordiv(d, k)


class _CollectiveOp(OpDef):
    family = "collective"
    collective = True
    core = "mix"


@register_op
class OGroupA2A(_CollectiveOp):
    """All-to-all of O groups, put + barrier 1: packed [G, T, w] on every rank → this rank's exchange window
    [G/tp, tp·T_PAD, w] holding its groups for the whole TP group's tokens, data row src_rank·T + t, rows
    tp·T … tp·T_PAD − 1 zero (T_PAD = T rounded up to `t_pad`, the seed's LOCAL_T_PAD; GROUP_T_PAD = tp·T_PAD)
    (o_group_a2a). With t_pad = 1 the window has no pad rows."""
    name = "o_group_a2a"
    operands = ("packed",)
    attrs = {"tp": Attr("int", REQUIRED), "t_pad": Attr("int", 1)}
    reference = numpy_reference("collective", "o_group_a2a")
    cross_rank = CrossRank("put (this rank's groups into every peer's window) -> o_group_a2a_wait", "overlap", 1)

    def infer(self, ins, attrs):
        p = ins[0]
        expect_rank(p, 3, "packed [groups, T, group width]")
        tp, pad = attrs["tp"], attrs["t_pad"]
        g = p.shape[0].value()
        expect(tp >= 1 and (g is None or g % tp == 0), f"tp {tp} does not divide {p.shape[0]} groups")
        expect(pad >= 1, f"t_pad must be positive, got {pad}")
        rows = D.mul(tp * pad, D.ceildiv(p.shape[1], pad))
        return [TensorType(p.dtype, (exact_div(p.shape[0], tp), rows, p.shape[2]))]


@register_op
class HcaStreamMergePackPublish(_CollectiveOp):
    """hca_stream_merge_pack publishing its packed tiles straight into the owners' exchange windows (pypto-lib
    #1170 (b), hca_stream_merge_pack_publish): the merge-pack's operands on every rank → this rank's exchange
    window, o_group_a2a's result (put + barrier 1) of the packed heads: [G/tp, tp·T_PAD, hg·HD], data row
    src_rank·T + t, pad rows zero. `publish_tokens` tokens per item (ATTENTION_PUBLISH_T_TILE = 4): each item's
    merged, rotated, bf16-rounded heads are put from the worker's buffer as one contiguous row block per O group
    (its rows are consecutive in the owner's window), so no packed tensor is staged in GM and there is no
    separate put task; `workers` (a common attribute) publish workers, then the notify and barrier 1."""
    name = "hca_stream_merge_pack_publish"
    operands = HcaStreamMergePack.operands
    attrs = {"o_groups": Attr("int", REQUIRED), "tp": Attr("int", REQUIRED), "t_pad": Attr("int", 1),
             "publish_tokens": Attr("int", 4)}
    core = "vector"
    reference = numpy_reference("collective", "hca_stream_merge_pack_publish")
    cross_rank = CrossRank("hca_stream_merge_pack_publish (its workers' remote stores) -> o_group_a2a_wait",
                           "overlap", 1)

    def infer(self, ins, attrs):
        [packed] = HcaStreamMergePack().infer(ins, {"o_groups": attrs["o_groups"]})
        expect(attrs["publish_tokens"] >= 1, f"publish_tokens must be positive, got {attrs['publish_tokens']}")
        return OGroupA2A().infer([packed], {"tp": attrs["tp"], "t_pad": attrs["t_pad"]})

    def tile_axes(self, ins, outs, attrs):
        return HcaStreamMergePack().tile_axes(ins, outs, attrs)


@register_op
class CpAllGather(_CollectiveOp):
    """Context-parallel all-gather, push + payload wait: payload [T, …] on every rank → this rank's window
    [tp·T, …] holding every rank's payload rows, rank-major (row src_rank·T + t), the same on every rank
    (decode_cp_allgather's push / payload wait; the read-back, its wait and the retire are the window_copy_out
    that follows). The payload keeps its dtype: the typed form, no wire pack or unpack."""
    name = "cp_allgather"
    operands = ("payload",)
    attrs = {"tp": Attr("int", REQUIRED)}
    reference = numpy_reference("collective", "cp_allgather")
    cross_rank = CrossRank("push (this rank's rows into every rank's window) -> payload wait", "overlap", 1,
                           readback_signals=2)      # its window_copy_out: read-back -> read-back wait -> retire

    def infer(self, ins, attrs):
        p, tp = ins[0], attrs["tp"]
        expect(p.rank >= 1, f"payload must have a row axis, got {p}")
        expect(tp >= 1, f"tp must be positive, got {tp}")
        return [p.with_shape([D.mul(tp, p.shape[0])] + list(p.shape[1:]))]


@register_op
class CpOwnRows(_CollectiveOp):
    """Rows [tp·T, …] gathered over the TP group → the same rows on every rank with every other rank's rows
    replaced by `fill` (rank r keeps rows r·T … (r+1)·T − 1). Modelling glue, not a seed task: the seed's
    context-parallel SWA writes the whole group's KV rows into a group-wide cache (its slot mapping has the
    group's rows); our per-rank kv_cache holds the rank's own requests, so the other ranks' slots become −1
    (skipped) and each rank's cache is the goldens' (docs/seed-baselines.md "SWA")."""
    name = "cp_own_rows"
    operands = ("rows",)
    attrs = {"tp": Attr("int", REQUIRED), "fill": Attr("int", -1)}
    reference = numpy_reference("collective", "cp_own_rows")
    cross_rank = CrossRank("modelling glue: no seed task, nothing crosses the link")

    def infer(self, ins, attrs):
        r, tp = ins[0], attrs["tp"]
        expect(r.rank >= 1, f"rows must have a row axis, got {r}")
        n = r.shape[0].value()
        expect(tp >= 1 and (n is None or n % tp == 0), f"tp {tp} does not divide {r.shape[0]} rows")
        return [r]


@register_op
class CpTypedAllGather(_CollectiveOp):
    """The typed step's push + payload wait (seed decode_cp_csa_*_typed_allgather_step): values f32[T, W],
    scores f32[T, W][, kv bf16[T, K]] on every rank → this rank's window of wire rows bf16[tp·T, 4·W + K]
    (rank-major, the layout of ops/wire.py), the push reading the typed rows as their wire bits: no pack wave.
    Its read-back is the cp_typed_readback that follows."""
    name = "cp_typed_allgather"
    operands = ("values", "scores", "*kv")
    attrs = {"tp": Attr("int", REQUIRED)}
    reference = numpy_reference("collective", "cp_typed_allgather")
    cross_rank = CrossRank("typed push (the rows' wire bits into every rank's window) -> payload wait", "overlap", 1)

    def infer(self, ins, attrs):
        values, kv = check_typed_payload(ins)
        tp = attrs["tp"]
        expect(tp >= 1, f"tp must be positive, got {tp}")
        return [TensorType(DType.bf16, (D.mul(tp, values.shape[0]), wire_width(values, kv)))]


@register_op
class CpTypedReadback(_CollectiveOp):
    """The typed step's read-back + read-back wait + retire: the window's wire rows 0 … rows − 1 decoded straight
    into values f32[rows, W], scores f32[rows, W][, kv bf16[rows, K]] (no unpack wave), then barrier 2 and the
    credit reset (seed decode_cp_csa_*_typed_allgather_step: readback, readback_wait, retire)."""
    name = "cp_typed_readback"
    operands = ("window",)
    results = ("values", "scores", "kv")
    attrs = {"rows": Attr("dim", REQUIRED), "width": Attr("int", REQUIRED), "kv": Attr("int", 0)}
    reference = numpy_reference("collective", "cp_typed_readback")
    cross_rank = CrossRank("readback -> readback_wait -> retire", "none", 2)

    def infer(self, ins, attrs):
        w, rows = ins[0], attrs["rows"]
        check_wire(w, attrs["width"], attrs["kv"], "window")
        n, extent = rows.value(), w.shape[0].value()
        expect(n is None or extent is None or 0 <= n <= extent, f"rows {rows} exceed the window's {w.shape[0]}")
        return typed_results(rows, attrs["width"], attrs["kv"])


@register_op
class CpRankRows(_CollectiveOp):
    """Each of its operands' rows [tp·T, …] gathered over the TP group → this rank's own rows [T, …] (rank r:
    rows r·T … (r+1)·T − 1). Modelling glue, not a seed task: the seed's compressors pool, and its caches take,
    the whole group's rows (group-wide state); our per-rank inputs hold the rank's own requests, so each rank
    keeps its own rows of the gathered payload (docs/seed-baselines.md "CSA", "HCA"). Rank-aware, so a collective
    in the IR (it meets its peers like one: the layers chain it)."""
    name = "cp_rank_rows"
    operands = ("rows", "*more")
    results = ("out", "out1", "out2")
    attrs = {"tp": Attr("int", REQUIRED)}
    reference = numpy_reference("collective", "cp_rank_rows")
    cross_rank = CrossRank("modelling glue: no seed task, nothing crosses the link")

    def infer(self, ins, attrs):
        tp = attrs["tp"]
        out = []
        for r in ins:
            expect(r.rank >= 1, f"rows must have a row axis, got {r}")
            n = r.shape[0].value()
            expect(tp >= 1 and (n is None or n % tp == 0), f"tp {tp} does not divide {r.shape[0]} rows")
            expect_same_dim(r.shape[0], ins[0].shape[0], "rows of every operand")
            out.append(r.with_shape([exact_div(r.shape[0], tp)] + list(r.shape[1:])))
        return out


@register_op
class WindowCopyOut(_CollectiveOp):
    """Copy-out wave of an exchange window: the data rows 0 … rows − 1 along `axis` into a local tensor (pad rows
    skipped), then barrier 2 (every peer has copied out, so the window may be overwritten) and the credit reset.
    The unpack stage of the seed's o_group_a2a / KV all-gather steps (dspark-model.md §6(b) "Before")."""
    name = "window_copy_out"
    operands = ("window",)
    attrs = {"axis": Attr("int", REQUIRED), "rows": Attr("dim", REQUIRED)}
    reference = numpy_reference("collective", "window_copy_out")
    # one signal task after the copy (o_group_a2a_complete), unless the exchange it reads declares its read-back's
    # (the CP all-gather's: read-back wait, retire)
    cross_rank = CrossRank("copy-out (o_group_a2a_gather / the CP read-back) -> barrier 2 + reset", "none", 1)

    def infer(self, ins, attrs):
        w, axis, rows = ins[0], attrs["axis"], attrs["rows"]
        expect(0 <= axis < w.rank, f"axis {axis} out of range for {w}")
        n, extent = rows.value(), w.shape[axis].value()
        expect(n is None or n >= 0, f"rows must be non-negative, got {rows}")
        expect(n is None or extent is None or n <= extent, f"rows {rows} exceed the window's {w.shape[axis]}")
        shape = list(w.shape)
        shape[axis] = rows
        return [w.with_shape(shape)]


@register_op
class TpOReduceScatter(_CollectiveOp):
    """f32 partials [tp·T, D] on every rank → this rank's rows [T, D], summed over ranks ascending in f32 and
    rounded once (tp_o_reduce_scatter)."""
    name = "tp_o_reduce_scatter"
    operands = ("partial",)
    attrs = {"tp": Attr("int", REQUIRED), "out": Attr("dtype", "bf16")}
    reference = numpy_reference("collective", "tp_o_reduce_scatter")
    cross_rank = CrossRank("publish (the peers' f32 row slices into their windows) -> tp_o_rs_wait -> reduce -> "
                           "tp_o_rs_complete", "before", 2, exchanged="partial")

    def infer(self, ins, attrs):
        p = ins[0]
        expect_rank(p, 2, "partial [tp·T, hidden]")
        expect_dtype(p, DType.fp32, "partial")
        tp = attrs["tp"]
        rows = p.shape[0].value()
        expect(tp >= 1 and (rows is None or rows % tp == 0), f"tp {tp} does not divide {p.shape[0]} rows")
        return [TensorType(attrs["out"], (exact_div(p.shape[0], tp), p.shape[1]))]


@register_op
class TpODequantReduceScatter(_CollectiveOp):
    """O-B dequant straight into the reduce-scatter owners' windows (pypto-lib #980 / #998): the operands of
    o_proj_b_dequant (wo_b_scale, then acc_g, s_g per local group: i32 [tp·T, hidden], f32 [tp·T]) on every rank
    → this rank's rows [T, hidden]: per source rank Σ_g f32(acc_g)·s_g (groups ascending) · wo_b_scale, then
    summed over the source ranks ascending in f32 and rounded once to `out` (tp_o_b_dequant_publish,
    tp_o_rs_wait, tp_o_rs_reduce, tp_o_rs_complete). `workers` (a common attribute) publish workers;
    `reduce_workers` owner-side reduce workers; `slots`: the publish scope's cross-core slots (#998; 0 = none),
    a scheduling hint."""
    name = "tp_o_dequant_reduce_scatter"
    operands = ("wo_b_scale", "*parts")
    attrs = {"tp": Attr("int", REQUIRED), "out": Attr("dtype", "bf16"), "reduce_workers": Attr("int", 8),
             "slots": Attr("int", 0)}
    core = "vector"
    reference = numpy_reference("collective", "tp_o_dequant_reduce_scatter")
    # the local part holds the publish's stores (into a window-shaped tensor) and the reduce; this rank sends its
    # f32 rows of every peer's T rows: the result's shape in f32 to each of the tp - 1 peers
    cross_rank = CrossRank("tp_o_b_dequant_publish -> tp_o_rs_wait -> reduce -> tp_o_rs_complete", "overlap", 2,
                           whole_group=False, wire="f32")

    def infer(self, ins, attrs):
        [partial] = OProjBDequant().infer(ins, {"out": "f32"})
        tp = attrs["tp"]
        rows = partial.shape[0].value()
        expect(tp >= 1 and (rows is None or rows % tp == 0), f"tp {tp} does not divide {partial.shape[0]} rows")
        expect(attrs["reduce_workers"] >= 1, f"reduce_workers must be positive, got {attrs['reduce_workers']}")
        expect(attrs["slots"] >= 0, f"slots must be non-negative, got {attrs['slots']}")
        return [TensorType(attrs["out"], (exact_div(partial.shape[0], tp), partial.shape[1]))]

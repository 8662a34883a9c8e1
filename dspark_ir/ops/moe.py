"""MoE ops: gate, routing, W8A8 experts and the EP dispatch / combine exchange (dspark-model.md §3.6).

Shapes (per rank): T tokens, D hidden, E global experts, K = topk, NL local experts, I = moe_inter,
RM = RECV_MAX = ranks·T receive rows per local expert, R = ranks.
Windows (allocated with `window`): recv_meta i32[R,NL], recv_x i8[NL,RM,D], recv_aux f32[NL,RM,2]
(x_scale, route weight), recv_route i32[NL,RM] (t·K + k), routed_y bf16[T·K,D]; signals i32[R,1].
The exchange ops are collective; the notifiers among them carry `notify_per` (see ops/signal.py).
"""
from __future__ import annotations

from ..dims import dim
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
from .signal import NOTIFY_PER, WAIT_ATTRS, expect_signal

F32, I8, I32, BF16 = DType.fp32, DType.i8, DType.i32, DType.bf16


def _t(dt: DType, *shape) -> TensorType:
    return TensorType(dt, tuple(dim(s) for s in shape))


def _vec_col(t: TensorType, rows, what: str) -> None:
    expect(t.dtype == F32 and t.rank == 2 and t.shape[0] == rows and t.shape[1] == dim(1),
           f"{what} must be f32[{rows},1], got {t}")


class _MoeOp(OpDef):
    reference = None
    family = "moe"


# ---- gate -------------------------------------------------------------------------------------------------------
@register_op
class FfnNorm(_MoeOp):
    """xg = x·w (1/rms deferred), inv_rms, x_scale (int8 dequant scale · inv_rms), q_scale = 127/amax(xg)."""
    name = "moe_ffn_norm"
    operands = ("x", "norm_w")
    results = ("xg", "inv_rms", "x_scale", "q_scale")
    attrs = {"eps": Attr("float", 1e-6)}
    reference = numpy_reference("moe", "ffn_norm")

    def infer(self, ins, attrs):
        x, w = ins
        expect_rank(x, 2, "x")
        expect_dtype(x, (BF16, F32), "x")
        expect_rank(w, 1, "norm_w")
        expect_same_dim(x.shape[1], w.shape[0], "norm_w length")
        col = _t(F32, x.shape[0], 1)
        return [x.with_dtype(F32), col, col, col]


@register_op
class XNormQuant(_MoeOp):
    """x_i8 = rint(xg · q_scale), per token."""
    name = "moe_x_norm_quant"
    operands = ("xg", "q_scale")
    reference = numpy_reference("moe", "x_norm_quant")

    def infer(self, ins, attrs):
        xg, qs = ins
        expect_rank(xg, 2, "xg")
        expect_dtype(xg, F32, "xg")
        _vec_col(qs, xg.shape[0], "q_scale")
        return [xg.with_dtype(I8)]

    def tile_axes(self, ins, outs, attrs):
        return [("t", ins[0].shape[0])]


@register_op
class Gate(_MoeOp):
    """scores[T,E] = sqrt(softplus(inv_rms · (xg @ gate_w.T)))."""
    name = "moe_gate"
    operands = ("xg", "inv_rms", "gate_w")
    reference = numpy_reference("moe", "gate")
    core = "mix"

    def infer(self, ins, attrs):
        xg, r, w = ins
        expect_rank(xg, 2, "xg")
        expect_dtype(xg, F32, "xg")
        _vec_col(r, xg.shape[0], "inv_rms")
        expect_rank(w, 2, "gate_w")
        expect_dtype(w, F32, "gate_w")
        expect_same_dim(xg.shape[1], w.shape[1], "gate_w columns")
        return [_t(F32, xg.shape[0], w.shape[0])]

    def tile_axes(self, ins, outs, attrs):
        return [("t", ins[0].shape[0]), ("e", ins[2].shape[0])]


def _route_results(scores: TensorType, topk) -> list[TensorType]:
    return [_t(I32, scores.shape[0], topk), _t(F32, scores.shape[0], topk)]


@register_op
class RouteHash(_MoeOp):
    """Hash layers: indices = tid2eid[input_ids]; weights = their normalised scores · routed_scale."""
    name = "moe_route_hash"
    operands = ("scores", "tid2eid", "input_ids")
    results = ("indices", "weights")
    attrs = {"routed_scale": Attr("float", 1.5)}
    reference = numpy_reference("moe", "route_hash")

    def infer(self, ins, attrs):
        scores, table, ids = ins
        expect_rank(scores, 2, "scores")
        expect(table.dtype == I32 and table.rank == 2, f"tid2eid must be i32[V,K], got {table}")
        expect(ids.dtype in (I32, DType.i64) and ids.rank == 1, f"input_ids must be i32/i64[T], got {ids}")
        expect_same_dim(ids.shape[0], scores.shape[0], "input_ids length")
        return _route_results(scores, table.shape[1])

    def tile_axes(self, ins, outs, attrs):
        return [("t", ins[0].shape[0])]


@register_op
class RouteSort(_MoeOp):
    """Score layers: stable top-k of scores + gate_bias; weights from the unbiased scores · routed_scale."""
    name = "moe_route_sort"
    operands = ("scores", "gate_bias")
    results = ("indices", "weights")
    attrs = {"topk": Attr("int", REQUIRED), "routed_scale": Attr("float", 1.5)}
    reference = numpy_reference("moe", "route_sort")

    def infer(self, ins, attrs):
        scores, bias = ins
        expect_rank(scores, 2, "scores")
        expect(bias.dtype == F32 and bias.rank == 1, f"gate_bias must be f32[E], got {bias}")
        expect_same_dim(bias.shape[0], scores.shape[1], "gate_bias length")
        n = scores.shape[1].value()
        expect(0 < attrs["topk"] and (n is None or attrs["topk"] <= n), f"topk {attrs['topk']} out of range")
        return _route_results(scores, attrs["topk"])

    def tile_axes(self, ins, outs, attrs):
        return [("t", ins[0].shape[0])]


# ---- experts ----------------------------------------------------------------------------------------------------
def _check_expert_weights(ws, lead=(), what="") -> tuple:
    """w1, s1, w3, s3 [*lead, I, D] / [*lead, I]; w2, s2 [*lead, D, I] / [*lead, D]. Returns (I, D)."""
    w1, s1, w3, s3, w2, s2 = ws
    n = len(lead)
    for w, s, nm in ((w1, s1, "w1"), (w3, s3, "w3"), (w2, s2, "w2")):
        expect(w.dtype == I8 and w.rank == n + 2, f"{what}{nm} must be i8 with rank {n + 2}, got {w}")
        expect(s.dtype == F32 and s.rank == n + 1 and s.shape == w.shape[:-1],
               f"{what}{nm}_scale must be f32{list(map(str, w.shape[:-1]))}, got {s}")
        expect(w.shape[:n] == tuple(lead), f"{what}{nm} leading dims {w.shape[:n]} != {tuple(lead)}")
    inter, hidden = w1.shape[n], w1.shape[n + 1]
    expect(w3.shape[n:] == (inter, hidden), f"{what}w3 must match w1: {w3} vs {w1}")
    expect(w2.shape[n:] == (hidden, inter), f"{what}w2 must be [.., D, I] = [.., {hidden}, {inter}], got {w2}")
    return inter, hidden


@register_op
class ExpertShared(_MoeOp):
    """The shared W8A8 SwiGLU expert on every token → sh bf16[T,D]."""
    name = "moe_expert_shared"
    operands = ("x_i8", "x_scale", "w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale")
    attrs = {"swiglu_limit": Attr("float", 0.0)}
    reference = numpy_reference("moe", "expert_shared")
    core = "mix"

    def infer(self, ins, attrs):
        x, xs, *ws = ins
        expect(x.dtype == I8 and x.rank == 2, f"x_i8 must be i8[T,D], got {x}")
        _vec_col(xs, x.shape[0], "x_scale")
        _, hidden = _check_expert_weights(ws)
        expect_same_dim(x.shape[1], hidden, "expert input width")
        return [_t(BF16, x.shape[0], hidden)]


@register_op
class ExpertRouted(_MoeOp):
    """Every local expert e on its first recv_count[e] compact rows → recv_y bf16[NL,RM,D] (other rows 0)."""
    name = "moe_expert_routed"
    operands = ("recv_x", "recv_scale", "recv_w", "recv_count", "w1", "w1_scale", "w3", "w3_scale", "w2",
                "w2_scale")
    attrs = {"swiglu_limit": Attr("float", 0.0)}
    reference = numpy_reference("moe", "expert_routed")
    core = "mix"

    def infer(self, ins, attrs):
        x, xs, xw, count, *ws = ins
        expect(x.dtype == I8 and x.rank == 3, f"recv_x must be i8[NL,RM,D], got {x}")
        for t, nm in ((xs, "recv_scale"), (xw, "recv_w")):
            expect(t.dtype == F32 and t.shape == x.shape[:2], f"{nm} must be f32[{x.shape[0]},{x.shape[1]}], got {t}")
        expect(count.dtype == I32 and count.shape == x.shape[:1], f"recv_count must be i32[{x.shape[0]}], got {count}")
        _, hidden = _check_expert_weights(ws, lead=x.shape[:1])
        expect_same_dim(x.shape[2], hidden, "expert input width")
        return [x.with_dtype(BF16)]


# ---- EP exchange ------------------------------------------------------------------------------------------------
@register_op
class DispatchMeta(_MoeOp):
    """Lane counts → every destination's recv_meta window row [my_rank]; notify `arrived` once per peer, wait for
    every peer's meta (≥ epoch), cumsum over sources → recv_count[NL]. A barrier: its own notifier."""
    name = "moe_dispatch_meta"
    operands = ("indices", "recv_meta", "arrived")
    results = ("recv_meta", "recv_count")
    attrs = {"value": Attr("int", 1), **WAIT_ATTRS}
    aliases = {0: 1}
    collective = True
    notify_operand = "arrived"
    wait_operand = "arrived"
    reference = numpy_reference("moe", "dispatch_meta")

    def infer(self, ins, attrs):
        idx, meta, arrived = ins
        expect(idx.dtype == I32 and idx.rank == 2, f"indices must be i32[T,K], got {idx}")
        expect(meta.dtype == I32 and meta.rank == 2, f"recv_meta must be i32[R,NL], got {meta}")
        expect_signal(arrived, "arrived")
        expect_same_dim(arrived.shape[0], meta.shape[0], "ranks of arrived and recv_meta")
        return [meta, _t(I32, meta.shape[1])]


def _check_lanes(x: TensorType, aux: TensorType, route: TensorType) -> None:
    expect(x.dtype == I8 and x.rank == 3, f"recv_x must be i8[NL,RM,D], got {x}")
    expect(aux.dtype == F32 and aux.shape == (x.shape[0], x.shape[1], dim(2)),
           f"recv_aux must be f32[{x.shape[0]},{x.shape[1]},2], got {aux}")
    expect(route.dtype == I32 and route.shape == x.shape[:2],
           f"recv_route must be i32[{x.shape[0]},{x.shape[1]}], got {route}")


@register_op
class DispatchPush(_MoeOp):
    """Put each route's row (x_i8, [x_scale, weight], route t·K + k) into its lane on the destination rank; each
    SPMD block (one per local expert) then notifies `data_arrived` on every peer."""
    name = "moe_dispatch_push"
    operands = ("indices", "weights", "x_i8", "x_scale", "recv_x", "recv_aux", "recv_route", "data_arrived")
    results = ("recv_x", "recv_aux", "recv_route")
    attrs = {"value": Attr("int", 1), "notify_per": Attr("enum", "block", choices=NOTIFY_PER.choices)}
    aliases = {0: 4, 1: 5, 2: 6}
    collective = True
    notify_operand = "data_arrived"
    reference = numpy_reference("moe", "dispatch_push")

    def infer(self, ins, attrs):
        idx, wts, x, xs, rx, raux, rroute, sig = ins
        expect(idx.dtype == I32 and idx.rank == 2, f"indices must be i32[T,K], got {idx}")
        expect(wts.dtype == F32 and wts.shape == idx.shape, f"weights must be f32 like indices {idx}, got {wts}")
        expect(x.dtype == I8 and x.rank == 2, f"x_i8 must be i8[T,D], got {x}")
        expect_same_dim(x.shape[0], idx.shape[0], "token count")
        _vec_col(xs, x.shape[0], "x_scale")
        _check_lanes(rx, raux, rroute)
        expect_same_dim(rx.shape[2], x.shape[1], "recv_x width")
        expect_signal(sig, "data_arrived")
        return [rx, raux, rroute]


@register_op
class DispatchGather(_MoeOp):
    """Compact each expert's lanes (source-major, recv_meta[src, e] rows each) into its receive buffers."""
    name = "moe_dispatch_gather"
    operands = ("recv_x", "recv_aux", "recv_route", "recv_meta")
    results = ("x", "scale", "weight", "route")
    reference = numpy_reference("moe", "dispatch_gather")

    def infer(self, ins, attrs):
        x, aux, route, meta = ins
        _check_lanes(x, aux, route)
        expect(meta.dtype == I32 and meta.rank == 2 and meta.shape[1] == x.shape[0],
               f"recv_meta must be i32[R,{x.shape[0]}], got {meta}")
        lanes = x.shape[:2]
        return [x, _t(F32, *lanes), _t(F32, *lanes), _t(I32, *lanes)]


@register_op
class Combine(_MoeOp):
    """Put every compact expert row back to its origin rank, row t·K + k of routed_y; each SPMD block (one per
    local expert) then notifies `combine_arrived` on every peer."""
    name = "moe_combine"
    operands = ("recv_y", "recv_route", "recv_meta", "routed_y", "combine_arrived")
    attrs = {"value": Attr("int", 1), "notify_per": Attr("enum", "block", choices=NOTIFY_PER.choices)}
    aliases = {0: 3}
    collective = True
    notify_operand = "combine_arrived"
    reference = numpy_reference("moe", "combine")

    def infer(self, ins, attrs):
        y, route, meta, out, sig = ins
        expect(y.dtype == BF16 and y.rank == 3, f"recv_y must be bf16[NL,RM,D], got {y}")
        expect(route.dtype == I32 and route.shape == y.shape[:2], f"recv_route must be i32[NL,RM], got {route}")
        expect(meta.dtype == I32 and meta.rank == 2 and meta.shape[1] == y.shape[0],
               f"recv_meta must be i32[R,{y.shape[0]}], got {meta}")
        expect(out.dtype == BF16 and out.rank == 2, f"routed_y must be bf16[T*K,D], got {out}")
        expect_same_dim(out.shape[1], y.shape[2], "routed_y width")
        expect_signal(sig, "combine_arrived")
        return [out]


@register_op
class SharedRouted(_MoeOp):
    """ffn_out[T,D] = rb(sh + Σ_k routed_y[t·K + k]), k ascending."""
    name = "moe_shared_routed"
    operands = ("sh", "routed_y")
    reference = numpy_reference("moe", "shared_routed")

    def infer(self, ins, attrs):
        sh, routed = ins
        expect(sh.dtype == BF16 and sh.rank == 2, f"sh must be bf16[T,D], got {sh}")
        expect(routed.dtype == BF16 and routed.rank == 2, f"routed_y must be bf16[T*K,D], got {routed}")
        expect_same_dim(routed.shape[1], sh.shape[1], "routed_y width")
        rows, tokens = routed.shape[0].value(), sh.shape[0].value()
        expect(rows is None or tokens is None or (rows == 0 if tokens == 0 else rows % tokens == 0),
               f"routed_y rows {routed.shape[0]} are not a multiple of T = {sh.shape[0]}")
        return [sh]

    def tile_axes(self, ins, outs, attrs):
        return [("t", ins[0].shape[0])]

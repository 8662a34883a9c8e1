"""MoE kernels: gate, routing, W8A8 SwiGLU experts, EP dispatch / combine (dsv4-math §8; dspark-model.md §3.6).

Numerics follow the kernels: int8 × int8 matmuls are exact (i32) and dequantised as f32(acc)·row scale·column
scale; the gate logits are one f32 rounding of the exact product (order-independent, so routing does not depend on
which rows share a call). Window layout of the EP exchange (per destination rank): lane (local expert e, source
rank s, slot) is row `s·T + slot` of expert e's `RECV_MAX = ranks·T` rows; slots follow (t, k) order.
Collective references get `per_rank[r] = [operands of rank r]` and return one result tuple per rank.
"""
from __future__ import annotations

import numpy as np

from goldens.numerics import q8

from .dtypes import BF16, f32, to_bf16
from .signal import check_wait, notify_count, notify_peers

F32 = np.float32


# ---- gate (§8.1) ------------------------------------------------------------------------------------------------
def ffn_norm(x_mixed, norm_w, *, eps=1e-6, **_):
    """Deferred RMSNorm: xg = x·w (no 1/rms), inv_rms, x_scale = q8 dequant scale · inv_rms, q_scale = 127/amax."""
    xf = f32(x_mixed)
    inv_rms = F32(1.0) / np.sqrt(np.sum(xf * xf, axis=-1, keepdims=True) / F32(xf.shape[-1]) + F32(eps))
    xg = xf * f32(norm_w)
    _, sdq = q8(xg)
    return xg, inv_rms.astype(F32), (sdq * inv_rms).astype(F32), (F32(1.0) / sdq).astype(F32)


def x_norm_quant(xg, q_scale, **_):
    """x_i8 = rint(xg · q_scale): symmetric per-token int8 (the 1/rms factor cancels)."""
    return np.rint(f32(xg) * f32(q_scale)).astype(np.int8)


def gate(xg, inv_rms, gate_w, **_):
    """scores = sqrt(softplus(inv_rms · (xg @ gate_w.T))) in the stable form; f32 [T, E]."""
    z = f32(inv_rms) * (np.asarray(xg, np.float64) @ np.asarray(gate_w, np.float64).T).astype(F32)
    return np.sqrt(np.maximum(z, F32(0.0)) + np.log1p(np.exp(-np.abs(z)))).astype(F32)


def _route_weights(scores, idx, routed_scale):
    chosen = np.take_along_axis(f32(scores), idx, axis=1)
    return (chosen / np.sum(chosen, axis=1, keepdims=True) * F32(routed_scale)).astype(F32)


def route_hash(scores, tid2eid, input_ids, *, routed_scale=1.5, **_):
    """Hash layers: experts tid2eid[input_ids], weighted by their normalised unbiased scores."""
    idx = np.asarray(tid2eid)[np.asarray(input_ids).astype(np.int64)].astype(np.int32)
    return idx, _route_weights(scores, idx, routed_scale)


def route_sort(scores, gate_bias, *, topk, routed_scale=1.5, **_):
    """Stable top-k of scores + bias (ties → lower expert id), weighted by the unbiased scores."""
    biased = f32(scores) + f32(gate_bias)
    idx = np.argsort(-biased, axis=1, kind="stable")[:, :topk].astype(np.int32)
    return idx, _route_weights(scores, idx, routed_scale)


# ---- experts (§8.2) ---------------------------------------------------------------------------------------------
def _imatmul_t(a_i8, b_i8):
    """f32(a @ b.T) for int8 operands: exact i32 accumulation (float64 is exact at these magnitudes)."""
    return (np.asarray(a_i8, np.float64) @ np.asarray(b_i8, np.float64).T).astype(F32)


def swiglu_expert(x_i8, x_scale, route_w, w1, s1, w3, s3, w2, s2, swiglu_limit):
    """One expert on rows x_i8 [N, D]: W8A8 gate/up, limits, silu·up, A8 requant, route weight, W2 → bf16."""
    xs = f32(x_scale).reshape(-1, 1)
    g = _imatmul_t(x_i8, w1) * xs * f32(s1)[None, :]
    u = _imatmul_t(x_i8, w3) * xs * f32(s3)[None, :]
    if swiglu_limit > 0:
        limit = F32(swiglu_limit)
        g = np.minimum(g, limit)
        u = np.clip(u, -limit, limit)
    with np.errstate(over="ignore"):   # exp(-g) = inf for g < -88: sigmoid's limit 0, as the device computes it
        h = g * (F32(1.0) / (np.exp(-g) + F32(1.0))) * u
    h_i8, hs = q8(h)
    row_scale = hs * f32(route_w).reshape(-1, 1)
    return to_bf16(_imatmul_t(h_i8, w2) * row_scale * f32(s2)[None, :])


def expert_shared(x_i8, x_scale, w1, s1, w3, s3, w2, s2, *, swiglu_limit=0.0, **_):
    """The shared expert on every token (route weight 1). bf16 [T, D]."""
    ones = np.ones(np.shape(x_i8)[0], F32)
    return swiglu_expert(x_i8, x_scale, ones, w1, s1, w3, s3, w2, s2, swiglu_limit)


def expert_routed(recv_x, recv_scale, recv_w, recv_count, w1, s1, w3, s3, w2, s2, *, swiglu_limit=0.0, **_):
    """Each local expert e on its first recv_count[e] compact rows; the other rows stay 0. bf16 [NL, RM, D]."""
    n_local, rows, hidden = np.shape(recv_x)
    y = np.zeros((n_local, rows, hidden), BF16)
    for e in range(n_local):
        n = int(recv_count[e])
        if n:
            y[e, :n] = swiglu_expert(recv_x[e, :n], recv_scale[e, :n], recv_w[e, :n],
                                     w1[e], s1[e], w3[e], s3[e], w2[e], s2[e], swiglu_limit)
    return y


# ---- EP dispatch (dspark-model.md §3.6 stage 4) -------------------------------------------------------------------
def _lane_counts(idx, ranks, n_local):
    """counts[dst, e]: routes of this rank's tokens to local expert e of rank dst."""
    counts = np.zeros((ranks, n_local), np.int32)
    for eid in np.asarray(idx).reshape(-1):
        counts[int(eid) // n_local, int(eid) % n_local] += 1
    return counts


def dispatch_meta(per_rank, *, ranks, expected, value=1, notifier="?", **_):
    """Publish lane counts to every destination (remote_store into recv_meta[src]), notify `arrived`, wait for all
    peers' meta, then cumsum over sources → recv_count. Returns (recv_meta, recv_count) per rank."""
    n_local = np.shape(per_rank[0][1])[1]
    metas = [np.array(ops[1], copy=True) for ops in per_rank]
    for src, ops in enumerate(per_rank):
        counts = _lane_counts(ops[0], ranks, n_local)
        for dst in range(ranks):
            metas[dst][src, :] = counts[dst]
    signals = [ops[2] for ops in per_rank]
    notify_peers(signals, int(value))
    check_wait(signals, int(expected), notifier=notifier)
    return [(m, m.sum(axis=0).astype(np.int32)) for m in metas]


def dispatch_push(per_rank, *, ranks, notify_per="block", blocks=None, value=1, **_):
    """Put every route's payload row into its destination lane (x_i8 row, [x_scale, weight], route id t·K + k),
    then each SPMD block notifies `data_arrived` on every peer. Returns the three window versions per rank."""
    recv_x = [np.array(ops[4], copy=True) for ops in per_rank]
    recv_aux = [np.array(ops[5], copy=True) for ops in per_rank]
    recv_route = [np.array(ops[6], copy=True) for ops in per_rank]
    n_local, rows = np.shape(recv_x[0])[:2]
    for src, (idx, wts, x_i8, x_scale, *_rest) in enumerate(per_rank):
        tokens, topk = np.shape(idx)
        per_src = rows // ranks
        slot = np.zeros((ranks, n_local), np.int64)
        for t in range(tokens):
            for k in range(topk):
                dst, e = divmod(int(idx[t, k]), n_local)
                row = src * per_src + slot[dst, e]
                slot[dst, e] += 1
                recv_x[dst][e, row] = x_i8[t]
                recv_aux[dst][e, row] = (x_scale[t, 0], wts[t, k])
                recv_route[dst][e, row] = t * topk + k
    notify_peers([ops[7] for ops in per_rank], notify_count(notify_per, blocks, value))
    return list(zip(recv_x, recv_aux, recv_route))


def dispatch_gather(recv_x, recv_aux, recv_route, recv_meta, **_):
    """Compact each expert's lanes (source-major) into the first recv_count[e] rows of its receive buffers."""
    n_local, rows, hidden = np.shape(recv_x)
    ranks = np.shape(recv_meta)[0]
    per_src = rows // ranks
    x = np.zeros((n_local, rows, hidden), np.int8)
    scale = np.zeros((n_local, rows), F32)
    weight = np.zeros((n_local, rows), F32)
    route = np.zeros((n_local, rows), np.int32)
    for e in range(n_local):
        b = 0
        for src in range(ranks):
            n = int(recv_meta[src, e])
            lane = slice(src * per_src, src * per_src + n)
            x[e, b:b + n] = recv_x[e, lane]
            scale[e, b:b + n] = recv_aux[e, lane, 0]
            weight[e, b:b + n] = recv_aux[e, lane, 1]
            route[e, b:b + n] = recv_route[e, lane]
            b += n
    return x, scale, weight, route


# ---- EP combine (stage 5) ---------------------------------------------------------------------------------------
def combine(per_rank, *, ranks, notify_per="block", blocks=None, value=1, **_):
    """Put each compact expert row back to its origin rank at row t·K + k of routed_y; each SPMD block then
    notifies `combine_arrived` on every peer. Returns routed_y's new version per rank."""
    out = [np.array(ops[3], copy=True) for ops in per_rank]
    for me, (recv_y, recv_route, recv_meta, *_rest) in enumerate(per_rank):
        for e in range(np.shape(recv_y)[0]):
            b = 0
            for src in range(ranks):
                n = int(recv_meta[src, e])
                out[src][recv_route[e, b:b + n]] = recv_y[e, b:b + n]
                b += n
    notify_peers([ops[4] for ops in per_rank], notify_count(notify_per, blocks, value))
    return out


def shared_routed(sh, routed_y, **_):
    """ffn_out = rb(sh + Σ_k routed_y[t·K + k]), k ascending (§8.3)."""
    tokens = np.shape(sh)[0]
    routed = f32(routed_y).reshape(tokens, -1, np.shape(sh)[1])
    acc = f32(sh)
    for k in range(routed.shape[1]):
        acc = acc + routed[:, k]
    return to_bf16(acc)

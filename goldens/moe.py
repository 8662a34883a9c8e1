"""MoE sublayer: gate (sqrt-softplus, hash or sort routing), shared and routed W8A8 experts, k-major combine,
and the EP dispatch/combine form (dsv4-math §8; dspark-model.md §3.6).

Expert weights (per output channel int8 + f32 scale): w1, w3 [E, inter, D]; w2 [E, D, inter]; scales w1_scale,
w3_scale [E, inter], w2_scale [E, D]. The shared expert uses sh_w1, sh_w3 [n_shared·inter, D], sh_w2
[D, n_shared·inter] with the same scale layout.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .config import ModelConfig
from .numerics import F32, f32, matmul, q8, rb, sigmoid

EXPERT_WEIGHTS = ("w1", "w1_scale", "w3", "w3_scale", "w2", "w2_scale")


@dataclass(frozen=True)
class Routing:
    """Gate output: expert input x_i8 [T,D] with x_scale [T,1], experts idx [T,K] and weights wts [T,K]."""

    x_i8: np.ndarray
    x_scale: np.ndarray
    idx: np.ndarray
    wts: np.ndarray


def sqrt_softplus(z) -> np.ndarray:
    """sqrt(softplus(z)) in the stable form sqrt(max(z,0) + log1p(exp(−|z|))) (§8.1)."""
    z = f32(z)
    return np.sqrt(np.maximum(z, F32(0.0)) + np.log1p(np.exp(-np.abs(z))))


def route_sort(cfg: ModelConfig, sc, gate_bias) -> np.ndarray:
    """Stable top-k of sc + bias; ties go to the lower expert id (§8.1)."""
    return np.argsort(-(sc + f32(gate_bias)), axis=1, kind="stable")[:, : cfg.topk_experts].astype(np.int32)


def route_hash(tid2eid, input_ids) -> np.ndarray:
    """Fixed experts of hash layers: tid2eid[input_ids] (§8.1)."""
    return np.asarray(tid2eid)[np.asarray(input_ids)].astype(np.int32)


def gate(cfg: ModelConfig, x_mixed, norm_w, gate_w, gate_bias, tid2eid=None, input_ids=None) -> Routing:
    """Gate of §8.1. Hash routing when tid2eid is given, else sort routing; weights use unbiased scores."""
    xf = f32(x_mixed)
    r = F32(1.0) / np.sqrt(np.sum(xf * xf, axis=-1, keepdims=True) / F32(cfg.hidden) + F32(cfg.rms_eps))
    xg = xf * f32(norm_w)
    x_i8, sdq = q8(xg)
    sc = sqrt_softplus(r * matmul(xg, f32(gate_w).T))
    idx = route_sort(cfg, sc, gate_bias) if tid2eid is None else route_hash(tid2eid, input_ids)
    chosen = np.take_along_axis(sc, idx, axis=1)
    wts = chosen / np.sum(chosen, axis=1, keepdims=True) * F32(cfg.routed_scale)
    return Routing(x_i8, sdq * r, idx, wts)


def expert_ffn(cfg: ModelConfig, x, route_w, w1, s1, w3, s3, w2, s2) -> np.ndarray:
    """One expert on rows x [N, D] (§8.2): SwiGLU with limits, A8 requant, route weight, rb(h @ W2.T)."""
    g = matmul(x, (f32(w1) * f32(s1)[:, None]).T)
    u = matmul(x, (f32(w3) * f32(s3)[:, None]).T)
    if cfg.swiglu_limit > 0:
        limit = F32(cfg.swiglu_limit)
        g = np.minimum(g, limit)
        u = np.clip(u, -limit, limit)
    h_i8, hs = q8(g * sigmoid(g) * u)
    h = f32(h_i8) * hs * f32(route_w)[:, None]
    return rb(matmul(h, (f32(w2) * f32(s2)[:, None]).T))


def expert_input(routing: Routing, rows=slice(None)) -> np.ndarray:
    """x = f32(x_i8) · x_scale for the selected token rows (§8.2)."""
    return f32(routing.x_i8[rows]) * routing.x_scale[rows]


def shared_expert(cfg: ModelConfig, routing: Routing, weights: dict) -> np.ndarray:
    """sh [T, D] bf16-valued: the shared expert(s) on every token, route weight 1 (§8.2)."""
    x = expert_input(routing)
    ones = np.ones(x.shape[0], dtype=np.float32)
    return expert_ffn(cfg, x, ones, *(weights["sh_" + n] for n in EXPERT_WEIGHTS))


def run_experts(cfg: ModelConfig, x, route_w, expert, weights: dict, first_expert: int = 0) -> np.ndarray:
    """Rows x [N, D] routed to global experts `expert` [N], computed by the experts held in `weights` (ids
    first_expert …). Each expert takes its rows in the given order (its receive buffer). Returns y [N, D]."""
    y = np.zeros_like(x)
    held = weights["w1"].shape[0]
    for local in range(held):
        rows = np.flatnonzero(expert == first_expert + local)
        if rows.size == 0:
            continue
        w = [weights[n][local] for n in EXPERT_WEIGHTS]
        y[rows] = expert_ffn(cfg, x[rows], route_w[rows], *w)
    return y


def routed_experts(cfg: ModelConfig, routing: Routing, weights: dict) -> np.ndarray:
    """routed_y [T, K, D]: every (t, k) row through expert idx[t, k], receive order (t, k) (§8.2)."""
    tokens, k = routing.idx.shape
    x = np.repeat(expert_input(routing), k, axis=0)
    y = run_experts(cfg, x, routing.wts.reshape(-1), routing.idx.reshape(-1), weights)
    return y.reshape(tokens, k, -1)


def combine(sh, routed_y) -> np.ndarray:
    """ffn_out = rb(sh + Σ_k routed_y[:, k]) summed k-major, sequentially (§8.3)."""
    acc = f32(sh)
    for k in range(routed_y.shape[1]):
        acc = acc + routed_y[:, k]
    return rb(acc)


def gate_from_inputs(cfg: ModelConfig, x_mixed, inputs: dict) -> Routing:
    return gate(cfg, x_mixed, inputs["norm_w"], inputs["gate_w"], inputs["gate_bias"],
                inputs.get("tid2eid"), inputs.get("input_ids"))


def moe_ffn(cfg: ModelConfig, x_mixed, inputs: dict, trace: dict | None = None) -> np.ndarray:
    """Single-rank MoE FFN: gate → shared ∥ routed → combine. ffn_out [T, D] bf16-valued (§8)."""
    routing = gate_from_inputs(cfg, x_mixed, inputs)
    sh = shared_expert(cfg, routing, inputs)
    routed = routed_experts(cfg, routing, inputs)
    if trace is not None:
        trace.update({"moe.x_i8": routing.x_i8, "moe.x_scale": routing.x_scale, "moe.idx": routing.idx,
                      "moe.wts": routing.wts, "moe.sh": sh, "moe.routed_y": routed})
    return combine(sh, routed)


def moe_ffn_ep(cfg: ModelConfig, x_mixed_per_rank, inputs_per_rank: list[dict]) -> list[np.ndarray]:
    """EP form over cfg.ep ranks (dspark-model.md §3.6): each rank gates its own tokens; dispatch sends row
    (t, k) to rank idx // local_experts; a rank's expert processes its receive buffer in (source rank, t, k)
    order; combine returns rows to their origin, where shared + routed are summed k-major (§8.3)."""
    routings = [gate_from_inputs(cfg, x, inp) for x, inp in zip(x_mixed_per_rank, inputs_per_rank)]
    k = cfg.topk_experts
    x_all = np.concatenate([np.repeat(expert_input(r), k, axis=0) for r in routings])
    w_all = np.concatenate([r.wts.reshape(-1) for r in routings])
    e_all = np.concatenate([r.idx.reshape(-1) for r in routings])
    y_all = np.zeros_like(x_all)
    for dest, inp in enumerate(inputs_per_rank):
        first = dest * cfg.local_experts
        mine = np.flatnonzero((e_all >= first) & (e_all < first + cfg.local_experts))
        y_all[mine] = run_experts(cfg, x_all[mine], w_all[mine], e_all[mine], inp, first)
    starts = np.cumsum([0] + [r.idx.size for r in routings])
    outs = []
    for src, (routing, inp) in enumerate(zip(routings, inputs_per_rank)):
        routed = y_all[starts[src] : starts[src + 1]].reshape(routing.idx.shape[0], k, -1)
        outs.append(combine(shared_expert(cfg, routing, inp), routed))
    return outs

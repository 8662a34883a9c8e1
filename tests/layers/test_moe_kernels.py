"""MoE numpy references (kernels/moe.py) and the FFN sub-graph against the independent goldens (goldens/moe.py).

Tolerances (dsv4-math §8, goldens/compare.py): x_i8 ±1 LSB on ≤ 0.1 %; x_scale and route weights allclose
(atol 2.5e-5, rtol 5e-3); indices equal up to tie swaps; expert outputs (sh, recv_y) reldiff(2e-3, 1 %);
ffn_out reldiff(3e-3, 0.8 %) like x_out.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from dspark_ir import verify
from dspark_ir.interp import run
from dspark_ir.layers import GraphBuilder
from dspark_ir.layers import moe as moe_layer
from dspark_ir.ops.signal import check_signals
from dspark_ir.semantics import moe as km
from goldens import hc as ghc
from goldens import inputs as gi
from goldens import moe as gm
from goldens.compare import check, lsb_close, ratio_allclose, topk_pair_compare
from goldens.config import TINY

SEEDS = (0, 1, 2)


def x_mixed_of(cfg, inp):
    return ghc.hc_pre(cfg, inp["x_hc"], inp["hc_fn"], inp["hc_scale"], inp["hc_base"])[0]


def kernel_gate(cfg, x_mixed, inp):
    xg, inv_rms, x_scale, q_scale = km.ffn_norm(x_mixed.astype(ml_dtypes.bfloat16), inp["norm_w"], eps=cfg.rms_eps)
    x_i8 = km.x_norm_quant(xg, q_scale)
    scores = km.gate(xg, inv_rms, inp["gate_w"])
    if "tid2eid" in inp:
        idx, wts = km.route_hash(scores, inp["tid2eid"], inp["input_ids"], routed_scale=cfg.routed_scale)
    else:
        idx, wts = km.route_sort(scores, inp["gate_bias"], topk=cfg.topk_experts, routed_scale=cfg.routed_scale)
    return x_i8, x_scale, idx, wts, scores


@pytest.mark.parametrize("kind", ["moe", "moe_hash"])
@pytest.mark.parametrize("seed", SEEDS)
def test_gate_matches_golden(kind, seed):
    cfg = TINY
    inp = gi.make_inputs(kind, cfg, seed)
    x_mixed = x_mixed_of(cfg, inp)
    gold = gm.gate_from_inputs(cfg, x_mixed, inp)
    x_i8, x_scale, idx, wts, scores = kernel_gate(cfg, x_mixed, inp)
    assert lsb_close(x_i8, gold.x_i8, max_lsb=1, max_fraction=0.001)
    assert ratio_allclose(x_scale, gold.x_scale, atol=2.5e-5, rtol=5e-3, max_bad=0.0)
    assert topk_pair_compare(idx, gold.idx, scores + (0 if kind == "moe_hash" else inp["gate_bias"]))
    assert ratio_allclose(wts, gold.wts, atol=2.5e-5, rtol=5e-3, max_bad=0.0)


@pytest.mark.parametrize("regime", ["default", "swiglu_clip"])
@pytest.mark.parametrize("seed", SEEDS)
def test_shared_expert_matches_golden(seed, regime):
    cfg = TINY
    inp = gi.make_inputs("moe", cfg, seed, regime)
    x_mixed = x_mixed_of(cfg, inp)
    routing = gm.gate_from_inputs(cfg, x_mixed, inp)
    gold = gm.shared_expert(cfg, routing, inp)
    sh = km.expert_shared(routing.x_i8, routing.x_scale, *(inp["sh_" + n] for n in gm.EXPERT_WEIGHTS),
                          swiglu_limit=cfg.swiglu_limit)
    assert sh.dtype == ml_dtypes.bfloat16
    assert check("recv_y", sh.astype(np.float32), gold)


@pytest.mark.parametrize("regime", ["default", "swiglu_clip"])
def test_routed_experts_match_golden_rows(regime):
    """expert_routed on compact per-expert rows equals the golden's expert_ffn on the same rows; tail rows stay 0."""
    cfg = TINY.with_(ep=1)
    inp = gi.make_inputs("moe", cfg, 0, regime)
    routing = gm.gate_from_inputs(cfg, x_mixed_of(cfg, inp), inp)
    flat_e, flat_w = routing.idx.reshape(-1), routing.wts.reshape(-1)
    x_rows = np.repeat(routing.x_i8, cfg.topk_experts, axis=0)
    s_rows = np.repeat(routing.x_scale[:, 0], cfg.topk_experts)
    rm = cfg.tokens * cfg.topk_experts
    recv_x = np.zeros((cfg.n_experts, rm, cfg.hidden), np.int8)
    recv_s, recv_w = np.zeros((cfg.n_experts, rm), np.float32), np.zeros((cfg.n_experts, rm), np.float32)
    count = np.zeros(cfg.n_experts, np.int32)
    for e in range(cfg.n_experts):
        rows = np.flatnonzero(flat_e == e)
        count[e] = rows.size
        recv_x[e, :rows.size], recv_s[e, :rows.size], recv_w[e, :rows.size] = x_rows[rows], s_rows[rows], flat_w[rows]
    y = km.expert_routed(recv_x, recv_s, recv_w, count, *(inp[n] for n in gm.EXPERT_WEIGHTS),
                         swiglu_limit=cfg.swiglu_limit).astype(np.float32)
    x_in = gm.expert_input(routing)
    gold = gm.run_experts(cfg, np.repeat(x_in, cfg.topk_experts, axis=0), flat_w, flat_e, inp)
    for e in range(cfg.n_experts):
        rows = np.flatnonzero(flat_e == e)
        assert check("recv_y", y[e, :rows.size], gold[rows]), f"expert {e}"
        assert not y[e, rows.size:].any()


# ---- the FFN sub-graph (gate → shared ∥ dispatch/routed/combine → shared_routed) on the interpreter ------------
def ffn_graph(cfg, kind: str, ep: int):
    b = GraphBuilder("moe", cfg)
    hash_routing = moe_layer.configure(b, 0 if kind == "moe_hash" else cfg.n_hash_layers, ep, 1)
    x_mixed = b.param("x_mixed", "bf16", [b.T, cfg.hidden])
    g = b.ret(ffn_out=moe_layer.moe_ffn(b, x_mixed, hash_routing=hash_routing))
    verify(g)
    assert list(check_signals(g)) == []
    return g, b.cfg


def typed(g, inp: dict) -> dict:
    from dspark_ir.semantics.dtypes import NP_DTYPES

    return {p.name: np.asarray(inp[p.name]).astype(NP_DTYPES[p.type.dtype.value]) for p in g.params}


@pytest.mark.parametrize("ep", [1, 2, 4])
@pytest.mark.parametrize("kind", ["moe", "moe_hash"])
def test_ffn_subgraph_matches_golden_ep(kind, ep):
    g, cfg = ffn_graph(TINY, kind, ep)
    per_rank = gi.make_rank_inputs(kind, cfg, 0)
    x_mixed = [x_mixed_of(cfg, inp) for inp in per_rank]
    feeds = [typed(g, inp | {"x_mixed": x}) for inp, x in zip(per_rank, x_mixed)]
    out = run(g, feeds) if ep > 1 else [run(g, feeds[0])]
    gold = gm.moe_ffn_ep(cfg, x_mixed, per_rank)
    for r in range(ep):
        got = out[r][g.returns[0].name].astype(np.float32)
        assert check("x_out", got, gold[r]), f"rank {r}"

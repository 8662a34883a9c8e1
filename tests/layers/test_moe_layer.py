"""The `moe` layer (before form of dspark-model.md §6(g)) against goldens.layers moe_layer / moe_layer_ep.

Tolerance: x_out ratio_reldiff(diff 3e-3, pct 0.8 %, max 1) (dspark-model.md §7, goldens/tolerances.py); the
stage checks on one rank use dsv4-math §8's: indices equal, sh reldiff(2e-3, 1 %), ffn_out like x_out.
"""
from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

from dspark_ir import ConfigError, parse_graph, print_graph, verify
from dspark_ir.interp import InterpError, run
from dspark_ir.layers import build, graph_config
from dspark_ir.ops.signal import check_signals, waits
from dspark_ir.semantics.dtypes import NP_DTYPES
from goldens import inputs as gi
from goldens import layers as gl
from goldens.compare import check
from goldens.tolerances import compare

from .helpers import moe_after_by_hand

SEEDS = (0, 1, 2)
HASH, SORT = 0, 1          # tiny: n_hash_layers = 1
EPS = (1, 2, 4)


def moe_graph(layer_id: int, ep: int, **kw):
    return build("moe", "tiny", layer_id=layer_id, ep=ep, **kw)


def config_of(g):
    return graph_config(g).with_(ep=g.attributes["ep"])


def typed(g, inp: dict) -> dict:
    return {p.name: np.asarray(inp[p.name]).astype(NP_DTYPES[p.type.dtype.value]) for p in g.params}


def rank_inputs(g, seed: int) -> list[dict]:
    """goldens' per-rank inputs (the config's ep = the graph's), typed like the graph's parameters."""
    return gi.make_rank_inputs(g.attributes["kind"], config_of(g), seed)


def run_ranks(g, per_rank: list[dict], **kw) -> list[dict]:
    feeds = [typed(g, inp) for inp in per_rank]
    out = run(g, feeds, **kw) if len(feeds) > 1 else [run(g, feeds[0], **kw)]
    return out


def golden_x_out(g, per_rank: list[dict]) -> list[np.ndarray]:
    return [o["x_out"] for o in gl.run_layer_ranks(g.attributes["kind"], config_of(g), per_rank)]


def x_out_of(g, out: list[dict]) -> list[np.ndarray]:
    return [o[g.returns[0].name] for o in out]


@pytest.mark.parametrize("ep", EPS)
@pytest.mark.parametrize("layer_id", [HASH, SORT], ids=["hash", "sort"])
@pytest.mark.parametrize("seed", SEEDS)
def test_layer_matches_golden(seed, layer_id, ep):
    g = moe_graph(layer_id, ep)
    per_rank = rank_inputs(g, seed)
    got = x_out_of(g, run_ranks(g, per_rank))
    for r, (a, e) in enumerate(zip(got, golden_x_out(g, per_rank))):
        c = compare("x_out", a, e, "moe")
        assert c.ok, f"rank {r}: {c.detail}"


@pytest.mark.parametrize("layer_id", [HASH, SORT], ids=["hash", "sort"])
def test_stages_match_the_golden_trace(layer_id):
    g = moe_graph(layer_id, 1)
    (inp,) = rank_inputs(g, 0)
    env = run(g, typed(g, inp), keep=True)
    trace: dict = {}
    gl.moe_layer(config_of(g), inp, trace)
    route = "moe.route_hash" if layer_id == HASH else "moe.route_sort"
    np.testing.assert_array_equal(env[route], trace["moe.idx"])
    assert check("recv_y", env["moe.expert_shared"].astype(np.float32), trace["moe.sh"])
    assert check("x_out", env["moe.shared_routed"].astype(np.float32), trace["moe.ffn_out"])


@pytest.mark.parametrize("ep", EPS)
@pytest.mark.parametrize("layer_id", [HASH, SORT], ids=["hash", "sort"])
def test_round_trip_and_verify(layer_id, ep):
    g = moe_graph(layer_id, ep)
    text = print_graph(g)
    parsed = parse_graph(text, "moe.dsir")
    verify(parsed)
    assert print_graph(parsed) == text
    assert list(check_signals(g)) == [] and list(check_signals(parsed)) == []


@pytest.mark.parametrize("layer_id", [0, 3], ids=["hash", "sort"])
def test_flash_builds(layer_id):
    g = build("moe", "flash", layer_id=layer_id)
    assert g.attributes["ranks"] == 16 and g.symbols["NL"] == 16 and g.symbols["T"] == 128
    assert list(check_signals(g)) == []
    assert print_graph(parse_graph(print_graph(g))) == print_graph(g)


def test_before_form_handshakes():
    """§6(g) Before: no push → dispatch_wait edge, combine_wait unanchored with expected = epoch·NL, AER on."""
    g = moe_graph(SORT, 2)
    n = g.nodes
    nxg = g.to_networkx()
    assert not nx.has_path(nxg, "moe.dispatch_push", "moe.dispatch_wait")
    assert [v.name for v in n["moe.dispatch_wait"].operands] == ["moe.data_arrived", "moe.route_sort"]
    assert n["moe.dispatch_wait"].deps == [] and n["moe.combine_wait"].deps == []
    assert [v.name for v in n["moe.combine_wait"].operands] == ["moe.combine_arrived"]
    assert [v.name for v in n["moe.dispatch_gather"].deps] == ["moe.dispatch_wait"]
    assert [v.name for v in n["moe.shared_routed"].deps] == ["moe.combine_wait"]
    sites = {s.node.name: s for s in waits(g)}
    assert {k: (s.notifier.name, str(s.expected), str(s.per_epoch)) for k, s in sites.items()} == {
        "moe.dispatch_meta": ("moe.dispatch_meta", "1", "1"),
        "moe.dispatch_wait": ("moe.dispatch_push", "NL", "NL"),
        "moe.combine_wait": ("moe.combine", "NL", "NL"),
    }
    for name in ("moe.dispatch_push", "moe.combine"):
        assert n[name].attrs["notify_per"] == "block" and str(n[name].attrs["blocks"]) == "NL"
    aer = {"moe.ffn_norm", "moe.x_norm_quant", "moe.gate", "moe.route_sort", "moe.dispatch_meta",
           "moe.dispatch_push", "moe.dispatch_wait", "moe.dispatch_gather", "moe.combine", "moe.combine_wait",
           "moe.shared_routed"}
    assert {k for k, node in n.items() if node.attrs.get("aer") and node.block == "moe"} == aer
    assert "moe.route_hash" in moe_graph(HASH, 2).nodes and "moe.route_hash" not in n


def test_epoch_scales_expected_counts():
    g = moe_graph(SORT, 2, epoch=3)
    assert list(check_signals(g)) == []
    assert str(g.nodes["moe.dispatch_wait"].attrs["expected"]) == "3*NL"
    assert str(g.nodes["moe.combine_wait"].attrs["expected"]) == "3*NL"


def _early(g, wait: str, before: str):
    order = [node for node in g.topo_order() if node.name != wait]
    at = [node.name for node in order].index(before)
    return order[:at] + [g.nodes[wait]] + order[at:]


@pytest.mark.parametrize("wait, before", [("moe.dispatch_wait", "moe.dispatch_push"),
                                          ("moe.combine_wait", "moe.combine")])
def test_a_legal_early_dispatch_of_a_wait_deadlocks(wait, before):
    """The before form allows the wait to run ahead of its notifier (no edge): the interpreter reports the deadlock
    at the wait; with one rank there is no peer to wait for."""
    g = moe_graph(SORT, 2)
    order = _early(g, wait, before)
    with pytest.raises(InterpError) as e:
        run_ranks(g, rank_inputs(g, 0), order=order)
    assert str(e.value).startswith(f"node '{wait}': signal_wait failed"), str(e.value)
    assert "has not notified (deadlock)" in str(e.value)
    g1 = moe_graph(SORT, 1)
    run_ranks(g1, rank_inputs(g1, 0), order=_early(g1, wait, before))


@pytest.mark.parametrize("ep", [1, 2])
def test_perturbing_a_routed_expert_changes_the_output(ep):
    g = moe_graph(SORT, ep)
    cfg = config_of(g)
    per_rank = rank_inputs(g, 0)
    gold = golden_x_out(g, per_rank)
    trace: dict = {}
    gl.moe_layer(cfg, per_rank[0], trace)                  # rank 0's routing is the single-rank one
    idx = trace["moe.idx"]
    expert = int(np.bincount(idx.reshape(-1)).argmax())      # the expert rank 0's tokens use most
    owner, local = divmod(expert, cfg.local_experts)
    perturbed = [dict(inp) for inp in per_rank]
    w2 = perturbed[owner]["w2"].copy()
    w2[local] = -w2[local]
    perturbed[owner]["w2"] = w2
    got = x_out_of(g, run_ranks(g, perturbed))
    assert not compare("x_out", got[0], gold[0], "moe").ok
    for a, e in zip(got, golden_x_out(g, perturbed)):
        assert compare("x_out", a, e, "moe").ok


@pytest.mark.parametrize("params, message", [({"ep": 3}, "ep: 3 does not divide n_experts=8"),
                                             ({"epoch": 0}, "epoch: must be >= 1"),
                                             ({"layer_id": -1}, "layer_id: must be >= 0")])
def test_bad_parameters(params, message):
    with pytest.raises(ConfigError, match=message):
        build("moe", "tiny", **params)


def test_after_form_is_expressible():
    """§6(g) After, applied by hand (the moe-handshake-deps pass will do it): push → dispatch_wait edge,
    combine_wait = one notify + wait ≥ epoch gated on {combine, dispatch_push}, AER off. Still verifies, keeps the
    signal links and matches the golden; the early dispatch that deadlocked the before form is no longer legal."""
    g = moe_after_by_hand(moe_graph(SORT, 2))
    assert list(check_signals(g)) == []
    assert nx.has_path(g.to_networkx(), "moe.dispatch_push", "moe.dispatch_wait")
    per_rank = rank_inputs(g, 0)
    for a, e in zip(x_out_of(g, run_ranks(g, per_rank)), golden_x_out(g, per_rank)):
        assert compare("x_out", a, e, "moe").ok
    text = print_graph(g)
    assert print_graph(parse_graph(text)) == text
    assert "signal_barrier(%moe.combine_arrived) {notifier = \"moe.combine_wait\", expected = 1} " \
           "deps(%moe.combine, %moe.dispatch_push)" in text

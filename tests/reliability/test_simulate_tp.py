"""TP in the simulator: the decode layers at TP4 (their a2a and reduce-scatter are rendezvous collectives that hold
a core group until every rank arrives) complete on one core group per rank with the interpreter's values; and the
two exchanges written out as puts + signals (graphs/tp_o_exchange.dsir) complete when each wait is anchored on its
local notifier, and deadlock on one core group when the anchoring edge is dropped."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dspark_ir import parse_file, parse_graph, print_graph, verify
from dspark_ir.interp import run
from dspark_ir.layers import build
from dspark_ir.semantics import collective
from lowering.simulate import simulate
from runner import layer_inputs

EXCHANGE = Path(__file__).parent / "graphs" / "tp_o_exchange.dsir"
ONE_GROUP = dict(cube=1, vector=2)
TP, T = 4, 4


def same(outputs, expected) -> None:
    assert len(outputs) == len(expected)
    for got, want in zip(outputs, expected):
        assert got.keys() == want.keys()
        for k in want:
            np.testing.assert_array_equal(got[k], want[k], err_msg=k)


@pytest.mark.parametrize("layer", ["decode-swa", "decode-csa", "decode-hca"])
def test_decode_layers_at_tp4_complete_with_the_interpreters_values(layer):
    g = build(layer, "tiny", tp=4)
    inputs = layer_inputs(g, 0)
    expected = run(g, inputs)
    result = simulate(g, inputs, seed=1, trace=True, **ONE_GROUP)
    assert result.ok, result.report()
    same(result.outputs, expected)
    for name in ("o.o_group_a2a", "o.tp_o_reduce_scatter"):
        arrivals = {e.rank: e.step for e in result.trace if e.task == name and e.event == "arrive"}
        finishes = {e.step for e in result.trace if e.task == name and e.event == "finish"}
        assert sorted(arrivals) == list(range(4)) and finishes == {max(arrivals.values()) + 1}, name
    assert simulate(g, inputs, seed=2).ok           # and on the full budget


def exchange():
    g = parse_file(EXCHANGE).entry
    verify(g)
    return g


def exchange_inputs(seed: int = 0) -> list[dict]:
    rng = np.random.default_rng(seed)
    rows = np.arange(TP * T)
    return [{"heads": rng.standard_normal((TP * T, 8)).astype(np.float32),
             "wo": rng.standard_normal((TP * T, 8)).astype(np.float32),
             "a2a_peer": (rows // T).astype(np.int32), "a2a_row": (r * T + rows % T).astype(np.int32),
             "rs_peer": (rows // T).astype(np.int32), "rs_row": (r * T + rows % T).astype(np.int32)}
            for r in range(TP)]


def unanchored(which: str):
    text = print_graph(exchange())
    anchor = f" deps(%o.{which}_notify)"
    assert anchor in text
    return parse_graph(text.replace(anchor, ""))


def test_the_exchange_graph_computes_the_collectives():
    """The decomposed protocol computes what the IR's collective ops compute (a check of the fixture itself)."""
    inputs = exchange_inputs()
    out = run(exchange(), inputs)
    packed = [(i["heads"] * i["heads"]).reshape(TP, T, 8) for i in inputs]
    recv = collective.o_group_a2a([[p] for p in packed], ranks=TP)
    partials = [r.reshape(TP * T, 8) * i["wo"] for r, i in zip(recv, inputs)]
    summed = collective.tp_o_reduce_scatter([[p] for p in partials], ranks=TP, out="f32")
    for o, s in zip(out, summed):
        np.testing.assert_array_equal(o["o.out"], s + s)


def test_anchored_exchange_completes_on_one_core_group_for_every_seed():
    g = exchange()
    inputs = exchange_inputs()
    expected = run(g, inputs)
    for seed in range(8):
        result = simulate(g, inputs, seed=seed, **ONE_GROUP)
        assert result.ok, result.report()
        same(result.outputs, expected)


@pytest.mark.parametrize("which", ["a2a", "rs"])
def test_a_wait_without_its_anchoring_edge_deadlocks_on_one_core_group(which):
    g = unanchored(which)
    results = [simulate(g, seed=s, **ONE_GROUP) for s in range(8)]
    stuck = [r for r in results if not r.completed]
    assert len(stuck) >= 6, [r.summary() for r in results]
    first = results[0]
    assert not first.completed
    waiters = first.deadlock.waiters
    assert any(h.task == f"o.{which}_wait" for h in waiters), first.deadlock.format()
    for h in waiters:
        assert "holds aic0 aiv0 aiv1, spinning" in h.text and "it waits for 'o." in h.text
    assert any(h.kind == "no-core" for h in first.deadlock.cycle), first.deadlock.format()
    assert simulate(g, seed=0, cube=2, vector=4).completed     # a second core group lets the notifier through


# ---- the layer's own exchange after the default pipeline (typed-gather: a window_release replaces the copy-out) --
def default_pipeline(g):
    from passes import run_pipeline

    return run_pipeline(g, use_env=False, check_numerics=False).graph


@pytest.mark.parametrize("layer", ["decode-swa", "decode-csa", "decode-hca"])
def test_default_pipeline_at_tp4_completes_with_the_interpreters_values(layer):
    g = default_pipeline(build(layer, "tiny", tp=4))
    inputs = layer_inputs(g, 0)
    result = simulate(g, inputs, seed=0, **ONE_GROUP)
    assert result.ok, result.report()
    same(result.outputs, run(g, inputs))


def test_without_the_release_edge_two_rendezvous_collectives_deadlock():
    """typed-gather orders the a2a window's release (barrier 2) before the reduce-scatter; drop that edge and, on
    one core group, one rank holds its group in the reduce-scatter while another holds it in the release: each
    waits for a rank that cannot get a core for the other collective."""
    g = default_pipeline(build("decode-swa", "tiny", tp=4))
    release, rs = "o.o_group_a2a.release", g.nodes["o.tp_o_reduce_scatter"]
    if release not in g.nodes:
        pytest.skip("the default pipeline has no typed-gather window_release")
    assert simulate(g, seed=0, **ONE_GROUP).completed
    rs.deps = [d for d in rs.deps if d.name != release]
    g.invalidate()
    results = [simulate(g, seed=s, **ONE_GROUP) for s in range(6)]
    stuck = [r for r in results if not r.completed]
    assert stuck, [r.summary() for r in results]
    cycle = stuck[0].deadlock.cycle
    holders = {(h.task, h.rank) for h in cycle if h.kind == "rendezvous"}
    assert {t for t, _ in holders} == {release, "o.tp_o_reduce_scatter"}, stuck[0].deadlock.format()
    assert len({r for _, r in holders}) == 2

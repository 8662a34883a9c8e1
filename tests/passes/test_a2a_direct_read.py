"""a2a-direct-read on the layers: bitwise on tiny SWA/CSA/HCA at TP2 (no pad rows) and TP4 (T = 8: half of each
window group is pad) for 3 seeds, and within the golden tolerance; the optimised TP4 graphs lower cleanly and
complete in the simulator on one core group per rank with the interpreter's values (the release is ordered before
the reduce-scatter: without that edge two ranks deadlock at different rendezvous); a no-op at TP1 and on MoE;
fires on every attention layer at flash TP4; on the chained layers of a model each release gets one ordering
edge, to its own layer's reduce-scatter. Before/after cases: tests/passes/a2a-direct-read/."""
from __future__ import annotations

import numpy as np
import pytest

import runner
from dspark_ir.interp import run
from lowering import build_task_graph, lint
from lowering.simulate import simulate
from passes import PassContext, run_pipeline
from passes.typed_gather import meets_peers
from perf.model import model_graph

from .layer_support import ATTENTION, SEEDS, flash_opt, golden_mismatches, optimise, skips, statuses, tiny

A2A, COPY, ROWS, RELEASE, RS = ("o.o_group_a2a", "o.o_group_a2a.copy_out", "o.o_group_a2a.rows",
                                "o.o_group_a2a.release", "o.tp_o_reduce_scatter")


def _check_typed(g, groups: int) -> None:
    """The copy-out is gone; every O-A consumer reads the window's data rows with a dep on the exchange; the
    release follows every consumer and precedes the reduce-scatter."""
    assert COPY not in g.nodes and not [n for n in g.ops("window_copy_out") if not n.name.startswith("cp.")]
    a2a, rows, release = g.nodes[A2A], g.nodes[ROWS], g.nodes[RELEASE]
    assert rows.op == "slice" and rows.operands == [a2a.result]
    size = f"{g.attributes['tp']}*T"
    assert (rows.attrs["axis"], rows.attrs["start"].value(), str(rows.attrs["size"])) == (1, 0, size)
    consumers = [f"o.tp_o_a.g{i}" for i in range(groups)]
    for name in consumers:
        node = g.nodes[name]
        assert node.operands[0] is rows.result and a2a.result in node.deps, name
    assert release.op == "window_release" and release.operands == [a2a.result]
    assert [d.name for d in release.deps] == consumers
    assert release.result in g.nodes[RS].deps


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("layer", ATTENTION)
def test_bitwise_on_tiny_and_within_the_golden_tolerance(layer, tp, seed):
    result = optimise(tiny(layer, tp), "a2a-direct-read", seed)     # the bitwise contract is checked on seed's inputs
    assert statuses(result) == {"a2a-direct-read": "changed"}
    _check_typed(result.graph, 4 // tp)
    assert not golden_mismatches(result.graph, seed)


def test_tp4_window_has_pad_rows_the_consumers_skip():
    """tiny TP4: T = 8, LOCAL_T_PAD = 16, so each window group has 4·16 = 64 rows of which 32 are data."""
    before = tiny("decode-swa", 4)
    after = optimise(before, "a2a-direct-read", numerics=False).graph
    env = after.env
    assert after.nodes[A2A].result.type.concrete_shape(env) == (1, 64, 128)
    assert after.nodes[ROWS].result.type.concrete_shape(env) == (1, 32, 128)
    inputs = runner.layer_inputs(before, 0)
    window = run(before, inputs, keep=True)
    assert all(not np.any(np.asarray(w[A2A], np.float32)[:, 32:]) for w in window)     # the pad rows are zero
    assert all(np.array_equal(w[A2A][:, :32], w[COPY]) for w in window)


@pytest.mark.parametrize("layer", ATTENTION)
def test_optimised_tp4_lowers_and_simulates_on_one_core_group(layer):
    g = optimise(tiny(layer, 4), "a2a-direct-read", numerics=False).graph
    assert lint(build_task_graph(g)).ok
    inputs = runner.layer_inputs(g, 0)
    want = run(g, inputs)
    for seed in range(3):
        sim = simulate(g, inputs, seed=seed, cube=1, vector=2)
        assert sim.ok, sim.report()
        for got, exp in zip(sim.outputs, want):
            for k in exp:
                np.testing.assert_array_equal(got[k], exp[k], err_msg=k)


def test_without_the_collective_order_edge_the_release_can_deadlock():
    """Non-vacuity of the release → reduce-scatter edge: drop it and some schedule deadlocks on one core group."""
    g = optimise(tiny("decode-swa", 4), "a2a-direct-read", numerics=False).graph
    rs = g.nodes[RS]
    rs.deps = [d for d in rs.deps if d.name != RELEASE]
    g.invalidate()
    results = [simulate(g, seed=s, cube=1, vector=2) for s in range(6)]
    assert any(not r.completed for r in results)


@pytest.mark.parametrize("layer", ATTENTION)
def test_no_op_at_tp1(layer):
    result = optimise(tiny(layer, 1), "a2a-direct-read", numerics=False)
    assert statuses(result) == {"a2a-direct-read": "no-op"} and not skips(result, "a2a-direct-read")
    assert not result.graph.ops("window_release")


@pytest.mark.parametrize("tp", [1, 2])
def test_no_op_on_moe(tp):
    result = optimise(tiny("moe", tp), "a2a-direct-read", numerics=False)
    assert statuses(result) == {"a2a-direct-read": "no-op"}


def test_skip_reason_when_the_copy_is_returned():
    g = tiny("decode-swa", 2).clone()
    g.set_returns(g.returns + [g.values[COPY]])
    result = optimise(g, "a2a-direct-read", numerics=False)
    assert statuses(result) == {"a2a-direct-read": "no-op"}
    assert "returned by the graph" in skips(result, "a2a-direct-read")[COPY]


@pytest.mark.parametrize("layer", ATTENTION)
def test_fires_at_flash_tp4(layer, tmp_path):
    g = flash_opt(layer, tmp_path)
    _check_typed(g, 2)
    assert g.nodes[A2A].attrs["t_pad"] == 16


def test_default_pipeline_runs_it_on_every_tp_layer():
    for layer in ATTENTION:
        result = run_pipeline(tiny(layer, 2), ctx=PassContext(use_env=False, check_numerics=False))
        assert {r.name: r.status for r in result.runs}["a2a-direct-read"] == "changed", layer
        assert RELEASE in result.graph.nodes


def test_each_release_of_a_model_orders_only_the_nearest_collective():
    """4 chained decoder layers (tiny model at TP2): layer k's release is a dep of layer k's reduce-scatter and of
    nothing else; the later exchanges and reduce-scatters are after it through the chain of collectives, which
    stays one total order (every rank meets its peers in it)."""
    g = optimise(model_graph("tiny", tp=2), "a2a-direct-read", numerics=False).graph
    count = g.attributes["layers"]
    assert count >= 3
    releases = {f"L{k}.{RELEASE}" for k in range(count)}
    for node in g.nodes.values():
        got = [d.name for d in node.deps if d.name in releases]
        layer = node.name.split(".")[0]
        assert got == ([f"{layer}.{RELEASE}"] if node.name == f"{layer}.{RS}" else []), node.name
    for k in range(count):
        for i in range(2):
            assert [d.name for d in g.nodes[f"L{k}.o.tp_o_a.g{i}"].deps] == [f"L{k}.{A2A}"]
    chain = [n for n in g.topo_order() if meets_peers(n) and ".o." in n.name]   # the SWA layer's cp gathers aside
    assert [n.name for n in chain] == [f"L{k}.{name}" for k in range(count) for name in (A2A, RELEASE, RS)]
    assert all(g.reaches(a, b) for a, b in zip(chain, chain[1:]))

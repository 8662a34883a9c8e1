"""dequant-into-owner-windows on the layers: bitwise on tiny CSA at TP2 and TP4 (3 seeds) and at the CSA decode
T = 32 shape, within the golden tolerance; the fused task lowers with a clean dependency lint and the multi-rank
simulator completes on one core group per rank, over several dispatch orders, with the interpreter's values (no
deadlock, no read of unwritten rows); a no-op at TP1 and on MoE, with the reasons; fires on every attention layer
at flash TP4. Before/after cases: tests/passes/dequant-into-owner-windows/."""
from __future__ import annotations

import pytest

from dspark_ir import layers
from lowering import build_task_graph, lint
from lowering.simulate import simulate
from passes import get_pass

from .layer_support import (
    ATTENTION,
    SEEDS,
    assert_simulates_as_interpreted,
    golden_mismatches,
    optimise,
    skips,
    statuses,
    tiny,
)

NAME = "dequant-into-owner-windows"
DEQUANT, RS, FUSED = "o.tp_o_b_dequant", "o.tp_o_reduce_scatter", "o.tp_o_b_dequant_publish"


def _check(before, after) -> None:
    assert DEQUANT not in after.nodes and RS not in after.nodes
    fused, scatter = after.nodes[FUSED], before.nodes[RS]
    assert fused.op == "tp_o_dequant_reduce_scatter"
    assert [v.name for v in fused.operands] == [v.name for v in before.nodes[DEQUANT].operands]
    assert [d.name for d in fused.deps] == [d.name for d in before.nodes[DEQUANT].deps + scatter.deps]
    assert (fused.attrs["workers"], fused.attrs["reduce_workers"], fused.attrs["slots"]) == (24, 8, 2)
    assert str(fused.result.type) == str(scatter.result.type)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("tp", [2, 4])
def test_bitwise_on_tiny_csa(tp, seed):
    before = tiny("decode-csa", tp)
    result = optimise(before, NAME, seed)                     # the bitwise contract is checked on seed's inputs
    assert statuses(result) == {NAME: "changed"}
    _check(before, result.graph)
    assert not golden_mismatches(result.graph, seed)


def test_csa_decode_t32():
    """CSA decode with T = 32 tokens per rank at TP2 (tiny: B = 8 requests of S = 4; tp·T = 64 partial rows)."""
    before = tiny("decode-csa", 2, batch=8)
    assert before.env["T"] == 32
    result = optimise(before, NAME, 2)
    _check(before, result.graph)
    assert not golden_mismatches(result.graph, 2)


def test_tp1_and_moe_explain_why_not():
    result = optimise(tiny("decode-csa", 1), NAME, numerics=False)
    assert statuses(result) == {NAME: "no-op"}
    assert skips(result, NAME) == {
        "o.proj_b_act": "TP1 O path: the dequant writes attn_out (bf16), there is no reduce-scatter"}
    assert statuses(optimise(tiny("moe"), NAME, numerics=False)) == {NAME: "no-op"}


def test_workers_tp_does_not_divide():
    g = tiny("decode-csa", 4)
    assert {s.at: s.reason for s in get_pass(NAME)(workers=6).match(g)} == {
        RS: "tp 4 does not divide workers = 6"}
    assert {s.at: s.reason for s in get_pass(NAME)(reduce_workers=2).match(g)} == {
        RS: "tp 4 does not divide reduce_workers = 2"}


@pytest.mark.parametrize("options", ["", "{slots=0}"])
def test_options_round_trip_through_the_pipeline(options):
    result = optimise(tiny("decode-csa", 2), NAME + options, numerics=False)
    assert result.graph.nodes[FUSED].attrs["slots"] == (0 if options else 2)
    assert str(result.pipeline) == NAME + options


@pytest.mark.parametrize("layer", ATTENTION)
def test_tp4_lowers_clean_and_simulates_on_one_core_group(layer):
    g = optimise(tiny(layer, 4), NAME, numerics=False).graph
    tg = build_task_graph(g)
    assert lint(tg).ok
    [task] = [t for t in tg.tasks if t.name == FUSED]
    assert task.collective and task.attrs["slots"] == 2
    assert_simulates_as_interpreted(g)


@pytest.mark.parametrize("layer", ATTENTION)
def test_fires_at_flash_tp4(layer):
    before = layers.build(layer, config="flash", tp=4)
    after = optimise(before, NAME, numerics=False).graph
    _check(before, after)
    assert str(after.nodes[FUSED].result.type) == "bf16[T,4096]"


def test_planted_without_the_carried_release_edge_some_schedule_deadlocks():
    """Non-vacuity of carrying the reduce-scatter's deps: the fused rendezvous without its edge from the a2a's
    window release lets ranks meet different rendezvous first; some schedule on one core group deadlocks."""
    g = optimise(tiny("decode-swa", 4), "a2a-direct-read," + NAME, numerics=False).graph
    assert all(simulate(g, seed=s, cube=1, vector=2).completed for s in range(6))
    fused = g.nodes[FUSED]
    assert "o.o_group_a2a.release" in [d.name for d in fused.deps]
    fused.deps = [d for d in fused.deps if d.name != "o.o_group_a2a.release"]
    g.invalidate()
    assert any(not simulate(g, seed=s, cube=1, vector=2).completed for s in range(6))

"""early-resolve-csa-producers on the layers: bitwise on tiny CSA at TP1/2/4 (3 seeds) and at the CSA decode
T = 32 shape, within the golden tolerance; the explicit deps are untouched (the dependency lint of the lowered task
graph stays clean) and the simulator, which dispatches by the hint, completes on one core group per rank with the
interpreter's values; a no-op with its reason on SWA, HCA and MoE. Before/after cases:
tests/passes/early-resolve-csa-producers/."""
from __future__ import annotations

import pytest

import runner
from dspark_ir import layers
from lowering import build_task_graph, lint
from lowering.simulate import simulate

from .layer_support import SEEDS, golden_mismatches, optimise, skips, statuses, tiny

NAME = "early-resolve-csa-producers"
SIX = ("cmp.rmsnorm_rope_cache_write", "idx.weights_proj_reduce", "icmp.kv_and_cache_write", "csa.kv_touch",
       "csa.qk_pv", "csa.rope_cs")


def _check(before, after) -> None:
    for name in SIX:
        assert after.nodes[name].attrs.get("aer") is True, name
    marked = {n for n in after.nodes if after.nodes[n].attrs.get("aer") != before.nodes[n].attrs.get("aer")}
    assert marked and marked <= set(SIX)
    for name, node in after.nodes.items():                    # edges are unchanged
        assert [d.name for d in node.deps] == [d.name for d in before.nodes[name].deps], name


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_bitwise_on_tiny_csa(tp, seed):
    before = tiny("decode-csa", tp)
    result = optimise(before, NAME, seed)                     # the bitwise contract is checked on seed's inputs
    assert statuses(result) == {NAME: "changed"}
    _check(before, result.graph)
    assert not golden_mismatches(result.graph, seed)


def test_csa_decode_t32():
    """#915's benchmark shape: CSA decode with T = 32 tokens per rank (tiny: B = 8 requests of S = 4)."""
    before = tiny("decode-csa", 1, batch=8)
    assert before.env["T"] == 32
    result = optimise(before, NAME, 1)
    _check(before, result.graph)
    assert not golden_mismatches(result.graph, 1)


def test_the_builder_emits_the_form_before_915_and_a_second_run_explains():
    """The layer builder marks none of the six (the form before #915; the seed cases run this pass on both sides);
    run twice, the second run leaves all six with the reason."""
    g = tiny("decode-csa", 2)
    assert not any(g.nodes[n].attrs.get("aer") for n in SIX)
    once = optimise(g, NAME, numerics=False)
    assert {r.at for r in next(r for r in once.runs if r.name == NAME).rewrites} == set(SIX)
    twice = optimise(once.graph, NAME, numerics=False)
    assert skips(twice, NAME) == {n: "already allows early resolve (aer = true)" for n in SIX}


@pytest.mark.parametrize("layer", ["decode-swa", "decode-hca", "moe"])
def test_no_op_elsewhere_with_its_reason(layer):
    result = optimise(tiny(layer), NAME, numerics=False)
    assert statuses(result) == {NAME: "no-op"}
    assert set(skips(result, NAME).values()) <= {
        "not a CSA graph (no csa_qk_pv or kv_touch): #915 marks CSA's producers only"}


@pytest.mark.parametrize("tp", [2, 4])
def test_lint_clean_and_simulates_with_the_hint(tp):
    g = optimise(tiny("decode-csa", tp), NAME, numerics=False).graph
    tg = build_task_graph(g)
    assert lint(tg).ok
    assert all(t.attrs.get("aer") for t in tg.tasks if t.name in SIX)
    sim = simulate(g, runner.layer_inputs(g, 0), seed=0, cube=1, vector=2)
    assert sim.status == "completed" and not sim.problems


def test_flash_t32_graph_level():
    before = layers.build("decode-csa", config="flash", tp=4, batch=4)      # S = 8: T = 32
    assert before.env["T"] == 32
    after = optimise(before, NAME, numerics=False).graph
    _check(before, after)


def test_stages_option_round_trips_and_narrows():
    result = optimise(tiny("decode-csa", 2), NAME + "{stages=[qk_pv]}", numerics=False)
    assert str(result.pipeline) == NAME + "{stages=[qk_pv]}"
    assert {r.at for r in next(r for r in result.runs if r.name == NAME).rewrites} == {"csa.qk_pv"}
    assert not result.graph.nodes["csa.rope_cs"].attrs.get("aer")

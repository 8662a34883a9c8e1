"""moe-handshake-deps on the MoE layer: bitwise on tiny (3 seeds, hash and sort routing) and still within the golden
tolerance; equal to tests/layers/test_moe_layer.py's hand-applied after form (with drop_aer_on_waits=false); a
no-op on the attention layers; fires at flash TP4 (EP16); the multi-rank simulator deadlocks the before form
under a small core budget and completes the after form; in a model each barrier is gated on its own layer's push
only. Before/after cases: tests/passes/moe-handshake-deps/."""
from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

import runner
from dspark_ir import layers, parse_graph
from dspark_ir.interp import run
from dspark_ir.ops.signal import check_signals, waits
from lowering.simulate import simulate
from passes import Skip, get_pass
from passes.infra.manager import node_keys
from perf.model import model_graph

from ..layers.helpers import MOE_NO_AER, moe_after_by_hand
from .layer_support import ATTENTION, SEEDS, flash_opt, golden_mismatches, optimise, skips, statuses
from .support import HERE

PASS = "moe-handshake-deps"
SEED_FORM = f"{PASS}{{drop_aer_on_waits=false}}"
HASH, SORT = 0, 1                                  # tiny: n_hash_layers = 1
NO_AER = set(MOE_NO_AER)
WAITS = {"moe.dispatch_meta", "moe.dispatch_wait"}
SIM_SEEDS = range(10)


def moe(layer_id: int = SORT, ep: int = 2, **kw):
    return layers.build("moe", "tiny", layer_id=layer_id, ep=ep, **kw)


def assert_after_form(g, epoch: int = 1) -> None:
    """§6(g) After, as this pass writes it (default options)."""
    n = g.nodes
    assert [d.name for d in n["moe.dispatch_wait"].deps] == ["moe.dispatch_push"]
    cw = n["moe.combine_wait"]
    assert cw.op == "signal_barrier" and [v.name for v in cw.operands] == ["moe.combine_arrived"]
    assert [d.name for d in cw.deps] == ["moe.combine", "moe.dispatch_push"]
    assert (cw.attrs["notifier"], str(cw.attrs["expected"]), str(cw.attrs["epoch"])) == (
        "moe.combine_wait", str(epoch), str(epoch))
    assert n["moe.combine"].attrs["notify_per"] == "none"
    assert [d.name for d in n["moe.dispatch_gather"].deps] == ["moe.dispatch_wait"]
    assert [d.name for d in n["moe.shared_routed"].deps] == ["moe.combine_wait"]
    assert not {name for name in NO_AER | WAITS if n[name].attrs.get("aer")}
    assert n["moe.dispatch_push"].attrs.get("aer")          # the seed keeps AER on the push grid
    assert nx.has_path(g.to_networkx(), "moe.dispatch_push", "moe.dispatch_wait")
    assert list(check_signals(g)) == []
    sites = {s.node.name: (s.notifier.name, str(s.expected), str(s.per_epoch)) for s in waits(g)}
    assert sites["moe.combine_wait"] == ("moe.combine_wait", str(epoch), "1")


# ---- numeric contract on tiny ---------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("layer_id", [HASH, SORT], ids=["hash", "sort"])
def test_bitwise_on_tiny_and_within_the_golden_tolerance(layer_id, seed):
    result = optimise(moe(layer_id), PASS, seed)             # the manager checks the bitwise contract (2 ranks)
    assert statuses(result) == {PASS: "changed"}
    assert_after_form(result.graph)
    assert not golden_mismatches(result.graph, seed)


# ---- the hand-applied after form -------------------------------------------------------------------------------
@pytest.mark.parametrize("ep", [1, 2, 4])
def test_equals_the_hand_applied_after_form(ep):
    g = moe(ep=ep)
    seed_form = optimise(g, SEED_FORM, numerics=False).graph
    assert seed_form.structurally_equal(moe_after_by_hand(g))
    assert statuses(optimise(moe_after_by_hand(g), SEED_FORM, numerics=False)) == {PASS: "no-op"}
    # the default also takes AER off the two cross-rank waits the seed left it on, and nothing else
    default = optimise(g, PASS, numerics=False).graph
    old, new = node_keys(seed_form), node_keys(default)
    assert {k for k in new if new[k] != old[k]} == WAITS
    for name in WAITS:
        assert seed_form.nodes[name].attrs["aer"] and "aer" not in default.nodes[name].attrs
    assert statuses(optimise(moe_after_by_hand(g), PASS, numerics=False)) == {PASS: "changed"}


def test_epoch_sets_the_one_notify_threshold():
    result = optimise(moe(epoch=3), PASS, numerics=False)
    assert_after_form(result.graph, epoch=3)
    assert str(result.graph.nodes["moe.dispatch_wait"].attrs["expected"]) == "3*NL"


# ---- where it must not fire -----------------------------------------------------------------------------------
@pytest.mark.parametrize("layer", ATTENTION)
def test_no_op_on_attention_layers(layer):
    result = optimise(layers.build(layer, "tiny"), PASS, numerics=False)
    assert statuses(result) == {PASS: "no-op"} and not skips(result, PASS)


def test_no_op_on_its_own_output():
    once = optimise(moe(), PASS, numerics=False)
    again = optimise(once.graph, PASS, numerics=False)
    assert statuses(again) == {PASS: "no-op"}
    assert skips(again, PASS) == {"moe.dispatch_wait": "already ordered after its notifier %moe.dispatch_push"}


def _reasons(case: str, **options) -> tuple[list[tuple[str, str]], dict[str, str]]:
    g = parse_graph((HERE / PASS / f"{case}.before.dsir").read_text())
    found = list(get_pass(PASS)(**options).match(g))
    sites = [(s.rule, s.node.name) for s in found if not isinstance(s, Skip)]
    return sites, {s.at: s.reason for s in found if isinstance(s, Skip)}


def test_case_skip_reasons():
    assert _reasons("no_fire") == ([], {
        "a.wait": "already ordered after its notifier %a.push",
        "b.wait": "%b.late runs after the wait: an edge would make a cycle",
    })
    sites, reasons = _reasons("shared_notifier", barrier_notifiers=("signal_notify",))
    assert sites == [("anchor-wait", "s.wait_a"), ("anchor-wait", "s.wait_b")]
    assert reasons == {"s.wait_a": "one-notify: %s.wait_b also counts %s.scatter's per-block notifies",
                       "s.wait_b": "one-notify: %s.wait_a also counts %s.scatter's per-block notifies"}
    sites, reasons = _reasons("one_notify", barrier_notifiers=("signal_notify",))
    assert ("anchor-wait", "d.wait") in sites and ("one-notify", "c.wait") in sites
    assert reasons == {"d.wait": "one-notify: %d.push does not notify per block"}


def test_each_barrier_of_a_model_is_gated_on_its_own_push_only():
    """4 chained MoE layers (tiny model): an earlier layer's push is upstream of the next layer's push, so each
    one-notify barrier gets deps on its own combine grid and its own layer's push, not on every earlier push."""
    g = optimise(model_graph("tiny", tp=2), PASS, numerics=False).graph
    count = g.attributes["layers"]
    assert count >= 3
    for k in range(count):
        cw = g.nodes[f"L{k}.moe.moe.combine_wait"]
        assert cw.op == "signal_barrier"
        assert [d.name for d in cw.deps] == [f"L{k}.moe.moe.combine", f"L{k}.moe.moe.dispatch_push"]
    for k in range(1, count):       # the dropped edges are implied: the earlier pushes stay before the barrier
        assert g.reaches(g.nodes[f"L{k - 1}.moe.moe.dispatch_push"], g.nodes[f"L{k}.moe.moe.dispatch_push"])
    assert list(check_signals(g)) == []


# ---- flash TP4 (graph level) ----------------------------------------------------------------------------------
def test_fires_at_flash_tp4(tmp_path):
    g = flash_opt("moe", tmp_path)
    assert g.attributes["ranks"] == 16 and g.symbols["NL"] == 16
    assert_after_form(g)
    assert str(g.nodes["moe.dispatch_wait"].attrs["expected"]) == "NL"   # push still notifies per block


# ---- liveness: the multi-rank simulator ------------------------------------------------------------------------
@pytest.mark.parametrize("ep", [2, 4])
def test_simulator_deadlocks_before_and_completes_after(ep):
    """1 cube + 2 vector cores per rank (one core group): the before form's combine_wait is dispatched early,
    spins on the only core group and starves its own rank's gate/dispatch work, which the peers wait for."""
    g = moe(ep=ep)
    before = [simulate(g, cube=1, vector=2, seed=s) for s in SIM_SEEDS]
    assert all(r.status == "deadlock" for r in before), [r.summary() for r in before]
    assert any("combine_wait" in r.deadlock.format() for r in before)
    after = optimise(g, PASS, numerics=False).graph
    for budget in [(1, 2), (1, 3), (2, 4)]:
        for s in SIM_SEEDS:
            r = simulate(after, cube=budget[0], vector=budget[1], seed=s)
            assert r.completed, r.report()


def test_simulated_values_of_the_after_form():
    g = optimise(moe(), PASS, numerics=False).graph
    inputs = runner.layer_inputs(g, 0)
    r = simulate(g, inputs, cube=1, vector=2, seed=0)
    assert r.ok, r.report()
    ref = run(g, inputs)                                      # the simulated schedule computes the same bits
    assert all(np.array_equal(got[k], want[k]) for got, want in zip(r.outputs, ref) for k in want)

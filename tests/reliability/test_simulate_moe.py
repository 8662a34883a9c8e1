"""The EP deadlock of dspark-model.md §6(g) in the simulator: the MoE sublayer in its before form (no push →
dispatch_wait edge, combine_wait unanchored, everything AER) deadlocks on a small core budget; the after form
(the handshake edges) completes on the same budget for every seed, with the interpreter's values.

After forms: the `moe-handshake-deps` pass (default options, and `drop_aer_on_waits=false`, the seed PR's exact
form) when it is registered, and always the hand-applied form of tests/layers/test_moe_layer.py.
"""
from __future__ import annotations

import numpy as np
import pytest

from dspark_cli.commands.simulate import layer_inputs
from dspark_ir import verify
from dspark_ir.interp import run
from dspark_ir.layers import build
from dspark_ir.semantics.dtypes import NP_DTYPES
from goldens import inputs as gi
from goldens.config import config_by_name
from lowering.simulate import simulate

HANDSHAKE_PASS = "moe-handshake-deps"
SORT = 1                        # tiny: layer 0 routes by hash, layer 1 by score
ONE_GROUP = dict(cube=1, vector=2)
SEEDS = range(5)


def _pass_available() -> bool:
    try:
        from passes import get_pass

        get_pass(HANDSHAKE_PASS)
        return True
    except Exception:
        return False


AFTER_FORMS = (["pass", "pass-seed-form"] if _pass_available() else []) + ["hand-applied"]


def hand_applied(g):
    """§6(g) After: deps(push) on dispatch_wait; combine_wait = one notify + wait ≥ epoch gated on {combine,
    dispatch_push}; AER off on dispatch_gather, combine, combine_wait, shared_routed."""
    g = g.clone()
    n = g.nodes
    n["moe.dispatch_wait"].deps.append(g.values["moe.dispatch_push"])
    old = n["moe.combine_wait"]
    barrier = g.add_op("signal_barrier", list(old.operands),
                       {"notifier": "moe.combine_wait", "epoch": old.attrs["epoch"], "expected": old.attrs["epoch"]},
                       names="moe.combine_wait.after", near=old,
                       deps=[g.values["moe.combine"], g.values["moe.dispatch_push"]])
    g.replace_uses(old.result, barrier.result)
    g.remove_node(old)
    g.rename(barrier.result, "moe.combine_wait")
    n = g.nodes
    n["moe.combine"].attrs["notify_per"] = "none"
    for name in ("moe.dispatch_gather", "moe.combine", "moe.combine_wait", "moe.shared_routed"):
        n[name].attrs.pop("aer", None)
    g.invalidate()
    verify(g)
    return g


def after_form(g, form: str = AFTER_FORMS[0]):
    if form == "hand-applied":
        return hand_applied(g)
    from passes import run_pipeline

    pipeline = HANDSHAKE_PASS if form == "pass" else f"{HANDSHAKE_PASS}{{drop_aer_on_waits=false}}"
    return run_pipeline(g, pipeline, use_env=False, check_numerics=False).graph


def before(ep: int):
    return build("moe", "tiny", layer_id=SORT, ep=ep)


@pytest.mark.parametrize("form", AFTER_FORMS)
def test_the_after_form_has_the_handshake_edges(form):
    g = after_form(before(2), form)
    assert "moe.dispatch_push" in [v.name for v in g.nodes["moe.dispatch_wait"].deps]
    assert {v.name for v in g.nodes["moe.combine_wait"].deps} >= {"moe.combine", "moe.dispatch_push"}
    assert not g.nodes["moe.combine_wait"].attrs.get("aer")


@pytest.mark.parametrize("ep", [2, 4])
def test_before_form_deadlocks_on_one_core_group(ep):
    for seed in SEEDS:
        result = simulate(before(ep), seed=seed, **ONE_GROUP)
        assert result.status == "deadlock", result.summary()
        spins = result.deadlock.waiters
        assert spins, result.deadlock.format()
        # a waiter of the EP handshake holds the whole core group, spinning for a notifier on a peer rank
        handshake = [h for h in spins if h.task in ("moe.combine_wait", "moe.dispatch_wait")]
        assert handshake and all("holds aic0 aiv0 aiv1, spinning" in h.text for h in handshake)
        assert any(h.kind == "no-core" and "held (aiv0 aiv1 by 'moe." in h.text for h in result.deadlock.cycle)
        assert {h.rank for h in result.deadlock.cycle} != {0}, "the cycle crosses ranks"


@pytest.mark.parametrize("form", AFTER_FORMS)
@pytest.mark.parametrize("ep", [2, 4])
def test_after_form_completes_on_one_core_group(ep, form):
    g = after_form(before(ep), form)
    for seed in SEEDS:
        result = simulate(g, seed=seed, **ONE_GROUP)
        assert result.ok, result.report()


def test_with_two_core_groups_a_spinning_dispatch_wait_starves_the_peers_push():
    """The §6(g) picture: dispatch_wait spins on one core group, combine_wait on the other, and the peer's
    dispatch_push cannot get a vector core. Some seeds only; the after form never deadlocks."""
    budget = dict(cube=2, vector=4)
    results = [simulate(before(4), seed=s, **budget) for s in range(6)]
    stuck = [r for r in results if not r.completed]
    assert stuck and len(stuck) < len(results)
    cycles = [[(h.kind, h.task) for h in r.deadlock.cycle] for r in stuck]
    assert [("spin", "moe.dispatch_wait"), ("no-core", "moe.dispatch_push")] * 2 in cycles, cycles
    for form in AFTER_FORMS:
        g = after_form(before(4), form)
        assert all(simulate(g, seed=s, **budget).ok for s in range(6)), form


def test_the_report_names_holder_core_waiter_and_starved_notifier():
    result = simulate(before(2), seed=0, **ONE_GROUP)
    text = result.deadlock.format()
    first = result.deadlock.cycle[0]
    assert first.kind == "spin" and first.rank == 0
    assert f"rank 0: task 26 '{first.task}' holds aic0 aiv0 aiv1, spinning since step" in text
    assert "it waits for 'moe.combine' on rank 1 to notify" in text or \
           "it waits for 'moe.dispatch_push' on rank 1 to notify" in text, text
    assert "cannot get a vector core: held (aiv0 aiv1 by 'moe.combine_wait')" in text, text
    assert text.splitlines()[-2:] == ["  rank 0: aic0 aiv0 aiv1: task 26 'moe.combine_wait' spinning since step 0",
                                      "  rank 1: aic0 aiv0 aiv1: task 26 'moe.combine_wait' spinning since step 15"] \
        or "held cores:" in text


@pytest.mark.parametrize("ep, form", [(2, "after"), (4, "after"), (2, "before")])
def test_values_equal_the_interpreter(ep, form):
    g = after_form(before(ep)) if form == "after" else before(ep)
    inputs = layer_inputs(g, 0)
    budget = ONE_GROUP if form == "after" else {}
    result = simulate(g, inputs, seed=3, **budget)
    assert result.ok, result.report()
    want = run(g, inputs)
    assert len(result.outputs) == ep
    for got, exp in zip(result.outputs, want):
        assert got.keys() == exp.keys()
        for k in exp:
            np.testing.assert_array_equal(got[k], exp[k])


def test_the_epoch_threshold_of_a_later_call_cannot_be_reached_in_one_run():
    """epoch = 3: the waits expect 3·NL notifies on windows this graph allocates (zero), so they can never pass:
    the static check calls it an epoch mismatch and the run deadlocks."""
    g = after_form(build("moe", "tiny", layer_id=SORT, ep=2, epoch=3))
    result = simulate(g, cube=24, vector=48)
    assert result.status == "deadlock"
    kinds = {(p.kind, p.task) for p in result.problems}
    assert ("epoch-mismatch", "moe.dispatch_wait") in kinds and ("epoch-mismatch", "moe.dispatch_meta") in kinds


def test_ep16_with_sixteen_tiny_experts():
    """EP16 needs 16 experts (tiny has 8): the tiny config with n_experts = 16, one local expert per rank."""
    cfg = config_by_name("tiny").with_(n_experts=16, ep=16)
    g = build("moe", cfg, layer_id=SORT, ep=16)
    inputs = [{p.name: np.asarray(d[p.name]).astype(NP_DTYPES[p.type.dtype.value]) for p in g.params}
              for d in gi.make_rank_inputs(g.attributes["kind"], cfg, 0)]
    assert simulate(g, seed=0, **ONE_GROUP).status == "deadlock"
    result = simulate(after_form(g), inputs, seed=0, **ONE_GROUP)
    assert result.ok and result.ranks == 16, result.report()
    for got, exp in zip(result.outputs, run(g, inputs)):
        for k in exp:
            np.testing.assert_array_equal(got[k], exp[k])

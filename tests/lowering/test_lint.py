"""The dependency lint, and the mutation test: deleting any single dep edge must be flagged."""
from __future__ import annotations

import pytest

from lowering import build_task_graph, lint, mutation_check
from lowering.hazards import find_hazards
from tests.lowering.conftest import GRAPH_NAMES, load

LAYERS = ["decode-swa", "decode-csa", "decode-hca", "moe"]


def _layer(name, config="tiny", tp=1):
    from dspark_ir import layers

    return layers.build(name, config=config, tp=tp)


@pytest.mark.parametrize("name", GRAPH_NAMES)
def test_lowered_graphs_are_clean(name):
    report = lint(build_task_graph(load(name)))
    assert report.ok and not report.redundant, report.summary()


@pytest.mark.parametrize("name", GRAPH_NAMES)
def test_every_edge_deletion_is_flagged_hand_written(name):
    tg = build_task_graph(load(name))
    assert tg.edges(), "a graph without edges tests nothing"
    assert mutation_check(tg) == []


@pytest.mark.parametrize("config, tp", [("tiny", 1), ("tiny", 2), ("flash", 1), ("flash", 4)])
@pytest.mark.parametrize("layer", LAYERS)
def test_every_edge_deletion_is_flagged_layers(layer, config, tp):
    tg = build_task_graph(_layer(layer, config, tp))
    assert lint(tg).ok
    assert mutation_check(tg) == []


def test_race_names_both_tasks_and_the_buffer():
    tg = build_task_graph(load("mlp"))
    deps = tg.deps_map()
    mm, seed = tg.task("mm.h").id, tg.task("mm.acc").id
    deps[mm] = [d for d in deps[mm] if d != seed]
    report = lint(tg, deps)
    race = report.races[0]  # also seed -> mm.y, which was ordered through mm.h
    assert (race.first, race.second, race.buffer) == (seed, mm, "mm.acc")
    assert "'mm.acc'" in race.message and "'mm.h'" in race.message and "%mm.acc" in race.message
    assert {(r.first, r.second) for r in report.races} == {(seed, mm), (seed, tg.task("mm.y").id)}


def test_war_race_is_reported():
    tg = build_task_graph(load("inplace"))
    deps = tg.deps_map()
    old, upd = tg.task("a.old").id, tg.task("a.upd").id
    deps[upd] = [d for d in deps[upd] if d != old]
    assert [(r.first, r.second, r.buffer) for r in lint(tg, deps).races] == [(old, upd, "acc")]
    assert "WAR" in lint(tg, deps).races[0].message


def test_missing_declared_edge_is_reported():
    tg = build_task_graph(load("inplace"))
    deps = tg.deps_map()
    sq = tg.task("b.sq").id
    deps[sq] = []
    [issue] = lint(tg, deps).errors
    assert issue.kind == "missing-order" and issue.second == sq


def test_redundant_and_backward_edges():
    tg = build_task_graph(load("mlp"))
    deps = tg.deps_map()
    y = tg.task("mm.y").id
    deps[y] = deps[y] + [tg.task("n.xn").id]  # implied through mm.h
    report = lint(tg, deps)
    assert report.ok and len(report.redundant) == 1
    deps[0] = [y]
    assert any(i.kind == "backward-dep" for i in lint(tg, deps).errors)


# ---- warnings: duplicate entries, edges that order nothing -------------------------------------------------------
def test_a_duplicate_dep_entry_is_a_warning():
    tg = build_task_graph(load("mlp"))
    deps = tg.deps_map()
    j = next(k for k, v in deps.items() if v)
    deps[j] = deps[j] + [deps[j][0]]
    report = lint(tg, deps)
    dup = [i for i in report.issues if i.kind == "duplicate"]
    assert report.ok and [(i.first, i.second) for i in dup] == [(deps[j][0], j)]
    assert "2 times" in dup[0].message and "1 duplicate dep entries" in report.summary()


def test_an_edge_that_orders_nothing_is_a_warning():
    tg = build_task_graph(load("mlp"))
    deps = tg.deps_map()
    anc = {j: set() for j in deps}
    for j in sorted(deps):
        for d in deps[j]:
            anc[j] |= anc[d] | {d}
    # two tasks with no hazard, no declared order and no path between them
    hazards = {(h.first, h.second) for h in find_hazards(tg.tasks)}
    a, b = next((a, b) for b in sorted(deps) for a in range(b)
                if a not in anc[b] and (a, b) not in hazards and a not in tg.tasks[b].declared)
    deps[b] = deps[b] + [a]
    report = lint(tg, deps)
    nothing = [i for i in report.issues if i.kind == "orders-nothing"]
    assert report.ok and [(i.first, i.second) for i in nothing] == [(a, b)]
    assert "orders nothing" in nothing[0].message and "1 edges that order nothing" in report.summary()


@pytest.mark.parametrize("layer", LAYERS)
def test_lowered_layers_have_no_warnings_of_the_new_kinds(layer):
    report = lint(build_task_graph(_layer(layer, "tiny", 2)))
    assert not [i for i in report.issues if i.kind in ("duplicate", "orders-nothing")], report.summary()


# ---- across ranks ----------------------------------------------------------------------------------------------
def _optimised_moe():
    import passes

    return passes.run_pipeline(_layer("moe"), None).graph


def _without(g, node, dep):
    h = g.clone()
    h.nodes[node].deps = [d for d in h.nodes[node].deps if d.name != dep]
    h.invalidate()
    return h


def test_the_optimised_moe_is_clean_across_ranks():
    report = lint(build_task_graph(_optimised_moe()))
    assert report.ok and not report.issues, report.summary()


@pytest.mark.parametrize("node, dep, reader, writer", [
    ("moe.dispatch_gather", "moe.dispatch_wait", "moe.dispatch_gather", "moe.dispatch_push"),
    ("moe.shared_routed", "moe.combine_wait", "moe.shared_routed", "moe.combine"),
    ("moe.combine_wait", "moe.combine", "moe.shared_routed", "moe.combine"),
])
def test_a_read_of_remote_writes_no_wait_announces_is_a_remote_race(node, dep, reader, writer):
    tg = build_task_graph(_without(_optimised_moe(), node, dep))
    report = lint(tg)
    races = [i for i in report.issues if i.kind == "remote-race"]
    assert not report.ok and races and not report.races          # the local lint alone saw nothing
    assert (races[0].first, races[0].second) == (tg.task(writer).id, tg.task(reader).id)
    assert f"'{reader}' reads %" in races[0].message and "on the peer ranks" in races[0].message


def test_a_wait_not_ordered_after_its_own_notifier_is_an_unanchored_wait():
    tg = build_task_graph(_without(_optimised_moe(), "moe.dispatch_wait", "moe.dispatch_push"))
    report = lint(tg)
    warn = [i for i in report.issues if i.kind == "unanchored-wait"]
    assert report.ok and [(i.first, i.second) for i in warn] == [(tg.task("moe.dispatch_push").id,
                                                                 tg.task("moe.dispatch_wait").id)]
    assert "can hold the cores" in warn[0].message


def test_the_before_form_moe_has_both_unanchored_waits():
    report = lint(build_task_graph(_layer("moe", "tiny", 2)))
    assert report.count("unanchored-wait") == 2 and report.ok


def test_atomic_split_accumulations_are_order_dependent_warnings():
    tg = build_task_graph(_layer("decode-swa"))
    report = lint(tg)
    names = [tg.tasks[i.first].name for i in report.issues if i.kind == "order-dependent"]
    assert report.ok and names == ["hc.hc_pre_linear", "qkv.qr_proj_matmul", "qkv.kv_proj_matmul"]
    assert "3 order-dependent accumulations" in report.summary()

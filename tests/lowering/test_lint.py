"""The dependency lint, and the mutation test: deleting any single dep edge must be flagged."""
from __future__ import annotations

import pytest

from lowering import build_task_graph, lint, mutation_check
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

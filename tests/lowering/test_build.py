"""Graph → task graph: partition, buffers and views, directions, program order, deps and provenance."""
from __future__ import annotations

import json

import pytest

from dspark_ir import parse_graph
from lowering import LoweringError, TaskGraph, build_task_graph
from tests.lowering.conftest import GRAPH_NAMES, load


def test_views_are_not_tasks_and_concat_places_its_operands():
    tg = build_task_graph(load("mlp"))
    assert [t.name for t in tg.tasks] == ["n.xn", "mm.acc", "mm.h", "mm.y", "mm.g", "out.sq"]
    y = tg.task("mm.y").args[-1]
    g = tg.task("mm.g").args[-1]
    assert (y.view.buffer, y.view.label()) == ("out.cat", "out.cat[:, 0:128]")
    assert (g.view.buffer, g.view.label()) == ("out.cat", "out.cat[:, 128:160]")
    assert tg.outputs["out.flat"].buffer == "out.cat"


def test_in_place_update_writes_its_operand_buffer():
    tg = build_task_graph(load("mlp"))
    acc = [a for a in tg.task("mm.h").args if a.param == "acc"][0]
    assert (acc.direction, acc.view.buffer) == ("inout", "mm.acc")
    assert tg.buffers["mm.acc"].kind == "local"
    assert tg.task("mm.h").dep_kinds[tg.task("mm.acc").id] == ["raw:mm.acc", "waw:mm.acc"]


def test_reader_of_old_contents_is_ordered_before_the_update():
    tg = build_task_graph(load("inplace"))
    old, upd = tg.task("a.old"), tg.task("a.upd")
    assert old.id < upd.id
    assert upd.dep_kinds[old.id] == ["war:acc"]
    assert tg.buffers["acc"].kind == "inout"
    assert tg.outputs["a.upd"].buffer == "acc"


def test_joins_are_dummies_and_declared_edges_are_kept():
    tg = build_task_graph(load("inplace"))
    late, sq = tg.task("b.late"), tg.task("b.sq")
    assert late.is_dummy and late.sched == "late_dep"
    assert sq.deps == [late.id] and sq.dep_kinds[late.id] == ["explicit"]
    sync = tg.task("a.sync")
    assert sync.declared == [tg.task("a.old").id, tg.task("a.upd").id]
    assert sync.deps == [tg.task("a.upd").id]  # a.old -> a.upd -> a.sync: the direct edge is implied


def test_unexpressible_views_become_copy_tasks():
    tg = build_task_graph(load("views"))
    kinds = {t.name: t.op for t in tg.tasks}
    assert kinds == {"v.sq": "mul", "v.flat": "reshape", "v.cat": "concat", "v.c2": "cast"}
    assert tg.outputs["v.rflat"].label() == "v.sq[2:6, :].reshape[256]"


@pytest.mark.parametrize("name", GRAPH_NAMES)
def test_json_round_trip(name):
    tg = build_task_graph(load(name))
    doc = json.loads(json.dumps(tg.to_json()))
    back = TaskGraph.from_json(doc)
    assert back.to_json() == tg.to_json()


def test_deps_point_backwards_and_are_transitively_reduced():
    import networkx as nx

    for name in GRAPH_NAMES:
        tg = build_task_graph(load(name))
        g = nx.DiGraph(tg.edges())
        g.add_nodes_from(range(len(tg)))
        assert all(d < t for d, t in tg.edges())
        assert set(nx.transitive_reduction(g).edges()) == set(g.edges())


def test_unbound_symbols_are_refused():
    g = parse_graph("graph @u<T>(%x: f32[T,8]) {\n  %y = mul(%x, %x) : f32[T,8]\n  return %y\n}\n")
    with pytest.raises(LoweringError, match="unbound symbol 'T'"):
        build_task_graph(g)


def test_template_coverage_lists_the_templated_op_kinds():
    from lowering.codegen import template_coverage

    covered = {op for op, ok in template_coverage().items() if ok}
    assert {"matmul", "rmsnorm", "cast", "add", "mul", "zeros", "reshape", "concat", "hc_pre_rms", "hc_pre_linear",
            "hc_pre_linear_reduce", "split_pre_post", "comb_sinkhorn", "mix_x", "hc_post", "o_proj_a", "quant_rows",
            "o_proj_b", "o_proj_b_dequant"} <= covered

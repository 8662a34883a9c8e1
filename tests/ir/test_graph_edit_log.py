"""Graph.record_edits: the log the graph's edit methods keep says what a snapshot diff would say (the node keys by
name before and after) and rebuilds the graph as it was (what `clone()` made before the edits), on random edit
sequences; an edit in place (touch / invalidate) marks it blind."""
from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_ir import layers
from dspark_ir.graph import Graph
from tests.graph_description import describe_graph

EDITS = ("add", "add_join", "remove", "replace", "rename", "rename_param", "deps", "insert_dep", "attrs",
         "same_attrs", "operand", "operands")


def _keys(g: Graph) -> dict[str, tuple]:
    return {n.name: g.node_key(n) for n in g.nodes.values()}


def _snapshot_diff(old: dict, new: dict) -> tuple[set, set, set]:
    return ({n for n in new if n not in old}, {n for n in old if n not in new},
            {n for n in new if n in old and new[n] != old[n]})


def _not_after(g: Graph, value, node) -> bool:
    """An edge value → node keeps the graph acyclic."""
    p = value.producer
    return p is None or (p is not node and not g.reaches(node, p))


def _edit(g: Graph, kind: str, pick) -> None:
    nodes = list(g.nodes.values())
    node = pick(nodes)
    tensors = [v for n in nodes for v in n.results if not v.type.is_token] + list(g.params)
    if kind == "add":
        v = pick(tensors)
        g.add_op("add", [v, v], names=g.fresh_name("probe.add"), near=pick([None, node]))
    elif kind == "add_join":
        g.add_op("join", [pick(tensors)], names=g.fresh_name("probe.join"), deps=[pick(tensors)])
    elif kind == "remove":
        dead = [n for n in nodes if not any(g.users(v) or v in g.returns for v in n.results)]
        if dead:
            g.remove_node(pick(dead))
    elif kind == "replace":
        old = pick(tensors)
        same = [v for v in tensors if v is not old and v.type == old.type
                and all(_not_after(g, v, u) for u in g.users(old))]
        if same:
            g.replace_uses(old, pick(same))
    elif kind == "rename":
        v = pick([v for n in nodes for v in n.results])
        g.rename(v, g.fresh_name(v.name + ".renamed"))
    elif kind == "rename_param":
        p = pick(g.params)
        g.rename(p, g.fresh_name(p.name + ".renamed"))
    elif kind in ("deps", "insert_dep"):
        ok = [v for v in tensors if _not_after(g, v, node)]
        if ok:
            v = pick(ok)
            if kind == "deps":
                g.set_deps(node, [*node.deps, v])
            else:
                g.insert_dep(node, pick(range(len(node.deps) + 1)), v)
    elif kind == "attrs":
        g.set_attrs(node, {**node.attrs, "probe": pick((1, 2))})
    elif kind == "same_attrs":
        g.set_attrs(node, dict(node.attrs))
    elif kind == "operand" and node.operands:
        i = pick(range(len(node.operands)))
        same = [v for v in tensors if v.type == node.operands[i].type and _not_after(g, v, node)]
        if same:
            g.set_operand(node, i, pick(same))
    elif kind == "operands":
        g.set_operands(node, list(node.operands))


@settings(max_examples=60, deadline=None)
@given(layer=st.sampled_from(["decode-swa", "moe"]), edits=st.lists(st.sampled_from(EDITS), max_size=12),
       data=st.data())
def test_the_log_says_what_a_snapshot_diff_says(layer, edits, data):
    g = layers.build(layer, config="tiny")
    was, keys = g.clone(), _keys(g)
    log = g.record_edits()
    for kind in edits:
        _edit(g, kind, lambda xs: data.draw(st.sampled_from(list(xs))))
    added, removed, modified = log.changes()
    assert (set(added), set(removed), set(modified)) == _snapshot_diff(keys, _keys(g))
    assert len(added) + len(removed) + len(modified) == len({*added, *removed, *modified})
    assert not log.blind and log.undefined() is None
    assert describe_graph(log.graph_before()) == describe_graph(was)


def test_an_untouched_graph_has_no_changes_and_rebuilds_as_it_was():
    g = layers.build("decode-csa", config="tiny")
    was = g.clone()
    log = g.record_edits()
    assert log.changes() == ([], [], [])
    assert describe_graph(log.graph_before()) == describe_graph(was)


def test_edits_in_place_make_the_log_blind():
    for edit in (Graph.touch, Graph.invalidate):
        g = layers.build("moe", config="tiny")
        log = g.record_edits()
        edit(g)
        assert log.blind
    g.stop_recording()
    g.touch()                     # nothing recorded: no log to mark


def test_a_use_of_a_value_the_graph_lacks_is_found():
    g = layers.build("moe", config="tiny")
    other = layers.build("moe", config="tiny")
    log = g.record_edits()
    node = next(n for n in g.nodes.values() if n.operands)
    foreign = other.add_op("add", [other.params[0], other.params[0]], names="probe.foreign").result
    node.operands[0] = foreign     # a pass that bypasses the graph's methods (the verifier names it too)
    log.saw(node)
    assert "probe.foreign" in log.undefined()

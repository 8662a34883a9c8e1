"""DOT export (networkx → pydot): op kind, result shapes and tiles on nodes, sub-blocks as clusters."""
from __future__ import annotations

import shutil
import subprocess

import pydot

from .graph import Graph, Node
from .text.printer import format_attrs, ordered_attrs

CORE_COLORS = {"cube": "#cfe2ff", "vector": "#d1e7dd", "mix": "#fff3cd", "none": "#eeeeee"}


def to_dot(g: Graph) -> str:
    dot = pydot.Dot(f'"{g.name}"', graph_type="digraph", rankdir="TB", fontname="Helvetica")
    dot.set_node_defaults(shape="box", style="rounded,filled", fontname="Helvetica", fontsize="10")
    clusters: dict[str, pydot.Cluster] = {}
    for p in g.params:
        dot.add_node(pydot.Node(_q("%" + p.name), label=_q(f"%{p.name}\\n{p.type}{' inout' if p.inout else ''}"),
                                shape="note", fillcolor="#ffffff"))
    for node in g.topo_order():
        target = dot
        if node.block:
            if node.block not in clusters:
                clusters[node.block] = pydot.Cluster(_cluster_id(node.block), label=_q(node.block), style="dashed")
                dot.add_subgraph(clusters[node.block])
            target = clusters[node.block]
        target.add_node(pydot.Node(_q(node.name), label=_q(_label(node)),
                                   fillcolor=CORE_COLORS.get(node.opdef.core_of(node.attrs), "#ffffff")))
    for node in g.nodes.values():
        for v in node.operands:
            src = v.producer.name if v.producer else "%" + v.name
            dot.add_edge(pydot.Edge(_q(src), _q(node.name), label=_q(str(v.type)), fontsize="8"))
        for v in node.deps:
            src = v.producer.name if v.producer else "%" + v.name
            dot.add_edge(pydot.Edge(_q(src), _q(node.name), style="dashed", color="#c0392b"))
    dot.add_node(pydot.Node('"return"', shape="doublecircle", label='"return"', fillcolor="#ffffff"))
    for v in g.returns:
        src = v.producer.name if v.producer else "%" + v.name
        dot.add_edge(pydot.Edge(_q(src), '"return"'))
    return dot.to_string()


def _label(node: Node) -> str:
    attrs = ordered_attrs(node)
    lines = [node.name, node.op] + [str(v.type) for v in node.results]
    if attrs:
        lines.append(format_attrs(attrs).replace('"', "'"))
    return "\\n".join(lines)


def _q(s: str) -> str:
    return '"' + s.replace('"', '\\"') + '"'


def _cluster_id(block: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in block)


def have_graphviz() -> bool:
    return shutil.which("dot") is not None


def dot_to_svg(dot_text: str) -> str | None:
    """Render with graphviz when it is installed; None otherwise."""
    if not have_graphviz():
        return None
    done = subprocess.run(["dot", "-Tsvg"], input=dot_text, capture_output=True, text=True, timeout=120)
    return done.stdout if done.returncode == 0 else None

"""DOT export and SVG rendering of a graph: one cluster per block, changes of a pass highlighted.

Every node is drawn inside the cluster of its block (the `block.` prefix of its provenance name). Parameters are
nodes in small graphs (inside the cluster of their readers when those share one block); in larger ones a node's
label names the parameters it reads ("reads %w, %x"): a layer's ~30 parameters as nodes doubled its width.
Labels are short (name, op, result types, a wrapped attribute line); the full attributes and edge types are in
the SVG tooltips.

Graphviz 2.43 aborts on clustered graphs with the classic ranking ("trouble in init_rank") and loses edges
between clusters ("lost ... edge") when spline routing fails: `newrank=true` and polyline edges avoid both. The
renderer tries that layout, then the same graph without clusters, and otherwise raises one RenderError line with
graphviz's version and first message: it never returns an empty SVG.
"""
from __future__ import annotations

import shutil
import subprocess
import textwrap
from dataclasses import dataclass, field
from typing import Iterable

from .errors import DsparkError
from .graph import Graph, Node, Value
from .text.printer import format_attrs, ordered_attrs

CORE_COLORS = {"cube": "#cfe2ff", "vector": "#d1e7dd", "mix": "#fff3cd", "none": "#eeeeee"}
ADDED, MODIFIED, REMOVED = "#198754", "#d63384", "#6c757d"      # border colours of the highlighted nodes
ATTR_WIDTH = 44                                                   # characters per attribute line in a label
ATTR_LINES = 2
PARAM_NODES_UP_TO = 20        # graphs of more nodes name the parameters a node reads in its label, not as nodes


class RenderError(DsparkError):
    """Graphviz is missing or failed on a graph."""


@dataclass(frozen=True)
class Changes:
    """What a pass did to the graph drawn: names of added and modified nodes, and the removed nodes (from the graph
    before the pass), drawn as dashed ghosts where they were."""
    added: frozenset[str] = frozenset()
    modified: frozenset[str] = frozenset()
    removed: tuple[Node, ...] = field(default=())

    @staticmethod
    def of(before: Graph | None, added: Iterable[str], removed: Iterable[str], modified: Iterable[str]) -> "Changes":
        ghosts = tuple(before.nodes[n] for n in removed if before is not None and n in before.nodes)
        return Changes(frozenset(added), frozenset(modified), ghosts)

    def __bool__(self) -> bool:
        return bool(self.added or self.modified or self.removed)


def to_dot(g: Graph, changes: Changes | None = None, *, clusters: bool = True) -> str:
    """The graph as DOT text; `changes` highlights what a pass added (green), changed (pink) and removed (ghosts)."""
    changes = changes or Changes()
    ids: dict[str, str] = {}

    def ident(key: str) -> str:
        return ids.setdefault(key, f"n{len(ids)}")

    def source(v: Value) -> str:
        return ident(v.producer.name if v.producer else "%" + v.name)

    groups: dict[str, list[str]] = {}                      # block → node statements ("" = top level)
    readers: dict[str, set[str]] = {}
    for node in g.nodes.values():
        for v in node.operands:
            if v.producer is None:
                readers.setdefault(v.name, set()).add(node.block)
    drawn = {p.name for p in g.params} if len(g) <= PARAM_NODES_UP_TO else {v.name for v in g.returns}
    for p in g.params:
        if p.name not in drawn:
            continue
        blocks = readers.get(p.name, set())
        block = next(iter(blocks)) if len(blocks) == 1 else ""
        label = _label([f"%{p.name}", f"{p.type}{' inout' if p.inout else ''}"])
        groups.setdefault(block, []).append(
            f'{ident("%" + p.name)} [label={label}, shape=note, fillcolor="#ffffff", fontsize=8]')
    for node in g.topo_order():
        params = [v.name for v in node.operands if v.producer is None and v.name not in drawn]
        groups.setdefault(node.block, []).append(f"{ident(node.name)} [{_node_attrs(node, changes, params)}]")
    ghost_edges = []
    for ghost in changes.removed:
        key = "-" + ghost.name
        label = _label([f"removed: {_short(ghost)}", ghost.op])
        groups.setdefault(ghost.block, []).append(
            f'{ident(key)} [label={label}, style="dashed,rounded", '
            f'color="{REMOVED}", fontcolor="{REMOVED}", fillcolor="#ffffff", tooltip={_q(_tooltip(ghost))}]')
        for v in ghost.operands:
            if (v.producer.name if v.producer else "%" + v.name) in ids:
                ghost_edges.append(f'{source(v)} -> {ident(key)} [style=dashed, color="{REMOVED}"]')

    title = g.name
    if changes:
        title += (f" · {len(changes.added)} added (green), {len(changes.modified)} changed (pink), "
                  f"{len(changes.removed)} removed (dashed)")
    lines = [f"digraph {_q(g.name)} {{",
             f'graph [rankdir=TB, newrank=true, splines=polyline, nodesep=0.15, ranksep=0.3, '
             f'fontname=Helvetica, fontsize=12, labelloc=t, label={_q(title)}];',
             'node [shape=box, style="rounded,filled", fontname=Helvetica, fontsize=9, margin="0.06,0.03"];',
             'edge [arrowsize=0.5, color="#555555"];']
    for i, (block, stmts) in enumerate(sorted(groups.items())):
        if block and clusters:
            lines.append(f'subgraph cluster_{i} {{ label={_q(block)}; style="dashed,rounded"; color="#999999";')
            lines += ["  " + s + ";" for s in stmts]
            lines.append("}")
        else:
            lines += [s + ";" for s in stmts]
    for node in g.topo_order():
        for v in node.operands:
            if v.producer is None and v.name not in drawn:
                continue                                    # named in the reader's label instead
            lines.append(f"{source(v)} -> {ident(node.name)} [tooltip={_q(f'%{v.name}: {v.type}')}];")
        for v in node.deps:
            if v.producer is None and v.name not in drawn:
                continue
            lines.append(f'{source(v)} -> {ident(node.name)} [style=dashed, color="#c0392b", tooltip="dep"];')
    lines += [e + ";" for e in ghost_edges]
    ret = ident("return")
    lines.append(f'{ret} [label="return", shape=doublecircle, fillcolor="#ffffff", fontsize=8];')
    for v in g.returns:
        lines.append(f"{source(v)} -> {ret};")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _short(node: Node) -> str:
    """The name inside its block's cluster."""
    return node.name.split(".", 1)[1] if node.block else node.name


def _tooltip(node: Node) -> str:
    attrs = ordered_attrs(node)
    return f"{node.name} = {node.op}" + (f" {format_attrs(attrs)}" if attrs else "")


def _node_attrs(node: Node, changes: Changes, params: list[str]) -> str:
    lines = [_short(node), node.op + " → " + ", ".join(str(v.type) for v in node.results)]
    if params:
        lines += textwrap.wrap("reads " + ", ".join("%" + p for p in dict.fromkeys(params)), ATTR_WIDTH)
    attrs = ordered_attrs(node)
    if attrs:
        wrapped = textwrap.wrap(format_attrs(attrs), ATTR_WIDTH)
        lines += wrapped[:ATTR_LINES] + (["…"] if len(wrapped) > ATTR_LINES else [])
    fill = CORE_COLORS.get(node.opdef.core_of(node.attrs), "#ffffff")
    extra = ""
    if node.name in changes.added:
        lines[0] = "added: " + lines[0]
        extra = f', color="{ADDED}", penwidth=3'
    elif node.name in changes.modified:
        lines[0] = "changed: " + lines[0]
        extra = f', color="{MODIFIED}", penwidth=3'
    return f'label={_label(lines)}, fillcolor="{fill}", tooltip={_q(_tooltip(node))}{extra}'


def _escape(s: str) -> str:
    return s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ")


def _q(s: str) -> str:
    """A one-line DOT string."""
    return '"' + _escape(s) + '"'


def _label(lines: list[str]) -> str:
    """A DOT string of centred lines."""
    return '"' + "\\n".join(map(_escape, lines)) + '"'


def have_graphviz() -> bool:
    return shutil.which("dot") is not None


def graphviz_version() -> str:
    try:
        done = subprocess.run(["dot", "-V"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return "graphviz"
    words = done.stderr.split()
    return f"graphviz {words[words.index('version') + 1]}" if "version" in words[:-1] else "graphviz"


def render_svg(g: Graph, changes: Changes | None = None) -> str:
    """The graph as SVG: clustered by block, else flat; raises RenderError (one line), never returns ''."""
    if not have_graphviz():
        raise RenderError("SVG needs graphviz's `dot` on PATH (apt-get install graphviz); write .dot instead")
    first_error = ""
    for clusters in (True, False):
        ok, out = _run_dot(to_dot(g, changes, clusters=clusters))
        if ok:
            return out
        first_error = first_error or out
    raise RenderError(f"{graphviz_version()} failed to lay out graph @{g.name}: {first_error}")


def dot_to_svg(dot_text: str) -> str:
    """Render DOT text; raises RenderError with graphviz's first message when it fails."""
    if not have_graphviz():
        raise RenderError("SVG needs graphviz's `dot` on PATH (apt-get install graphviz); write .dot instead")
    ok, out = _run_dot(dot_text)
    if not ok:
        raise RenderError(f"{graphviz_version()} failed on the DOT text: {out}")
    return out


def _run_dot(text: str) -> tuple[bool, str]:
    """(True, svg) or (False, graphviz's first error line). Graphviz may exit 0 with an error on stderr and a
    truncated picture, or exit 1 after writing a partial SVG: both count as failures."""
    try:
        done = subprocess.run(["dot", "-Tsvg"], input=text, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired:
        return False, "timed out after 300 s"
    errors = [line.strip() for line in done.stderr.splitlines() if line.strip().startswith("Error")]
    if done.returncode != 0 or errors or "</svg>" not in done.stdout:
        first = errors[0] if errors else (done.stderr.strip().splitlines() or [f"exit {done.returncode}"])[0]
        return False, first
    return True, done.stdout

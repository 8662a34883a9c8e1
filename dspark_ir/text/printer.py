"""Graph → text. Canonical: the same graph always prints to the same bytes."""
from __future__ import annotations

from typing import Any, Iterable

from ..graph import Graph, Module, Node
from ..ops.base import COMMON_ATTRS, format_attr_value
from .strings import printable


def print_graph(g: Graph, header: Iterable[str] = ()) -> str:
    lines = [f"# {printable(h)}" if h else "#" for h in header]
    lines.append(_signature(g))
    block = None
    for node in g.topo_order():
        if node.block != block:
            block = node.block
            lines.append(f"  # {block or '(top)'}")
        lines.append("  " + format_node(node))
    rets = ", ".join(f"%{v.name}" for v in g.returns)
    lines.append(f"  return {rets}" if rets else "  return")
    lines.append("}")
    return "\n".join(lines) + "\n"


def print_module(m: Module, header: Iterable[str] = ()) -> str:
    texts = [print_graph(g, header if i == 0 else ()) for i, g in enumerate(m.graphs)]
    return "\n".join(texts)


def _signature(g: Graph) -> str:
    symbols = ""
    if g.symbols:
        symbols = "<" + ", ".join(k if v is None else f"{k} = {v}" for k, v in g.symbols.items()) + ">"
    params = ",\n".join(f"    %{p.name}: {p.type}{' inout' if p.inout else ''}" for p in g.params)
    params = f"(\n{params}\n)" if params else "()"
    attrs = f" attributes {format_attrs(g.attributes, sort=True)}" if g.attributes else ""
    return f"graph @{g.name}{symbols}{params}{attrs} {{"


def format_node(node: Node) -> str:
    results = ", ".join(f"%{v.name}" for v in node.results)
    operands = ", ".join(f"%{v.name}" for v in node.operands)
    text = f"{results} = {node.op}({operands})"
    attrs = ordered_attrs(node)
    if attrs:
        schema = node.opdef.all_attrs()
        bare = {k for k, v in attrs.items() if schema[k].kind == "enum"}
        text += " " + format_attrs(attrs, bare=bare)
    if node.deps:
        text += " deps(" + ", ".join(f"%{v.name}" for v in node.deps) + ")"
    text += " : " + ", ".join(str(v.type) for v in node.results)
    return text


def ordered_attrs(node: Node) -> dict[str, Any]:
    """Explicit attributes in schema order: the op's own, then the common scheduling ones."""
    opdef = node.opdef
    shown = opdef.explicit_attrs(node.attrs)
    order = list(opdef.attrs) + list(COMMON_ATTRS)
    return {k: shown[k] for k in order if k in shown}


def format_attrs(attrs: dict[str, Any], sort: bool = False, bare: set[str] = frozenset()) -> str:
    """`{k = v, ...}`; keys in `bare` are enum names and print without quotes."""
    keys = sorted(attrs) if sort else list(attrs)
    items = (f"{k} = {attrs[k] if k in bare else format_attr_value(attrs[k])}" for k in keys)
    return "{" + ", ".join(items) + "}"

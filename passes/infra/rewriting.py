"""Small graph-editing helpers for pass authors (pure functions over dspark_ir.Graph)."""
from __future__ import annotations

from operator import attrgetter
from typing import Sequence

from dspark_ir.graph import Graph, Node, Value
from dspark_ir.ops.core import Join

_PRODUCER = attrgetter("producer")


def writes_in_place(node: Node) -> bool:
    """The node updates one of its operands in place (an alias whose operand is present)."""
    return any(o < len(node.operands) for o in node.opdef.aliases.values())


def has_side_effects(node: Node) -> bool:
    """May the node be removed when unused, or merged with an equal node? An op may declare
    `side_effects = True/False`; otherwise collectives, in-place updates and token producers (other than
    `join`) count as effects."""
    declared = getattr(node.opdef, "side_effects", None)
    if declared is not None:
        return bool(declared)
    if node.opdef.collective or writes_in_place(node):
        return True
    return node.opdef is not Join and any(v.type.is_token for v in node.results)


def is_returned(g: Graph, node: Node) -> bool:
    return node in map(_PRODUCER, g.returns)        # nodes compare by identity


def is_dead(g: Graph, node: Node) -> bool:
    return not any(g.users(v) for v in node.results) and not is_returned(g, node)


def replace_node(g: Graph, node: Node, values: Sequence[Value]) -> None:
    """Point every use of `node`'s results at `values` (same order), then delete `node`."""
    for old, new in zip(node.results, values):
        g.replace_uses(old, new)
    g.remove_node(node)


def set_operand(g: Graph, node: Node, index: int, value: Value) -> None:
    g.set_operand(node, index, value)


def set_deps(g: Graph, node: Node, deps: Sequence[Value]) -> None:
    g.set_deps(node, deps)


def set_attrs(g: Graph, node: Node, **attrs) -> None:
    g.set_attrs(node, node.opdef.normalize_attrs({**node.attrs, **attrs}))


def erase_if_dead(g: Graph, node: Node) -> bool:
    """Remove `node` when nothing uses it and it has no side effects; True if removed."""
    if node.name in g.nodes and is_dead(g, node) and not has_side_effects(node):
        g.remove_node(node)
        return True
    return False


def selected(node: Node, names: Sequence[str]) -> bool:
    """`names` lists op kinds, stage names (the node name after its block, `kv_proj_matmul`) or full node names."""
    stage = node.name.split(".", 1)[-1]
    return node.op in names or stage in names or node.name in names


def not_one_block(g: Graph, node: Node) -> str | None:
    """Why `node` is not a one-block (`pl.at`) task, or None when it is one (a grid pass's precondition)."""
    blocks = node.attrs.get("blocks")
    if blocks is None or blocks.value(g.env) != 1:
        return f"already {blocks} blocks (not a one-block `pl.at` task)"
    return None

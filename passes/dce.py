"""dce: remove nodes whose results nothing uses."""
from __future__ import annotations

from dataclasses import dataclass

from dspark_ir.graph import Graph, Node

from .infra.base import Pass, RewriteRecord, Skip, register_pass
from .infra.contracts import BITWISE
from .infra.rewriting import has_side_effects, is_dead


@register_pass
@dataclass(frozen=True)
class DCE(Pass):
    """Dead-code elimination: erase nodes with no users whose results the graph does not return.

    Nodes are visited in reverse print order, so a chain of dead nodes goes in one sweep. Nodes with side
    effects (collectives, in-place updates, token producers other than join) stay even when unused; an op
    can declare `side_effects = False` to allow it.
    """

    name = "dce"
    origin = "ours: cleanup (no seed counterpart)"
    contract = BITWISE
    guarantees = frozenset({"no-dead-nodes"})
    preserves = frozenset({"canonical", "no-common-subexpressions"})

    def match(self, g: Graph):
        for node in reversed(g.topo_order()):
            if not is_dead(g, node):
                continue
            if has_side_effects(node):
                yield Skip(node.name, f"unused, but '{node.op}' has side effects")
                continue
            yield node

    def rewrite(self, g: Graph, node: Node) -> RewriteRecord | None:
        if not is_dead(g, node):
            return None
        g.remove_node(node)
        return RewriteRecord("erase", node.name, f"unused {node.op}")

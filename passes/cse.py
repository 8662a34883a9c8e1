"""cse: merge nodes that compute the same value from the same operands."""
from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

from dspark_ir.graph import Graph, Node

from . import canonicalize
from .infra.base import Pass, RewriteRecord, Skip, register_pass
from .infra.contracts import BITWISE
from .infra.rewriting import has_side_effects, is_returned, replace_node

# Canonical forms a merge can break: a dep or join operand that now repeats, or a dep now implied.
TIDY_RULES = ("join-operands", "canonical-deps")
_TYPE = attrgetter("type")


@dataclass(frozen=True)
class Site:
    node: Node        # the later duplicate, replaced
    keep: Node        # the first node with the same key


@register_pass
@dataclass(frozen=True)
class CSE(Pass):
    """Common-subexpression elimination: a node equal to an earlier one is replaced by it.

    Two nodes are equal when they have the same op, the same operand values in the same order, the same
    attributes (scheduling attributes included), the same deps and the same result types. Nodes with side
    effects (collectives, in-place updates, token producers other than join) and allocations (`zeros`: each
    is its own buffer) never merge. The later node of a pair goes; its users read the earlier node. A
    duplicate whose result the graph returns is kept, so return names stay stable.
    A merge can leave a repeated or implied dep, or a repeated join operand; cse applies canonicalize's
    canonical-deps and join-operands rules afterwards, so a canonical graph stays canonical.
    """

    name = "cse"
    origin = "ours: cleanup (no seed counterpart)"
    contract = BITWISE
    guarantees = frozenset({"no-common-subexpressions"})
    preserves = frozenset({"canonical"})

    def match(self, g: Graph):
        yield from self._duplicates(g)
        yield from _tidy_sites(g)

    def _duplicates(self, g: Graph):
        seen: dict[tuple, Node] = {}
        for node in g.topo_order():
            if node.name not in g.nodes:
                continue
            key = node_key(g, node)
            first = seen.setdefault(key, node)
            if first is node:
                continue
            reason = _blocker(g, node)
            if reason:
                yield Skip(node.name, f"same as %{first.name}, but {reason}")
                continue
            yield Site(node, first)

    def rewrite(self, g: Graph, site) -> RewriteRecord | None:
        if isinstance(site, canonicalize.Site):
            return canonicalize.Canonicalize().rewrite(g, site)
        if g.nodes.get(site.keep.name) is not site.keep or node_key(g, site.keep) != node_key(g, site.node):
            return None
        replace_node(g, site.node, site.keep.results)
        return RewriteRecord("merge", site.node.name, f"same as %{site.keep.name}")


def _tidy_sites(g: Graph):
    for node in g.topo_order():
        if node.name not in g.nodes:
            continue
        for name in TIDY_RULES:
            rule = canonicalize.RULES_BY_NAME[name]
            if rule.applies_to(node) and rule.check(g, node) is True:
                yield canonicalize.Site(name, node)
                break


def node_key(g: Graph, node: Node) -> tuple:
    return (node.op, tuple(map(id, node.operands)), g.attr_key(node.attrs), tuple(sorted(map(id, node.deps))),
            tuple(map(str, map(_TYPE, node.results))))


def _blocker(g: Graph, node: Node) -> str:
    if has_side_effects(node):
        return f"'{node.op}' has side effects"
    if node.opdef.allocates:
        return f"'{node.op}' allocates a distinct buffer"
    if is_returned(g, node):
        return "its result is returned by the graph"
    return ""

"""retiled-cse: a node that computes what an earlier node computes, only tiled differently, reads the earlier one."""
from __future__ import annotations

from dataclasses import dataclass

from dspark_ir.graph import Graph, Node

from .infra import policy
from .infra.base import Pass, RewriteRecord, Skip, register_pass
from .infra.contracts import BITWISE
from .infra.rewriting import has_side_effects, is_returned, replace_node

# How a task's work is split: none of these changes a value of an op in `ops` (their references ignore them).
TILING = frozenset({"tile", "blocks", "tail", "aer", "workers"})


@dataclass(frozen=True)
class Site:
    node: Node          # the later task, removed
    keep: Node          # the first task with the same op, operands and value attributes


@register_pass
@dataclass(frozen=True)
class RetiledCse(Pass):
    """Replace a task by an earlier task of the same op on the same operands that differs only in its tiling.

    Before: every attention layer builds the per-token RoPE tables twice from the same rope_cos, rope_sin and
    positions: `qkv.q_rope_prepare` (row-tiled, for the q and kv RoPE) and `<attn>.rope_cs` (one or two
    blocks, for the inverse RoPE of the output pack). cse does not merge them, because their `tile`/`blocks`
    attributes differ. After: the later task is gone and its readers read the earlier one's tables: one task
    and one [T, rope_dim] bf16 pair less per layer. The earlier task is kept (it comes first in topological
    order, so its readers are not delayed; the later readers come after it anyway: it depends on no more than
    the task it replaces).

    Equal values: the two tasks run the same op on the same operand values with the same value attributes
    (`rope_dim`); the attributes that may differ (`tile`, `blocks`, `tail`, `aer`, `workers`) only split the
    work, and the op's reference (the numpy semantics) ignores them. Which ops: those in `ops` (a table
    builder whose result does not depend on its grid; an op whose reduction order follows its tile, e.g. a
    matmul's k_split, is not one). Contract: bitwise.

    Left alone, with the reason (`--explain retiled-cse`): a task whose value attributes differ, a task whose
    explicit deps differ from the earlier one's (its readers would lose or gain an ordering edge), a task
    whose result the graph returns (return names stay stable), and ops with side effects or allocations.
    An exact duplicate (same tiling too) is cse's: this pass merges it as well, the result is the same.
    """

    name = "retiled-cse"
    origin = "ours: an extension of cse to tiling-only differences (off by default; not in the seed)"
    contract = BITWISE
    ops: tuple[str, ...] = policy.RETILED_CSE_OPS

    def match(self, g: Graph):
        first: dict[tuple, Node] = {}
        for node in g.topo_order():
            if node.op not in self.ops:
                continue
            keep = first.setdefault(_operand_key(node), node)
            if keep is node:
                continue
            verdict = _refusal(g, node, keep)
            yield Site(node, keep) if verdict is None else Skip(node.name, verdict)

    def rewrite(self, g: Graph, site: Site) -> RewriteRecord | None:
        node, keep = site.node, site.keep
        if g.nodes.get(keep.name) is not keep or _refusal(g, node, keep) is not None:
            return None
        differ = sorted(k for k in node.attrs.keys() | keep.attrs.keys() if node.attrs.get(k) != keep.attrs.get(k))
        replace_node(g, node, keep.results)
        tiling = f" (tiling differs: {', '.join(differ)})" if differ else " (an exact duplicate)"
        return RewriteRecord("share", node.name, f"its readers read %{keep.name}{tiling}")


def _operand_key(node: Node) -> tuple:
    """Op and operand values: tasks that may compute the same thing."""
    return node.op, tuple(map(id, node.operands))


def _value_attrs(node: Node) -> dict:
    return {k: v for k, v in node.attrs.items() if k not in TILING}


def _refusal(g: Graph, node: Node, keep: Node) -> str | None:
    """Why `node` cannot read `keep`'s results instead of computing its own (None: it can)."""
    if has_side_effects(node) or node.opdef.allocates:
        return f"'{node.op}' has side effects or allocates a buffer"
    mine, theirs = _value_attrs(node), _value_attrs(keep)
    if mine != theirs:
        names = sorted(k for k in mine.keys() | theirs.keys() if mine.get(k) != theirs.get(k))
        return f"same operands as %{keep.name}, but other values of {', '.join(names)}"
    if [str(v.type) for v in node.results] != [str(v.type) for v in keep.results]:
        return f"same operands as %{keep.name}, but other result types"
    if set(map(id, node.deps)) != set(map(id, keep.deps)):
        return f"its explicit deps differ from %{keep.name}'s: its readers would lose or gain an ordering edge"
    if is_returned(g, node):
        return "its result is returned by the graph"
    return None

"""canonicalize: one canonical form for the core ops, so later matchers see each pattern one way."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import networkx as nx

from dspark_ir import dims as D
from dspark_ir.errors import VerifyError
from dspark_ir.graph import Graph, Node
from dspark_ir.ops import OpDef
from dspark_ir.ops.core import Cast, Concat, Join, Reshape, Slice
from dspark_ir.types import DType

from .infra.base import Pass, RewriteRecord, Skip, register_pass
from .infra.contracts import BITWISE
from .infra.rewriting import erase_if_dead, is_returned, replace_node, set_attrs, set_deps, set_operand

# Casts a -> b that are exact for every value of a (so cast(cast(x, b), a) == x).
EXACT_WIDENING = {(DType.bf16, DType.fp32), (DType.fp16, DType.fp32), (DType.fp8, DType.bf16),
                  (DType.fp8, DType.fp16), (DType.fp8, DType.fp32)}


@dataclass(frozen=True)
class Site:
    rule: str
    node: Node


@dataclass(frozen=True)
class Rule:
    name: str
    ops: tuple[type[OpDef], ...]                    # the op kinds it looks at; empty: every op
    check: Callable[[Graph, Node], "bool | str"]   # True: fires; a str: why it does not (a near miss)
    apply: Callable[[Graph, Node], str]             # rewrites; returns the record's detail

    def applies_to(self, node: Node) -> bool:
        return not self.ops or node.opdef in self.ops


@register_pass
@dataclass(frozen=True)
class Canonicalize(Pass):
    """Fold reshape/slice/cast chains, drop identity ops, and put explicit deps in canonical form.

    Rules (all bitwise: they never change a computed value):
    * fold-reshape-chain   reshape(reshape(x)) -> reshape(x)
    * identity-reshape     reshape(x) to x's own shape -> x
    * fold-slice-chain     slice(slice(x, axis a), axis a) -> one slice of x
    * identity-slice       slice of a whole axis -> x
    * identity-cast        cast of a float to its own dtype -> x (integer casts go through f32 in the
                           reference, so they are kept)
    * fold-cast-roundtrip  cast(cast(x: A, B), A) -> x when A -> B is an exact widening (bf16 -> f32, ...)
    * single-concat        concat(x) -> x
    * join-operands        join drops repeated operands; join(t) of one token -> t
    * canonical-deps       deps deduplicated, sorted by name, and dropped when a data or other dep edge
                           already orders the producer before the node
    A node whose result the graph returns is never replaced (the return names stay stable); nodes that a
    fold leaves unused are erased when they have no side effects.
    """

    name = "canonicalize"
    origin = "ours: cleanup every matcher relies on (no seed counterpart)"
    contract = BITWISE
    guarantees = frozenset({"canonical"})

    def match(self, g: Graph):
        for node in g.topo_order():
            for rule in RULES:
                if not rule.applies_to(node):
                    continue
                verdict = rule.check(g, node)
                if verdict is True:
                    yield Site(rule.name, node)
                    break
                if isinstance(verdict, str):
                    yield Skip(node.name, f"{rule.name}: {verdict}")

    def rewrite(self, g: Graph, site: Site) -> RewriteRecord | None:
        rule = RULES_BY_NAME[site.rule]
        if rule.check(g, site.node) is not True:
            return None
        return RewriteRecord(rule.name, site.node.name, rule.apply(g, site.node))


# ---- helpers ------------------------------------------------------------------------------------
def _same_shape(g: Graph, a, b) -> bool:
    return len(a) == len(b) and all(x == y or x.evaluate(g.env) == y.evaluate(g.env) for x, y in zip(a, b))


def _replaceable(g: Graph, node: Node) -> bool | str:
    if is_returned(g, node):
        return "its result is returned by the graph (return names stay stable)"
    return True


def _forward(g: Graph, node: Node, what: str) -> str:
    """Replace `node` by its first operand."""
    src = node.operands[0]
    _redirect(g, node, src)
    return f"{what} -> %{src.name}"


def _redirect(g: Graph, node: Node, src) -> None:
    """Replace `node` by the value `src`. Deps on `node` are dropped when `src` is a tensor parameter:
    a parameter is ready before anything runs (and a dep must name an op's result or a token)."""
    if src.producer is None and not src.type.is_token:
        for user in g.users(node.result):
            if node.result in user.deps:
                set_deps(g, user, [d for d in user.deps if d is not node.result])
    replace_node(g, node, [src])


def _producer(node: Node, op: type[OpDef]) -> Node | None:
    p = node.operands[0].producer if node.operands else None
    return p if p is not None and p.opdef is op else None


# ---- reshape ------------------------------------------------------------------------------------
def _check_reshape_chain(g: Graph, node: Node) -> bool | str:
    return _producer(node, Reshape) is not None


def _apply_reshape_chain(g: Graph, node: Node) -> str:
    inner = node.operands[0].producer
    set_operand(g, node, 0, inner.operands[0])
    erased = " (erased)" if erase_if_dead(g, inner) else ""
    return f"reads %{node.operands[0].name} instead of %{inner.name}{erased}"


def _check_identity_reshape(g: Graph, node: Node) -> bool | str:
    if not _same_shape(g, node.attrs["shape"], node.operands[0].type.shape):
        return False
    return _replaceable(g, node)


# ---- slice --------------------------------------------------------------------------------------
def _check_slice_chain(g: Graph, node: Node) -> bool | str:
    inner = _producer(node, Slice)
    if inner is None:
        return False
    if inner.attrs["axis"] != node.attrs["axis"]:
        return "the inner slice cuts another axis"
    return True


def _apply_slice_chain(g: Graph, node: Node) -> str:
    inner = node.operands[0].producer
    start = D.add(inner.attrs["start"], node.attrs["start"])
    set_operand(g, node, 0, inner.operands[0])
    set_attrs(g, node, start=start)
    erased = " (erased)" if erase_if_dead(g, inner) else ""
    return f"slices %{node.operands[0].name} from {start} instead of %{inner.name}{erased}"


def _check_identity_slice(g: Graph, node: Node) -> bool | str:
    x = node.operands[0].type
    axis, start, size = node.attrs["axis"], node.attrs["start"], node.attrs["size"]
    if start.value(g.env) != 0 or not _same_shape(g, (size,), (x.shape[axis],)):
        return False
    return _replaceable(g, node)


# ---- cast ---------------------------------------------------------------------------------------
def _check_identity_cast(g: Graph, node: Node) -> bool | str:
    src = node.operands[0].type.dtype
    if node.attrs["to"] != src:
        return False
    if not src.is_float:
        return f"{src} -> {src} goes through f32 in the reference (not exact above 2**24)"
    return _replaceable(g, node)


def _check_cast_roundtrip(g: Graph, node: Node) -> bool | str:
    inner = _producer(node, Cast)
    if inner is None:
        return False
    a, b = inner.operands[0].type.dtype, inner.attrs["to"]
    if node.attrs["to"] != a or a == b:
        return False
    if (a, b) not in EXACT_WIDENING:
        return f"cast {a} -> {b} -> {a} may round"
    return _replaceable(g, node)


def _apply_cast_roundtrip(g: Graph, node: Node) -> str:
    inner = node.operands[0].producer
    src = inner.operands[0]
    _redirect(g, node, src)
    erased = " (erased inner)" if erase_if_dead(g, inner) else ""
    return f"cast round trip -> %{src.name}{erased}"


# ---- concat / join ------------------------------------------------------------------------------
def _check_single_concat(g: Graph, node: Node) -> bool | str:
    return len(node.operands) == 1 and _replaceable(g, node)


def _check_join(g: Graph, node: Node) -> bool | str:
    if len(set(map(id, node.operands))) != len(node.operands):
        return True
    if len(node.operands) == 1 and node.operands[0].type.is_token:
        return _replaceable(g, node)
    return False


def _apply_join(g: Graph, node: Node) -> str:
    if len(node.operands) == 1:
        return _forward(g, node, "join of one token")
    unique = list({id(v): v for v in node.operands}.values())
    g.set_operands(node, unique)
    return f"{len(unique)} distinct operands"


# ---- deps ---------------------------------------------------------------------------------------
def canonical_deps(g: Graph, node: Node) -> list:
    """The node's deps without repeats, without those another edge implies (except deps on collectives),
    sorted by name."""
    unique = list({id(v): v for v in node.deps}.values())
    keep = []
    for d in unique:
        if d.producer is None or d.producer.opdef.collective:
            # a collective's remote writes are invisible to hazard inference: its dep edges stay explicit
            keep.append(d)
            continue
        others = [v.producer for v in node.operands + [u for u in unique if u is not d] if v.producer is not None]
        implied = any(o is d.producer or _is_ancestor(g, d.producer, o) for o in others)
        if not implied:
            keep.append(d)
    return sorted(keep, key=lambda v: v.name)


def _is_ancestor(g: Graph, a: Node, b: Node) -> bool:
    """`a.name in nx.ancestors(g.to_networkx(), b.name)` (Graph.reaches, without building networkx)."""
    if b.name not in g.nodes:
        return a.name in nx.ancestors(g.to_networkx(), b.name)   # raises like before
    try:
        return g.reaches(a, b)
    except VerifyError:                                       # a cycle: no topological positions
        return a.name in nx.ancestors(g.to_networkx(), b.name)


def _check_deps(g: Graph, node: Node) -> bool | str:
    if not node.deps:
        return False
    return [v.name for v in canonical_deps(g, node)] != [v.name for v in node.deps]


def _apply_deps(g: Graph, node: Node) -> str:
    old = ", ".join(f"%{v.name}" for v in node.deps)
    deps = canonical_deps(g, node)
    set_deps(g, node, deps)
    return f"deps({old}) -> deps({', '.join(f'%{v.name}' for v in deps)})"


RULES: tuple[Rule, ...] = (
    Rule("fold-reshape-chain", (Reshape,), _check_reshape_chain, _apply_reshape_chain),
    Rule("identity-reshape", (Reshape,), _check_identity_reshape, lambda g, n: _forward(g, n, "identity reshape")),
    Rule("fold-slice-chain", (Slice,), _check_slice_chain, _apply_slice_chain),
    Rule("identity-slice", (Slice,), _check_identity_slice, lambda g, n: _forward(g, n, "whole-axis slice")),
    Rule("identity-cast", (Cast,), _check_identity_cast, lambda g, n: _forward(g, n, "identity cast")),
    Rule("fold-cast-roundtrip", (Cast,), _check_cast_roundtrip, _apply_cast_roundtrip),
    Rule("single-concat", (Concat,), _check_single_concat, lambda g, n: _forward(g, n, "concat of one")),
    Rule("join-operands", (Join,), _check_join, _apply_join),
    Rule("canonical-deps", (), _check_deps, _apply_deps),
)
RULES_BY_NAME = {r.name: r for r in RULES}

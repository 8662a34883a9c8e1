"""Test-case reduction: shrink a graph to a small one on which a check still fails (as mlir-reduce, C-Reduce).

`reduce_graph(g, fails)` keeps the smallest graph found so far and tries, in order:
1. focus: make one node's results the only returns (the node and its ancestors remain), nodes in print order,
   so the first that still fails gives the smallest such cone;
2. delta debugging (ddmin) over the nodes: remove a chunk, halving the chunks until single nodes;
3. drop returns one at a time.
A removed node's results that remaining nodes read become graph parameters of the same name and type (its deps
are dropped); nodes whose results nothing reads afterwards go too, and so do unread parameters. Every candidate
must verify. `fails(candidate)` is called only on verified candidates; the input itself is checked only when no
smaller graph fails (a full check of a large layer can take minutes).
"""
from __future__ import annotations

from typing import Callable, Iterable, Sequence

from .errors import DsparkError
from .graph import Graph
from .verifier import verify


class NotFailing(DsparkError):
    """The check passes on the input graph: nothing to reduce."""


def subgraph(g: Graph, keep: Iterable[str], returns: Sequence[str] | None = None) -> Graph | None:
    """The graph of the `keep` nodes (names), returning `returns` (value names; default: g's returns still
    defined), with cut values as parameters and dead nodes removed; None when it does not verify or returns
    nothing."""
    keep = set(keep)
    wanted = list(returns) if returns is not None else [v.name for v in g.returns]
    order = [n for n in g.topo_order() if n.name in keep]
    produced = {v.name for n in order for v in n.results}
    params = {p.name for p in g.params}
    wanted = [r for r in wanted if r in produced or r in params]
    # dead-node removal: walk backwards from the returns and the deps of live nodes
    live_values = set(wanted)
    live: list = []
    for node in reversed(order):
        if any(v.name in live_values for v in node.results):
            live.append(node)
            live_values.update(v.name for v in node.operands)
            live_values.update(v.name for v in node.deps if v.name in produced or v.name in params)
    live.reverse()
    if not live or not wanted:
        return None
    h = Graph(g.name, g.symbols, g.attributes)
    cut = {v.name: v for n in live for v in n.operands if v.producer is not None and v.name not in produced}
    for p in g.params:
        if p.name in live_values:
            h.add_param(p.name, p.type, p.inout)
    for name, v in sorted(cut.items(), key=lambda item: g.topo_index()[item[1].producer.name]):
        h.add_param(name, v.type)
    if cut and "layer" in h.attributes:     # the layer's golden inputs no longer match: random inputs
        del h.attributes["layer"]
    if wanted != [v.name for v in g.returns]:   # the golden output names no longer match the returns
        h.attributes.pop("outputs", None)
    try:
        for node in live:
            deps = [h.values[v.name] for v in node.deps if v.name in h.values]
            h.add_op(node.op, [h.values[v.name] for v in node.operands], node.attrs,
                     names=[v.name for v in node.results], deps=deps, types=[v.type for v in node.results],
                     loc=node.loc)
        h.set_returns([h.values[r] for r in wanted])
        verify(h)
    except DsparkError:
        return None
    return h


def reduce_graph(g: Graph, fails: Callable[[Graph], bool], log: Callable[[str], None] = lambda s: None) -> Graph:
    """The smallest graph found on which `fails` holds (module docstring); raises NotFailing if none does."""
    best: Graph | None = None
    tried: set[str] = set()

    def attempt(candidate: Graph | None) -> bool:
        nonlocal best
        if candidate is None:
            return False
        key = candidate.structural_hash()
        if key in tried:
            return False
        tried.add(key)
        if not fails(candidate):
            return False
        best = candidate
        log(f"reduce: {len(candidate)} nodes, {len(candidate.returns)} returns")
        return True

    current = g
    for node in g.topo_order():                                   # 1. focus on one node's cone
        cone = set(g.ancestors(node)) | {node.name}
        if len(cone) < len(g) and attempt(subgraph(g, cone, [v.name for v in node.results])):
            current = best
            break
    if best is None and not fails(g):
        raise NotFailing("the check passes on the input graph: nothing to reduce")
    best = best or g
    current = best
    nodes = [n.name for n in current.topo_order()]               # 2. ddmin over nodes
    chunks = 2
    while len(nodes) >= 2:
        size = -(-len(nodes) // chunks)
        parts = [nodes[i:i + size] for i in range(0, len(nodes), size)]
        for part in parts:
            drop = set(part)
            if attempt(subgraph(current, [n for n in nodes if n not in drop])):
                current = best
                nodes = [n.name for n in current.topo_order()]
                chunks = max(chunks - 1, 2)
                break
        else:
            if chunks >= len(nodes):
                break
            chunks = min(chunks * 2, len(nodes))
    changed = True                                                # 3. fewer returns
    while changed and len(current.returns) > 1:
        changed = False
        for i in range(len(current.returns)):
            rest = [v.name for j, v in enumerate(current.returns) if j != i]
            if attempt(subgraph(current, [n.name for n in current.topo_order()], rest)):
                current, changed = best, True
                break
    return current

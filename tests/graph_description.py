"""Everything a graph holds, as plain rows: two graphs are the same graph (names, order, attributes, edges, types,
the name counters) exactly when their descriptions are equal."""
from __future__ import annotations

from dspark_ir.graph import Graph


def describe_graph(g: Graph) -> list:
    rows = [(g.name, g.loc, list(g.symbols.items()), repr(g.attributes), sorted(g.values),
             [(p.name, str(p.type), p.inout) for p in g.params], [v.name for v in g.returns], g._next_seq,
             sorted(g._children.items()))]
    for n in g.nodes.values():
        rows.append((n.name, n.op, n.loc, n.seq, repr(n.attrs), [v.name for v in n.operands],
                     [v.name for v in n.deps], [(v.name, repr(v.type), v.index) for v in n.results]))
    return rows

"""Snapshots of the graph between passes, for the pass manager's change records.

`Snapshot.of(g)` takes, in one walk over the nodes, the node keys (everything that defines a node, by name, in
print order: what the change record compares) and the graph-level key, and keeps what `Graph.clone()` would
copy. `snapshot.graph()` makes that copy only when something asks for the graph as it was (an instrument that
compares with the graph before a pass, the reproducer of a failed pass): it is the same graph `g.clone()` would
have made when the snapshot was taken. Most passes never need it, and a clone costs twice the walk.
"""
from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from operator import attrgetter, itemgetter

from dspark_ir.graph import Graph, Node, Value
from dspark_ir.ops.base import format_attr_value

_NAME, _TYPE, _INDEX, _INOUT = attrgetter("name"), attrgetter("type"), attrgetter("index"), attrgetter("inout")
_FIRST, _SEQ, _KEY = itemgetter(0), itemgetter(3), itemgetter(5)
_OPERANDS, _RESULTS, _DEPS = itemgetter(1), itemgetter(2), itemgetter(4)     # of a node key


def node_key(g: Graph, n: Node) -> tuple:
    """(op, operand names, (result name, type text) pairs, g.attr_key of the attributes, dep names)."""
    results = n.results
    named = tuple(zip(map(_NAME, results), map(str, map(_TYPE, results))))
    return (n.op, tuple(map(_NAME, n.operands)), named, g.attr_key(n.attrs), tuple(map(_NAME, n.deps)))


@dataclass(eq=False)
class Snapshot:
    version: int                    # the graph's version when taken
    keys: dict[str, tuple]          # node name → node_key, in print order
    graph_key: tuple                # name, symbols, attributes, parameters, returns
    returns: int                    # how many values the graph returns
    _header: tuple                  # (name, symbols, attributes, loc, next seq, children, params, return names)
    _nodes: list[tuple]             # per node in g.nodes order: (name, op, attrs, seq, loc, key, types, indexes)
    _graph: Graph | None = None

    @staticmethod
    def of(g: Graph) -> "Snapshot":
        order = g.topo_order()
        keyed: dict[Node, tuple] = {}                   # nodes hash by identity
        nodes, attr_key = [], g.attr_key
        for n in g.nodes.values():                      # node_key and the copy, in one walk
            results = n.results
            if len(results) == 1:
                r = results[0]
                named, types, indexes = ((r.name, str(r.type)),), (r.type,), (r.index,)
            else:
                types, indexes = tuple(map(_TYPE, results)), tuple(map(_INDEX, results))
                named = tuple(zip(map(_NAME, results), map(str, types)))
            key = keyed[n] = (n.op, tuple(map(_NAME, n.operands)), named, attr_key(n.attrs),
                              tuple(map(_NAME, n.deps)))
            nodes.append((n.name, n.op, dict(n.attrs), n.seq, n.loc, key, types, indexes))
        # the model has ~1900 parameters: taken field by field (map, zip), not by a loop over them
        p_names, p_types = tuple(map(_NAME, g.params)), tuple(map(_TYPE, g.params))
        p_inouts = tuple(map(_INOUT, g.params))
        params = tuple(zip(p_names, p_types, p_inouts))
        returns = tuple(map(_NAME, g.returns))
        attributes = tuple(sorted((k, format_attr_value(v)) for k, v in g.attributes.items()))
        graph_key = (g.name, tuple(g.symbols.items()), attributes, tuple(zip(p_names, map(str, p_types), p_inouts)),
                     returns)
        header = (g.name, dict(g.symbols), dict(g.attributes), g.loc, g._next_seq, dict(g._children), params,
                  returns)
        return Snapshot(g.version, {n.name: keyed[n] for n in order}, graph_key, len(returns), header, nodes)

    @property
    def signature(self) -> tuple:
        """(name, type text, inout) of the parameters."""
        return self.graph_key[3]

    def graph(self) -> Graph:
        """The graph as `g.clone()` would have copied it when the snapshot was taken (made once)."""
        if self._graph is None:
            self._graph = self._clone()
        return self._graph

    def check(self) -> None:
        """Raise what `g.clone()` would have raised when the snapshot was taken (a graph with a repeated parameter
        or a use of an undefined value: a pass left it broken)."""
        params = self._header[6]
        defined = set(map(_FIRST, params))
        keys = list(map(_KEY, self._nodes))
        defined.update(map(_FIRST, chain.from_iterable(map(_RESULTS, keys))))
        if len(params) != len(set(map(_FIRST, params))) or not defined.issuperset(self._header[7]) \
                or not defined.issuperset(chain.from_iterable(map(_OPERANDS, keys))) \
                or not defined.issuperset(chain.from_iterable(map(_DEPS, keys))):
            self._clone()

    def _clone(self) -> Graph:
        """Graph.clone(), from the copied state."""
        name, symbols, attributes, loc, next_seq, children, params, returns = self._header
        g = Graph(name, symbols, attributes)
        g.loc = loc
        g._next_seq, g._children = next_seq, dict(children)
        for p_name, p_type, inout in params:
            g.add_param(p_name, p_type, inout)
        for n_name, op, attrs, seq, n_loc, key, types, indexes in sorted(self._nodes, key=_SEQ):
            copy = Node(n_name, op, [], [], dict(attrs), [], seq, n_loc)
            copy.results = [Value(r_name, t, copy, i) for (r_name, _), t, i in zip(key[2], types, indexes)]
            g.nodes[copy.name] = copy
            for v in copy.results:
                g.values[v.name] = v
        for n_name, _, _, _, _, key, _, _ in self._nodes:
            copy = g.nodes[n_name]
            copy.operands = [g.values[v] for v in key[1]]
            copy.deps = [g.values[v] for v in key[4]]
        g.returns = [g.values[v] for v in returns]
        return g


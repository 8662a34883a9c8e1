"""The graph: a typed DAG of op nodes over SSA values, with networkx views for analyses.

Nodes keep their operands in order; the networkx DiGraph (`to_networkx`) is derived from them and
carries edge kinds ("data" or "dep"). Node names come from provenance (`block.op[.suffix]`) and are
never derived from ids or traversal order. Every node has a sequence key (`seq`, a tuple of ints)
that breaks ties in the topological print order: appended nodes get `(n,)`, a node placed near an
existing one gets that node's key plus a child index, so rewrites keep the order stable.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping, Sequence

import networkx as nx

from .errors import ShapeError, VerifyError
from .ops import get_op
from .ops.base import OpDef
from .types import TensorType


@dataclass(eq=False)
class Value:
    name: str
    type: TensorType
    producer: "Node | None" = None
    index: int = 0
    inout: bool = False  # graph parameter updated in place

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


@dataclass(eq=False)
class Node:
    name: str
    op: str
    operands: list[Value]
    results: list[Value]
    attrs: dict[str, Any]
    deps: list[Value] = field(default_factory=list)
    seq: tuple[int, ...] = ()
    loc: str = ""  # source location when parsed from text

    @property
    def opdef(self) -> type[OpDef]:
        return get_op(self.op)

    @property
    def block(self) -> str:
        """The sub-block (region) this node belongs to: its name up to the first dot."""
        return self.name.split(".", 1)[0] if "." in self.name else ""

    @property
    def result(self) -> Value:
        assert len(self.results) == 1, f"{self.name} has {len(self.results)} results"
        return self.results[0]

    @property
    def where(self) -> str:
        return f"{self.loc}: node '{self.name}'" if self.loc else f"node '{self.name}'"

    def __repr__(self) -> str:
        return f"<Node {self.name} = {self.op}>"


class Graph:
    """A DSpark graph: symbols, parameters, nodes, returns and free-form graph attributes."""

    def __init__(self, name: str, symbols: Mapping[str, int | None] | None = None,
                 attributes: Mapping[str, Any] | None = None):
        self.name = name
        self.symbols: dict[str, int | None] = dict(symbols or {})
        self.attributes: dict[str, Any] = dict(attributes or {})
        self.params: list[Value] = []
        self.nodes: dict[str, Node] = {}
        self.returns: list[Value] = []
        self.values: dict[str, Value] = {}
        self.loc = ""
        self._next_seq = 0
        self._children: dict[tuple[int, ...], int] = {}
        self._users: dict[str, list[Node]] | None = None

    # ---- construction -----------------------------------------------------------------------
    @property
    def env(self) -> dict[str, int]:
        """The bound symbols, for evaluating dims."""
        return {k: v for k, v in self.symbols.items() if v is not None}

    def add_param(self, name: str, type: TensorType, inout: bool = False) -> Value:
        self._claim(name)
        v = Value(name, type, inout=inout)
        self.params.append(v)
        self.values[name] = v
        return v

    def add_op(self, op: str, operands: Sequence[Value], attrs: Mapping[str, Any] | None = None, *,
               names: str | Sequence[str], deps: Sequence[Value] = (), types: Sequence[TensorType] | None = None,
               near: Node | None = None, loc: str = "") -> Node:
        """Append a node. Result types come from the op's shape rule unless `types` is given."""
        opdef = get_op(op)
        node_attrs = opdef.normalize_attrs(attrs or {})
        result_names = self._result_names(opdef, names)
        if types is None:
            types = infer_types(opdef, [v.type for v in operands], node_attrs, result_names[0])
        if len(types) != len(result_names):
            raise ShapeError(f"op '{op}' makes {len(types)} results, {len(result_names)} names given",
                             f"node '{result_names[0]}'")
        for rn in result_names:
            self._claim(rn)
        node = Node(result_names[0], op, list(operands), [], node_attrs, list(deps), self._seq_for(near), loc)
        node.results = [Value(rn, t, node, i) for i, (rn, t) in enumerate(zip(result_names, types))]
        self.nodes[node.name] = node
        for v in node.results:
            self.values[v.name] = v
        self._users = None
        return node

    def set_returns(self, values: Iterable[Value]) -> None:
        self.returns = list(values)
        self._users = None

    def _result_names(self, opdef: type[OpDef], names: str | Sequence[str]) -> list[str]:
        if not isinstance(names, str):
            return list(names)
        if len(opdef.results) == 1:
            return [names]
        return [names] + [f"{names}.{r}" for r in opdef.results[1:]]

    def _claim(self, name: str) -> None:
        if name in self.values:
            raise VerifyError(f"value '%{name}' is defined twice")

    def _seq_for(self, near: Node | None) -> tuple[int, ...]:
        if near is None:
            self._next_seq += 1
            return (self._next_seq,)
        k = self._children.get(near.seq, 0) + 1
        self._children[near.seq] = k
        return near.seq + (k,)

    def fresh_name(self, base: str) -> str:
        """`base`, or `base.2`, `base.3`, ... : deterministic for a deterministic rewrite sequence."""
        if base not in self.values:
            return base
        i = 2
        while f"{base}.{i}" in self.values:
            i += 1
        return f"{base}.{i}"

    # ---- mutation ---------------------------------------------------------------------------
    def replace_uses(self, old: Value, new: Value, *, skip: Node | None = None) -> int:
        """Point every operand, dep and return that uses `old` at `new`. Returns the count."""
        count = 0
        for node in self.nodes.values():
            if node is skip:
                continue
            for seq in (node.operands, node.deps):
                for i, v in enumerate(seq):
                    if v is old:
                        seq[i] = new
                        count += 1
        for i, v in enumerate(self.returns):
            if v is old:
                self.returns[i] = new
                count += 1
        self._users = None
        return count

    def remove_node(self, node: Node) -> None:
        """Delete a node whose results are unused."""
        for v in node.results:
            users = self.users(v)
            if users or v in self.returns:
                who = users[0].name if users else "the graph's return"
                raise VerifyError(f"cannot remove '{node.name}': result %{v.name} is used by {who}")
        del self.nodes[node.name]
        for v in node.results:
            del self.values[v.name]
        self._users = None

    def rename(self, value: Value, new_name: str) -> None:
        """Rename a value (and its node, if it is the node's first result)."""
        self._claim(new_name)
        del self.values[value.name]
        node = value.producer
        if node is not None and node.results[0] is value:
            del self.nodes[node.name]
            node.name = new_name
            self.nodes = self._reinsert(node)
        value.name = new_name
        self.values[new_name] = value
        self._users = None

    def invalidate(self) -> None:
        """Forget derived indexes; call after editing a node's operands, deps or attrs in place."""
        self._users = None

    def _reinsert(self, node: Node) -> dict[str, Node]:
        nodes = dict(self.nodes)
        nodes[node.name] = node
        return nodes

    # ---- queries ----------------------------------------------------------------------------
    def users(self, value: Value) -> list[Node]:
        if self._users is None:
            index: dict[str, list[Node]] = {}
            for node in self.nodes.values():
                for v in list(node.operands) + list(node.deps):
                    lst = index.setdefault(v.name, [])
                    if not lst or lst[-1] is not node:
                        lst.append(node)
            self._users = index
        return list(self._users.get(value.name, []))

    def ops(self, op: str) -> list[Node]:
        return [n for n in self.topo_order() if n.op == op]

    def to_networkx(self) -> nx.DiGraph:
        """Op nodes as networkx nodes (attribute `node`); edges carry `kind` = data | dep."""
        g = nx.DiGraph()
        for node in self.nodes.values():
            g.add_node(node.name, node=node, seq=node.seq)
        for node in self.nodes.values():
            for kind, seq in (("data", node.operands), ("dep", node.deps)):
                for v in seq:
                    if v.producer is None or v.producer.name not in self.nodes:
                        continue
                    if g.has_edge(v.producer.name, node.name) and kind == "dep":
                        continue
                    g.add_edge(v.producer.name, node.name, kind=kind)
        return g

    def topo_order(self) -> list[Node]:
        """Topological order, ties broken by sequence keys. Raises VerifyError on a cycle."""
        g = self.to_networkx()
        try:
            names = list(nx.lexicographical_topological_sort(g, key=lambda n: self.nodes[n].seq))
        except nx.NetworkXUnfeasible:
            cycle = nx.find_cycle(g)
            path = " -> ".join([e[0] for e in cycle] + [cycle[0][0]])
            first = self.nodes[cycle[0][0]]
            raise VerifyError(f"cycle: {path}", first.where) from None
        return [self.nodes[n] for n in names]

    def __iter__(self) -> Iterator[Node]:
        return iter(self.topo_order())

    def __len__(self) -> int:
        return len(self.nodes)

    # ---- copies and identity ----------------------------------------------------------------
    def clone(self) -> "Graph":
        g = Graph(self.name, self.symbols, self.attributes)
        g.loc = self.loc
        g._next_seq, g._children = self._next_seq, dict(self._children)
        for p in self.params:
            g.add_param(p.name, p.type, p.inout)
        for node in sorted(self.nodes.values(), key=lambda n: n.seq):
            copy = Node(node.name, node.op, [], [], dict(node.attrs), [], node.seq, node.loc)
            copy.results = [Value(v.name, v.type, copy, v.index) for v in node.results]
            g.nodes[copy.name] = copy
            for v in copy.results:
                g.values[v.name] = v
        for node in self.nodes.values():
            copy = g.nodes[node.name]
            copy.operands = [g.values[v.name] for v in node.operands]
            copy.deps = [g.values[v.name] for v in node.deps]
        g.returns = [g.values[v.name] for v in self.returns]
        return g

    def structural_key(self) -> tuple:
        """Everything that defines the graph's meaning and schedule, independent of print order."""
        params = tuple((p.name, str(p.type), p.inout) for p in self.params)
        nodes = tuple(sorted(
            (n.name, n.op, tuple(v.name for v in n.operands), tuple((v.name, str(v.type)) for v in n.results),
             tuple(sorted((k, _attr_key(val)) for k, val in n.attrs.items())), tuple(v.name for v in n.deps))
            for n in self.nodes.values()))
        attributes = tuple(sorted((k, _attr_key(v)) for k, v in self.attributes.items()))
        return (self.name, tuple(self.symbols.items()), attributes, params, nodes,
                tuple(v.name for v in self.returns))

    def structural_hash(self) -> str:
        return hashlib.sha256(repr(self.structural_key()).encode()).hexdigest()[:16]

    def structurally_equal(self, other: "Graph") -> bool:
        return self.structural_key() == other.structural_key()

    def __repr__(self) -> str:
        return f"<Graph @{self.name}: {len(self.params)} params, {len(self.nodes)} nodes>"


def _attr_key(value: Any) -> str:
    from .ops.base import format_attr_value

    return format_attr_value(value)


def infer_types(opdef: type[OpDef], ins: Sequence[TensorType], attrs: Mapping[str, Any],
                where: str) -> list[TensorType]:
    """Run an op's shape rule with arity checking; errors name the node."""
    fixed, variadic = opdef.arity()
    if len(ins) < fixed or (len(ins) > fixed and not variadic):
        expected = f"at least {fixed}" if variadic else str(fixed)
        raise ShapeError(f"op '{opdef.name}' takes {expected} operands, got {len(ins)}", f"node '{where}'")
    try:
        return list(opdef().infer(list(ins), attrs))
    except ShapeError as e:
        raise ShapeError(e.message, e.location or f"node '{where}'") from None


@dataclass
class Module:
    """One .dsir file: one or more graphs (the first is the entry)."""

    graphs: list[Graph]

    @property
    def entry(self) -> Graph:
        return self.graphs[0]

    def graph(self, name: str) -> Graph:
        for g in self.graphs:
            if g.name == name:
                return g
        raise KeyError(name)

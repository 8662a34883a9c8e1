"""The graph: a typed DAG of op nodes over SSA values, with networkx views for analyses.

Nodes keep their operands in order; the networkx DiGraph (`to_networkx`) is derived from them and
carries edge kinds ("data" or "dep"). Node names come from provenance (`block.op[.suffix]`) and are
never derived from ids or traversal order. Every node has a sequence key (`seq`, a tuple of ints)
that breaks ties in the topological print order: appended nodes get `(n,)`, a node placed near an
existing one gets that node's key plus a child index, so rewrites keep the order stable.
"""
from __future__ import annotations

import bisect
import hashlib
import heapq
from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter, is_
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Mapping, Sequence

from .dims import BinOp, Call, Const, Sym
from .errors import ShapeError, VerifyError
from .ops import get_op
from .ops.base import OpDef, format_attr_value
from .types import DType, TensorType

if TYPE_CHECKING:
    import networkx as nx

_NAME, _TYPE = attrgetter("name"), attrgetter("type")
_WALK_LIMIT = 64       # Graph.reaches: nodes walked before it asks Graph.ancestors
_REORDER_LIMIT = 4096  # Graph._lower_ancestors: a larger region is cheaper to renumber from scratch
_IMMUTABLE_TYPES = frozenset({int, float, bool, str, type(None), DType, Const, Sym, BinOp, Call})


@dataclass(eq=False, slots=True)
class Value:
    name: str
    type: TensorType
    producer: "Node | None" = None
    index: int = 0
    inout: bool = False  # graph parameter updated in place

    def __repr__(self) -> str:
        return f"%{self.name}: {self.type}"


@dataclass(eq=False, slots=True)
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
        # Derived indexes (see "Derived indexes" below): kept up to date by add_op, remove_node and
        # replace_uses; dropped by invalidate() and rename(), rebuilt on demand.
        self._pos: dict[str, int] | None = None  # node name → rank in self.nodes order (with _users)
        self._next_pos = 0
        self._num: dict[str, int] | None = None  # a topological numbering (every edge goes up)
        self._next_num = 0
        self._version = 0                       # bumped by every mutation
        self._topo: tuple | None = None          # (version, topological order, name → position)
        self._ancestors: dict[str, frozenset[str]] = {}   # recent ancestors() answers (see there)
        self._by_op: dict[str, set[str]] | None = None     # op → names of its nodes
        self._attr_keys: dict[int, tuple] = {}    # id(attrs) → (attrs, names, values, key): see attr_key
        self._attr_pool: dict[tuple, tuple] = {}  # one shared copy of each remembered key and name tuple
        self._log: EditLog | None = None          # see record_edits

    # ---- construction -----------------------------------------------------------------------
    @property
    def version(self) -> int:
        """Moves on every edit made through the graph's methods (or `touch` / `invalidate`)."""
        return self._version

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
        if self._log is not None:
            self._log.saw_new(node.name)
        self.nodes[node.name] = node
        for v in node.results:
            self.values[v.name] = v
        self._index_added(node)
        return node

    def set_returns(self, values: Iterable[Value]) -> None:
        self.returns = list(values)
        self._moved_on()            # returns are not part of the users index or the topological order

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
        moved = []
        for node in self._referencing(old):      # the nodes whose operands or deps name `old`
            if node is skip:
                continue
            if self._log is not None:
                self._log.saw(node)
            hit = False
            for seq in (node.operands, node.deps):
                for i, v in enumerate(seq):
                    if v is old:
                        seq[i] = new
                        count += 1
                        hit = True
            if hit:
                moved.append(node)
        if old in self.returns:                  # values compare by identity
            for i, v in enumerate(self.returns):
                if v is old:
                    self.returns[i] = new
                    count += 1
        self._index_replaced(old, new, moved)
        return count

    def remove_node(self, node: Node) -> None:
        """Delete a node whose results are unused."""
        for v in node.results:
            users = self.users(v)
            if users or v in self.returns:
                who = users[0].name if users else "the graph's return"
                raise VerifyError(f"cannot remove '{node.name}': result %{v.name} is used by {who}")
        if self._log is not None:
            self._log.saw(node)
        del self.nodes[node.name]
        for v in node.results:
            del self.values[v.name]
        self._index_removed(node)

    def rename(self, value: Value, new_name: str) -> None:
        """Rename a value (and its node, if it is the node's first result)."""
        self._claim(new_name)
        old_name = value.name
        node = value.producer
        if self._log is not None:                # the users' keys name the value; the node's key names its results
            for user in self._referencing(value):
                self._log.saw(user)
            if node is not None:
                self._log.saw(node)
                if node.results[0] is value:
                    self._log.saw_new(new_name)
        del self.values[value.name]
        moved = None
        if node is not None and node.results[0] is value:
            moved = node.name
            del self.nodes[node.name]
            node.name = new_name
            self.nodes[new_name] = node       # a renamed node moves to the end of self.nodes
        value.name = new_name
        self.values[new_name] = value
        self._index_renamed(old_name, new_name, node if moved is not None else None, moved)

    def set_deps(self, node: Node, deps: Sequence[Value]) -> None:
        """Replace `node`'s explicit deps (keeps the derived indexes instead of dropping them)."""
        if self._log is not None:
            self._log.saw(node)
        old = (*node.operands, *node.deps)
        node.deps = list(deps)
        self._index_edited(node, old)

    def set_operands(self, node: Node, operands: Sequence[Value]) -> None:
        """Replace `node`'s operands (keeps the derived indexes)."""
        if self._log is not None:
            self._log.saw(node)
        old = (*node.operands, *node.deps)
        node.operands = list(operands)
        self._index_edited(node, old)

    def insert_dep(self, node: Node, index: int, value: Value) -> None:
        """Make `node` wait for `value` too: `value` goes in at position `index` of its deps. The same as
        `set_deps` with that list, without comparing the old and new lists (a node may have many deps)."""
        if value in node.operands or value in node.deps:     # values compare by identity
            self.set_deps(node, node.deps[:index] + [value] + node.deps[index:])
            return
        if self._log is not None:
            self._log.saw(node)
        node.deps = node.deps[:index] + [value] + node.deps[index:]
        self._index_edited(node, (), [value], [])

    def set_operand(self, node: Node, index: int, value: Value) -> None:
        """Point operand `index` of `node` at `value` (keeps the derived indexes)."""
        if self._log is not None:
            self._log.saw(node)
        old = (*node.operands, *node.deps)
        node.operands[index] = value
        self._index_edited(node, old)

    def set_attrs(self, node: Node, attrs: dict[str, Any]) -> None:
        """Give `node` the attribute dict `attrs` (normalized by the caller): edges and names stay."""
        if self._log is not None:
            self._log.saw(node)
        node.attrs = attrs
        self._moved_on()

    def touch(self) -> None:
        """Record a change that affects neither edges nor names (attributes edited in place): only the version
        moves. It cannot say which node changed: while edits are recorded, use `set_attrs`."""
        if self._log is not None:
            self._log.blind = True
        self._moved_on()

    def _moved_on(self) -> None:
        """A new version with the same nodes and edges: the topological order stays."""
        current = self._topo is not None and self._topo[0] == self._version
        self._version += 1
        if current:
            self._topo = (self._version, *self._topo[1:])

    def invalidate(self) -> None:
        """Forget derived indexes; call after editing a node's operands, deps or attrs in place (while edits are
        recorded, edit through set_operands / set_deps / set_attrs instead: this cannot say which node changed)."""
        if self._log is not None:
            self._log.blind = True
        self._changed()

    def _changed(self) -> None:
        self._users = None
        self._pos = None
        self._num = None
        self._topo = None
        self._ancestors.clear()
        self._by_op = None
        self._version += 1

    # ---- derived indexes ----------------------------------------------------------------------
    # users (value name → the nodes naming it in operands or deps, in self.nodes order, each once),
    # a topological numbering (_num: only its order matters, every edge goes from a lower to a higher
    # number) and the cached lexicographic topological order. The three mutations passes use in loops
    # keep the first two up to date instead of dropping them (a rebuild is O(graph) and a rewrite loop
    # would make it O(graph²)); anything else goes through _changed().
    def _index_added(self, node: Node) -> None:
        """add_op: the new node is the last of self.nodes and depends only on existing nodes."""
        if self._users is not None:
            for v in (*node.operands, *node.deps):
                lst = self._users.setdefault(v.name, [])
                if not lst or lst[-1] is not node:
                    lst.append(node)
            self._pos[node.name] = self._next_pos
            self._next_pos += 1
        if self._num is not None:
            self._num[node.name] = self._next_num
            self._next_num += 1
        if self._by_op is not None:
            self._by_op.setdefault(node.op, set()).add(node.name)
        current = self._topo is not None and self._topo[0] == self._version
        self._version += 1
        self._topo = (self._version, _insert_sink(self._topo[1], node), None) if current else None

    def _index_removed(self, node: Node) -> None:
        """remove_node of a node nobody uses: drop it from its operands' user lists. Removing such a
        sink leaves the lexicographic topological order of the other nodes unchanged."""
        if self._users is not None:
            for name in set(map(_NAME, (*node.operands, *node.deps))):
                self._drop_user(name, node)
            for v in node.results:
                self._users.pop(v.name, None)
            self._pos.pop(node.name, None)
        if self._num is not None:
            self._num.pop(node.name, None)
        self._forget_ancestors((node.name,))
        if self._by_op is not None:
            self._by_op[node.op].discard(node.name)
        current = self._topo is not None and self._topo[0] == self._version
        self._version += 1
        self._topo = (self._version, [n for n in self._topo[1] if n is not node], None) if current else None

    def _referencing(self, value: Value) -> list[Node]:
        if self._users is None:
            self._build_users()
        return list(self._users.get(value.name, []))

    def _index_replaced(self, old: Value, new: Value, moved: list[Node]) -> None:
        """replace_uses: `moved` no longer name `old` and now name `new`."""
        if self._users is not None and moved:
            for n in moved:
                self._drop_user(old.name, n)
                self._add_user(new.name, n)
        if self._num is not None and new.producer is not None and new.producer.name in self.nodes:
            for n in moved:
                if not self._ordered(new.producer, n):
                    self._num = None
                    break
        self._forget_ancestors(n.name for n in moved)
        self._topo = None
        self._version += 1

    def _index_renamed(self, old: str, new: str, node: Node | None, old_node_name: str | None) -> None:
        """rename: the value's user list moves to its new name; a renamed node moves to the end of
        self.nodes (so to the end of every user list it is in) and keeps its topological number."""
        if self._users is not None:
            if old in self._users:
                self._users[new] = self._users.pop(old)
            if node is not None:
                self._pos.pop(old_node_name, None)
                self._pos[node.name] = self._next_pos
                self._next_pos += 1
                for name in {v.name for v in (*node.operands, *node.deps)}:
                    lst = self._users.get(name)
                    if lst is not None and node in lst:
                        self._users[name] = [n for n in lst if n is not node] + [node]
        if self._num is not None and node is not None:
            at = self._num.pop(old_node_name, None)
            if at is None:
                self._num = None
            else:
                self._num[node.name] = at
        if old_node_name is not None:
            self._forget_ancestors((old_node_name,))
            if self._by_op is not None:
                names = self._by_op[node.op]
                names.discard(old_node_name)
                names.add(node.name)
        self._topo = None
        self._version += 1

    def _index_edited(self, node: Node, before: Sequence[Value], added: list[Value] | None = None,
                      removed: list[Value] | None = None) -> None:
        """`node`'s operands/deps changed from `before`: fix its entries in the user lists. The work is in the
        values that came or went (a node with many deps often gets one more); a caller may name them."""
        if added is None:
            after = (*node.operands, *node.deps)
            before_set, after_set = set(before), set(after)      # values hash by identity
            added = list(compress(after, map((after_set - before_set).__contains__, after)))
            gone = before_set - after_set
            removed = list(compress(before, map(gone.__contains__, before))) if gone else []
        if self._users is not None:
            if removed:
                for name in set(map(_NAME, removed)) - set(map(_NAME, (*node.operands, *node.deps))):
                    self._drop_user(name, node)
            for v in added:
                self._add_user(v.name, node)
        if self._num is not None:
            for v in added:                                  # the edges that were there are still ordered
                p = v.producer
                if p is not None and p.name in self.nodes and not self._ordered(p, node):
                    self._num = None
                    break
        self._forget_ancestors((node.name,))
        self._topo = None
        self._version += 1

    # A user list is in self.nodes order, so in position order: a node is found (or placed) by bisection.
    def _add_user(self, name: str, node: Node) -> None:
        pos = self._pos
        lst = self._users.setdefault(name, [])
        at = pos[node.name]
        if not lst or pos[lst[-1].name] < at:       # the common case: a later node than all the others
            lst.append(node)
            return
        i = bisect.bisect_left(lst, at, key=lambda n: pos[n.name])
        if i == len(lst) or lst[i] is not node:
            lst.insert(i, node)

    def _drop_user(self, name: str, node: Node) -> None:
        pos = self._pos
        lst = self._users.get(name)
        if lst is None:
            return
        i = bisect.bisect_left(lst, pos[node.name], key=lambda n: pos[n.name])
        if i < len(lst) and lst[i] is node:
            del lst[i]

    def _forget_ancestors(self, names: Iterable[str]) -> None:
        """The edges into these nodes changed (or the nodes went): drop the remembered ancestor sets that
        they are in or that are theirs. Every other remembered set is still exact."""
        memo = self._ancestors
        if not memo:
            return
        for name in names:
            for key in [k for k, found in memo.items() if k == name or name in found]:
                del memo[key]

    def _ordered(self, p: Node, node: Node) -> bool:
        """Keep the numbering topological for a new edge p → node: fine if p is already below node; else
        move node up (or p down) into the gap between its predecessors and its users when there is one.
        False: no such gap, the numbering must be rebuilt."""
        num = self._num
        if p.name not in num or node.name not in num:
            return False
        if num[p.name] < num[node.name]:
            return True
        for n in (node, p):
            lo = max((num.get(x.producer.name, float("inf")) for x in (*n.operands, *n.deps)
                      if x.producer is not None and x.producer.name in self.nodes), default=-1.0)
            hi = min((num.get(u.name, float("-inf")) for r in n.results for u in self.users(r)), default=lo + 2.0)
            mid = (lo + hi) / 2
            if lo < mid < hi:        # not when float precision has run out between them
                num[n.name] = mid
                self._next_num = max(self._next_num, int(mid) + 1)   # added nodes go above every number
                return num[p.name] < num[node.name]
        return self._lower_ancestors(p, node)

    def _lower_ancestors(self, p: Node, node: Node) -> bool:
        """The new edge p → node with p numbered above node and no gap for either alone: move p and its
        ancestors numbered above node (the region the edge puts before node) just below node, in their order.
        Their other predecessors are numbered below node (else they would be in the region) and their users
        above it (they were above a region node, which was above node), so every edge still goes up. A region
        past _REORDER_LIMIT nodes, one that contains node (a cycle) or a gap float precision cannot split
        again: False, the numbering must be rebuilt."""
        num, nodes = self._num, self.nodes
        ceiling = num[node.name]
        region, stack = {p.name: p}, [p]
        lo = float("-inf")                          # the highest number of a predecessor outside the region
        while stack:
            cur = stack.pop()
            for v in (*cur.operands, *cur.deps):
                q = v.producer
                if q is None or q.name in region or q.name not in nodes:
                    continue
                at = num.get(q.name)
                if at is None or q is node:
                    return False
                if at < ceiling:
                    lo = max(lo, at)
                    continue
                if len(region) >= _REORDER_LIMIT:
                    return False
                region[q.name] = q
                stack.append(q)
        moved = sorted(region, key=num.__getitem__)
        if lo == float("-inf"):
            lo = ceiling - 1.0
        step = (ceiling - lo) / (len(moved) + 1)
        numbers = [lo + step * (i + 1) for i in range(len(moved))]
        if not all(a < b for a, b in zip([lo, *numbers], [*numbers, ceiling])):
            return False                             # float precision has run out in the gap
        num.update(zip(moved, numbers))
        return True

    def _build_users(self) -> None:
        index: dict[str, list[Node]] = {}
        for node in self.nodes.values():
            for v in list(node.operands) + list(node.deps):
                lst = index.setdefault(v.name, [])
                if not lst or lst[-1] is not node:
                    lst.append(node)
        self._users = index
        self._pos = {name: i for i, name in enumerate(self.nodes)}
        self._next_pos = len(self._pos)

    # ---- queries ----------------------------------------------------------------------------
    def users(self, value: Value) -> list[Node]:
        if self._users is None:
            self._build_users()
        return list(self._users.get(value.name, []))

    def ops(self, op: str) -> list[Node]:
        return [n for n in self.topo_order() if n.op == op]

    def names_of_op(self, op: str) -> set[str]:
        """The names of the nodes of kind `op` (from an index kept across edits)."""
        if self._by_op is None:
            self._by_op = {}
            for node in self.nodes.values():
                self._by_op.setdefault(node.op, set()).add(node.name)
        return set(self._by_op.get(op, ()))

    def attr_key(self, attrs: Mapping[str, Any]) -> tuple:
        """(name, formatted value) pairs of a node's attributes, sorted by name: the attribute part of the keys
        that compare nodes. Remembered per dict while it holds the same value objects, when those are immutable
        (then they format the same): most nodes keep theirs from one pass to the next."""
        known = self._attr_keys.get(id(attrs))
        if known is not None and known[0] is attrs and tuple(attrs) == known[1] \
                and all(map(is_, known[2], attrs.values())):
            return known[3]
        names, values = tuple(attrs), tuple(attrs.values())
        key = tuple(sorted(zip(names, map(format_attr_value, values))))
        if all(map(_immutable, values)):
            # The layers repeat: the model's ~8000 nodes have ~600 distinct keys and ~60 distinct name tuples.
            # Remembering one copy of each keeps ~45 000 small tuples out of memory (and out of every gc pass
            # over the graph); the keys compare by value, so which copy is returned makes no difference.
            key = self._attr_pool.setdefault(key, key)
            names = self._attr_pool.setdefault(names, names)
            self._attr_keys[id(attrs)] = (attrs, names, values, key)   # holds attrs: its id stays its own
        return key

    def to_networkx(self) -> "nx.DiGraph":
        """Op nodes as networkx nodes (attribute `node`); edges carry `kind` = data | dep."""
        import networkx as nx

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
        """Topological order, ties broken by sequence keys. Raises VerifyError on a cycle.

        The order is exactly networkx's lexicographical_topological_sort of `to_networkx()` with key `seq`
        (ties between equal keys by insertion order), computed without building the networkx graph and
        cached until the next mutation (`invalidate()` after editing operands or deps in place)."""
        if self._topo is not None and self._topo[0] == self._version:
            return list(self._topo[1])
        order = self._kahn()
        if len(order) != len(self.nodes):
            self._raise_cycle()
        self._topo = (self._version, order, None)
        return list(order)

    def order_with(self, extra: Iterable[tuple[Node, Node]]) -> list[Node] | None:
        """`topo_order()` of the graph with the edges `extra` (a, b: a before b) added; None on a cycle."""
        order = self._kahn(extra)
        return order if len(order) == len(self.nodes) else None

    def _kahn(self, extra: Iterable[tuple[Node, Node]] = ()) -> list[Node]:
        """The lexicographic topological order; shorter than the graph when there is a cycle."""
        nodes = self.nodes
        listed = list(nodes.values())
        # rank = position in (seq, insertion index) order: the heap compares ints, not tuples
        seqs = [n.seq for n in listed]
        rank_of = sorted(range(len(listed)), key=seqs.__getitem__)   # stable: ties by insertion
        rank = [0] * len(listed)
        for r, i in enumerate(rank_of):
            rank[i] = r
        slot = {name: i for i, name in enumerate(nodes)}.get
        preds: list[set[int]] = [set() for _ in listed]
        for i, node in enumerate(listed):
            found = preds[i]
            for v in (*node.operands, *node.deps):
                p = v.producer
                if p is not None:
                    j = slot(p.name)
                    if j is not None:
                        found.add(j)
        for a, b in extra:
            preds[slot(b.name)].add(slot(a.name))
        succ: list[list[int]] = [[] for _ in listed]
        indeg = [0] * len(listed)
        for i, found in enumerate(preds):
            for p in found:
                succ[p].append(i)
            indeg[i] = len(found)
        heap = [rank[i] for i in range(len(listed)) if indeg[i] == 0]
        heapq.heapify(heap)
        out: list[Node] = []
        while heap:
            i = rank_of[heapq.heappop(heap)]
            out.append(listed[i])
            for child in succ[i]:
                indeg[child] -= 1
                if indeg[child] == 0:
                    heapq.heappush(heap, rank[child])
        return out

    def _raise_cycle(self) -> None:
        import networkx as nx

        cycle = nx.find_cycle(self.to_networkx())
        path = " -> ".join([e[0] for e in cycle] + [cycle[0][0]])
        raise VerifyError(f"cycle: {path}", self.nodes[cycle[0][0]].where)

    def reaches(self, a: Node, b: Node) -> bool:
        """Is there a path a → … → b over operand and deps edges (a ≠ b)? The same answer as
        `a.name in nx.ancestors(self.to_networkx(), b.name)`, without networkx: a walk back from b and a walk
        on from a, each kept between a's and b's topological positions (a path a → b stays there), depth
        first, in turn, until they meet or one runs dry; past a few dozen nodes, `a.name in ancestors(b)`.
        Needs an acyclic graph."""
        pos = self._numbering()
        floor = pos.get(a.name)
        if floor is None or b.name not in self.nodes:
            return False
        ceiling = pos.get(b.name, float("inf"))
        if ceiling <= floor:
            return False
        if self._users is None:
            self._build_users()
        nodes, users = self.nodes, self._users
        back, back_seen = [nodes[b.name]], {b.name}
        ahead, ahead_seen = [nodes[a.name]] if a.name in nodes else [], {a.name}
        back_turn, steps = False, 0
        while back and ahead:
            steps += 1
            if steps > _WALK_LIMIT:          # far apart: the remembered ancestor sets answer that faster
                return a.name in self.ancestors(b)
            back_turn = not back_turn        # one node each in turn (a node with many users does not flood it)
            if back_turn:
                cur = back.pop()
                for v in (*cur.operands, *cur.deps):
                    p = v.producer
                    if p is None or p.name in back_seen:
                        continue
                    if p.name in ahead_seen:
                        return True
                    at = pos.get(p.name)
                    if at is None or at < floor:
                        continue
                    back_seen.add(p.name)
                    back.append(nodes[p.name])
            else:
                cur = ahead.pop()
                for r in cur.results:
                    for u in users.get(r.name, ()):
                        if u.name in ahead_seen:
                            continue
                        if u.name in back_seen:
                            return True
                        if pos.get(u.name, ceiling) > ceiling:
                            continue
                        ahead_seen.add(u.name)
                        ahead.append(u)
        return False

    def ancestors(self, node: Node) -> frozenset[str]:
        """Names of the nodes with a path to `node` over operand and deps edges: nx.ancestors on
        `to_networkx()`, without networkx. Recent answers are remembered until an edit reaches them (see
        `_forget_ancestors`); a walk that meets a remembered node takes its set instead of walking on, so
        asking for the nodes of a long chain one after the other costs about the new part each time."""
        memo = self._ancestors
        if node.name in memo:
            return memo[node.name]
        nodes, seen = self.nodes, set()
        reached: dict[str, frozenset[str]] = {}  # remembered nodes found on the walk → their sets
        deferred: list[Node] = []               # nodes inside a remembered set: walked only if no set covers them
        stack = [node]
        while stack:
            cur = stack.pop()
            for v in (*cur.operands, *cur.deps):
                p = v.producer
                if p is None or p.name in seen or p.name not in nodes:
                    continue
                seen.add(p.name)
                if p.name in memo:
                    reached[p.name] = memo[p.name]
                elif any(p.name in found for found in memo.values()):
                    deferred.append(nodes[p.name])
                else:
                    stack.append(nodes[p.name])
            if not stack and deferred:
                stack = [d for d in deferred if not any(d.name in found for found in reached.values())]
                deferred = []
        taken: list[frozenset[str]] = []
        for name, found in sorted(reached.items(), key=lambda item: -len(item[1])):
            if not any(name in bigger for bigger in taken):    # else its set is inside a bigger one
                seen |= found
                taken.append(found)
        seen.discard(node.name)
        found = memo[node.name] = frozenset(seen)
        if len(memo) > 8:
            del memo[next(iter(memo))]
        return found

    def _numbering(self) -> dict[str, int]:
        """A topological numbering (kept across add_op / remove_node / replace_uses when still valid).
        Rebuilt from the lexicographic order: any topological order would do, but that one keeps the
        nodes of one layer close together, which keeps the pruned walks of `reaches` short."""
        if self._num is None:
            self._num = {n.name: i for i, n in enumerate(self.topo_order())}
            self._next_num = len(self._num)
        return self._num

    def in_topo_order(self, nodes: Sequence[Node], known: dict | None = None) -> list[Node]:
        """`nodes` in `topo_order()` order. When they form a chain (each reaches the next) every topological
        order lists them alike, so the kept numbering decides without recomputing the lexicographic order.
        `known`: pairs the caller already found chained, {(id(a), id(b)): (a, b)}, still true in this graph
        (the caller drops the ones an edit may break); the pairs found here are added to it."""
        if self._topo is None or self._topo[0] != self._version:
            num = self._numbering()
            ranked = sorted(nodes, key=lambda n: num[n.name])
            if all(self._chained(a, b, known) for a, b in zip(ranked, ranked[1:])):
                return ranked
        pos = self.topo_index()
        return sorted(nodes, key=lambda n: pos[n.name])

    def _chained(self, a: Node, b: Node, known: dict | None) -> bool:
        if known is not None and (id(a), id(b)) in known:
            return True
        if not self.reaches(a, b):
            return False
        if known is not None:
            known[(id(a), id(b))] = (a, b)     # the nodes stay referenced, so their ids stay theirs
        return True

    def topo_index(self) -> dict[str, int]:
        """Node name → position in `topo_order()` (cached with it; do not modify the returned dict)."""
        self.topo_order()
        version, order, index = self._topo
        if index is None:
            index = {n.name: i for i, n in enumerate(order)}
            self._topo = (version, order, index)
        return index

    def __iter__(self) -> Iterator[Node]:
        return iter(self.topo_order())

    def __len__(self) -> int:
        return len(self.nodes)

    # ---- edit records -----------------------------------------------------------------------
    def record_edits(self) -> "EditLog":
        """Start recording what the edits made through the graph's methods touch (a new log replaces the last)."""
        self._log = EditLog(self)
        return self._log

    def stop_recording(self) -> None:
        self._log = None

    def node_key(self, node: Node) -> tuple:
        """Everything that defines a node but its name: (op, operand names, (result name, type text) pairs,
        attr_key of the attributes, dep names)."""
        results = node.results
        named = tuple(zip(map(_NAME, results), map(str, map(_TYPE, results))))
        return (node.op, tuple(map(_NAME, node.operands)), named, self.attr_key(node.attrs),
                tuple(map(_NAME, node.deps)))

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
        nodes = tuple(sorted((n.name, *self.node_key(n)) for n in self.nodes.values()))
        name, symbols, attributes, params, returns = self.graph_key()
        return (name, symbols, attributes, params, nodes, returns)

    def graph_key(self) -> tuple:
        """The graph-level part of the structural key: name, symbols, attributes, parameters, return names."""
        params = self.params
        params = tuple(zip(map(_NAME, params), map(str, map(_TYPE, params)), map(attrgetter("inout"), params)))
        attributes = tuple(sorted((k, format_attr_value(v)) for k, v in self.attributes.items()))
        return (self.name, tuple(self.symbols.items()), attributes, params, tuple(map(_NAME, self.returns)))

    def structural_hash(self) -> str:
        return hashlib.sha256(repr(self.structural_key()).encode()).hexdigest()[:16]

    def structurally_equal(self, other: "Graph") -> bool:
        return self.structural_key() == other.structural_key()

    def __repr__(self) -> str:
        return f"<Graph @{self.name}: {len(self.params)} params, {len(self.nodes)} nodes>"


@dataclass(eq=False)
class NodeState:
    """A node as it was: what `Graph.clone()` copies of it, and its `Graph.node_key`."""
    name: str
    op: str
    operands: tuple[str, ...]
    results: tuple[tuple[str, TensorType, int], ...]     # (name, type, index)
    attrs: dict[str, Any]
    deps: tuple[str, ...]
    seq: tuple[int, ...]
    loc: str
    key: tuple | None = None

    @staticmethod
    def of(node: Node, key: tuple | None = None) -> "NodeState":
        return NodeState(node.name, node.op, tuple(map(_NAME, node.operands)),
                         tuple((v.name, v.type, v.index) for v in node.results), dict(node.attrs),
                         tuple(map(_NAME, node.deps)), node.seq, node.loc, key)


class EditLog:
    """What the edits made through a graph's methods touched since `Graph.record_edits()`: for every node name
    they touched, the node as it was before the first of them (None: no node had that name). A name no edit
    touched names the same node, unchanged. With the graph-level state taken at the start, that is the graph as
    it was (`graph_before`) and what changed (`changes`), without walking the untouched nodes.

    `Graph.touch()` and `Graph.invalidate()` (edits made in place) cannot say what they changed: they mark the
    log `blind`, and then it knows nothing."""

    def __init__(self, g: Graph):
        self.g = g
        self.version = g.version
        self.blind = False
        self.before: dict[str, NodeState | None] = {}
        self._order = list(g.nodes)          # names in g.nodes order (clone sorts by seq, ties in this order)
        params = g.params
        self._header = (g.name, dict(g.symbols), dict(g.attributes), g.loc, g._next_seq, dict(g._children),
                        tuple(zip(map(_NAME, params), map(_TYPE, params), map(attrgetter("inout"), params))),
                        tuple(map(_NAME, g.returns)))
        self._graph: Graph | None = None

    def saw(self, node: Node) -> None:
        """`node` is about to change (or go): keep it as it is, if it is the first time."""
        if node.name not in self.before:
            self.before[node.name] = NodeState.of(node, self.g.node_key(node))

    def saw_new(self, name: str) -> None:
        """A node takes the name `name`, which no node has now."""
        self.before.setdefault(name, None)

    def changes(self) -> tuple[list[str], list[str], list[str]]:
        """(added, removed, modified) node names, by comparing each touched name's node key before and now;
        in no particular order."""
        g = self.g
        added, removed, modified = [], [], []
        for name, was in self.before.items():
            now = g.nodes.get(name)
            if was is None:
                if now is not None:
                    added.append(name)
            elif now is None:
                removed.append(name)
            elif g.node_key(now) != was.key:
                modified.append(name)
        return added, removed, modified

    def undefined(self) -> str | None:
        """A value the touched nodes or the returns use that the graph does not define (what `Graph.clone()`
        would fail on), or None."""
        g = self.g
        for name in self.before:
            node = g.nodes.get(name)
            if node is not None:
                for v in (*node.operands, *node.deps):
                    if v.name not in g.values:
                        return f"%{v.name} (used by '{node.name}')"
        for v in g.returns:
            if v.name not in g.values:
                return f"%{v.name} (returned)"
        return None

    def graph_before(self) -> Graph:
        """The graph as `g.clone()` would have copied it when the log started (made once)."""
        if self._graph is None:
            self._graph = self._rebuild()
        return self._graph

    def _rebuild(self) -> Graph:
        assert not self.blind, "an edit in place (touch / invalidate) was not recorded"
        name, symbols, attributes, loc, next_seq, children, params, returns = self._header
        g = Graph(name, symbols, attributes)
        g.loc = loc
        g._next_seq, g._children = next_seq, dict(children)
        for p_name, p_type, inout in params:
            g.add_param(p_name, p_type, inout)
        before, now = self.before, self.g.nodes
        states = [before[n] if n in before else NodeState.of(now[n]) for n in self._order]
        for st in sorted(states, key=attrgetter("seq")):
            copy = Node(st.name, st.op, [], [], dict(st.attrs), [], st.seq, st.loc)
            copy.results = [Value(r_name, t, copy, i) for r_name, t, i in st.results]
            g.nodes[copy.name] = copy
            for v in copy.results:
                g.values[v.name] = v
        for st in states:
            copy = g.nodes[st.name]
            copy.operands = [g.values[v] for v in st.operands]
            copy.deps = [g.values[v] for v in st.deps]
        g.returns = [g.values[v] for v in returns]
        return g


def _insert_sink(order: list[Node], node: Node) -> list[Node]:
    """The lexicographic topological order after adding `node`, which nothing uses yet (a sink) and which
    is last in insertion order: the other nodes keep their order, and `node` goes at the first position,
    after all its predecessors, whose node has a larger seq key (there the heap would pop `node` first)."""
    preds = {v.producer.name for v in (*node.operands, *node.deps) if v.producer is not None}
    start = 0
    for i in range(len(order) - 1, -1, -1):     # the last predecessor, looked for from the end: the
        if order[i].name in preds:              # predecessors of a new node are usually recent nodes
            start = i + 1
            break
    for i in range(start, len(order)):
        if node.seq < order[i].seq:
            return order[:i] + [node] + order[i:]
    return order + [node]


def _immutable(value: Any) -> bool:
    if type(value) is tuple:
        return all(map(_immutable, value))
    return type(value) in _IMMUTABLE_TYPES


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

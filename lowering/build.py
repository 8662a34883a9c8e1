"""Graph → task graph: partition into kernels, place values in buffers, derive and reduce dependencies.

* What a node becomes is its op's own fact, `OpDef.lowers_to` (dspark_ir/ops/base.py `LOWERS_TO`): every
  compute node is one kernel task (one pypto kernel); `dummy` nodes (join, and other zero-work nodes whose
  results are all tokens) are dummy tasks. `view` ops (reshape, slice) become views of their operand's
  buffer through the view rule registered for their op class (`VIEW_RULES`); a reshape that no strided view
  expresses falls back to a copy task (`MAY_COPY`). A `placement` op (concat) whose operands are all fresh
  kernel results is a view too: each producer writes straight into its slot of the result buffer;
  otherwise it is a copy task.
  Why two forms: that reshape is a view is the op's own fact, which passes read too (they cannot import the
  lowering), so it is a class attribute; how to express it as a strided view is lowering's (it computes on
  `regions.View`), so that rule is registered here against the op class. A `view` op without a rule fails
  the build with its name (and tests/lowering/test_op_keyed.py checks them all).
* In-place updates (the op's `aliases`) write into their operand's buffer; `inout` graph parameters
  are external buffers, other parameters read-only inputs; every other value gets a local buffer.
* Submission order is a topological order of the data and `deps(...)` edges plus one edge from every
  reader of a buffer version to the op that overwrites that version in place (SSA: the reader sees the
  old contents), ties broken by the graph's sequence keys.
* Dependencies: the RAW/WAR/WAW hazards of the tasks' regions, plus the declared edges (`deps(...)`,
  token operands, join inputs), transitively reduced.
"""
from __future__ import annotations

import re
from typing import Any, Callable, Mapping

import networkx as nx

from dspark_ir.dims import Dim
from dspark_ir.graph import Graph, Node, Value
from dspark_ir.ops import OpDef
from dspark_ir.ops.core import Reshape, Slice
from dspark_ir.types import TensorType

from .errors import LoweringError
from .hazards import find_hazards, transitive_reduction
from .regions import View
from .taskgraph import Arg, Buffer, Task, TaskGraph

ViewRule = Callable[[View, Mapping[str, Any]], "View | None"]

# The view of a `view` op's result, per op class. None: no strided view expresses it (a copy task instead).
VIEW_RULES: dict[type[OpDef], ViewRule] = {
    Reshape: lambda v, a: v.reshape(a["shape"]),
    Slice: lambda v, a: v.slice(a["axis"], a["start"], a["size"]),
}
MAY_COPY: set[type[OpDef]] = {Reshape}   # view ops whose rule can return None: their nodes may be copy tasks


def register_view_rule(op: type[OpDef], rule: ViewRule, *, may_copy: bool = True) -> None:
    """The view rule of a `view` op (`lowers_to = "view"`): `rule(operand_view, concrete_attrs)` returns its
    result's view, or None when no strided view expresses it (`may_copy`: the node is then a copy task)."""
    if op.lowers_to != "view":
        raise ValueError(f"op '{op.name}' is not a view op (lowers_to = '{op.lowers_to}')")
    VIEW_RULES[op] = rule
    if may_copy:
        MAY_COPY.add(op)
    else:
        MAY_COPY.discard(op)


def lowers_to_kernel(op: type[OpDef]) -> bool:
    """Whether a node of `op` can become a kernel task (what templates and roofline rules must cover): not a
    dummy, and not a view op whose every node is a view."""
    return op.lowers_to != "dummy" and (op.lowers_to != "view" or op in MAY_COPY)


def view_rule(node: Node) -> ViewRule:
    """The registered view rule of a `view` node's op; a view op without one is an error naming it."""
    rule = VIEW_RULES.get(node.opdef)
    if rule is None:
        raise LoweringError(f"op '{node.op}' lowers to a view but has no view rule (lowering/build.py "
                            "VIEW_RULES, register_view_rule)", node.where)
    return rule


def build_task_graph(g: Graph) -> TaskGraph:
    """Lower a verified graph with bound symbols to a task graph (see the module docstring)."""
    from dspark_ir.gctools import paused_gc

    with paused_gc():                     # no result depends on it: see dspark_ir/gctools.py
        return _Builder(g).build()


class _Builder:
    def __init__(self, g: Graph):
        self.g = g
        self.env = g.env
        self.views: dict[str, View] = {}
        self.buffers: dict[str, Buffer] = {}
        self.kind: dict[str, str] = {}        # node name → kernel | dummy | view
        self.placed: dict[str, tuple[Node, int]] = {}  # value → (concat node, offset along its axis)
        self.task_of: dict[str, int] = {}
        self._writers_memo: dict[str, Node] | None = None
        self._types: dict[int, tuple] = {}     # id(type) → (type, concrete shape, dim texts); types are shared
        self._alias_memo: dict[tuple, dict[int, int]] = {}
        self._dim_values: dict[int, tuple] = {}   # id(dim) → (dim, its value)

    # ---- driver ---------------------------------------------------------------------------------
    def build(self) -> TaskGraph:
        self._check_concrete()
        for p in self.g.params:
            if not p.type.is_token:
                self._new_buffer(p, "inout" if p.inout else "input")
        self._plan_placements()
        for node in self.g.topo_order():
            self._classify(node)
        nodes = [n for n in self._program_order() if self.kind[n.name] != "view"]
        tasks = [self._make_task(i, node) for i, node in enumerate(nodes)]
        stems: set[str] = set()
        for t in tasks:
            self.task_of[t.name] = t.id
            if not t.is_dummy:
                t.kernel = kernel_stem(t.name, stems)
        declared = {t.id: self._declared(self.g.nodes[t.name]) for t in tasks}
        for t in tasks:
            t.declared = sorted(declared[t.id])
        _derive_deps(tasks, declared)
        outputs = {}
        for v in self.g.returns:
            if not v.type.is_token:
                self._check_not_stale(v)
                outputs[v.name] = self._view(v)
        ranks = int(self.g.attributes.get("ranks", self.g.attributes.get("tp", 1)) or 1)
        return TaskGraph(self.g.name, dict(self.buffers), tasks,
                         {p.name: p.name for p in self.g.params if not p.type.is_token}, outputs,
                         dict(self.env), dict(self.g.attributes), ranks, self.g.structural_hash())

    def _check_concrete(self) -> None:
        for v in self.g.values.values():
            if v.type.is_token or self._shape(v.type) is not None:
                continue
            unbound = sorted(set().union(*(d.symbols() for d in v.type.shape)) - set(self.env))
            where = v.producer.where if v.producer else f"graph '@{self.g.name}'"
            raise LoweringError(f"%{v.name}: {v.type} has unbound symbol '{unbound[0]}'; lowering needs "
                                "concrete shapes (bind it in the graph header)", where)

    # ---- in-place aliases -----------------------------------------------------------------------
    def _aliases(self, node: Node) -> dict[int, int]:
        """_aliases(node), which depends on the op and the operand and result counts only (do not modify)."""
        key = (node.op, len(node.operands), len(node.results))
        found = self._alias_memo.get(key)
        if found is None:
            found = self._alias_memo[key] = _aliases(node)
        return found

    def _alias_of(self, v: Value) -> int | None:
        return None if v.producer is None else self._aliases(v.producer).get(v.index)

    # ---- types --------------------------------------------------------------------------------------
    def _type_info(self, t: TensorType) -> tuple:
        info = self._types.get(id(t))
        if info is None or info[0] is not t:
            info = (t, t.concrete_shape(self.env), tuple(str(d) for d in t.shape), t.dtype.value)
            self._types[id(t)] = info
        return info

    def _shape(self, t: TensorType) -> tuple[int, ...] | None:
        """t.concrete_shape(env)."""
        return self._type_info(t)[1]

    def _dims(self, t: TensorType) -> tuple[str, ...]:
        """The IR text of each dim."""
        return self._type_info(t)[2]

    def _dtype(self, t: TensorType) -> str:
        return self._type_info(t)[3]

    # ---- buffers and views ----------------------------------------------------------------------
    def _new_buffer(self, v: Value, kind: str) -> View:
        shape = self._shape(v.type)
        self.buffers[v.name] = Buffer(v.name, self._dtype(v.type), tuple(shape), kind)
        view = View.whole(v.name, shape)
        self.views[v.name] = view
        return view

    def _view(self, v: Value) -> View:
        """Where value `v` lives. Kernel results get their buffer lazily, so placements resolve first."""
        if v.name in self.views:
            return self.views[v.name]
        if v.name in self.placed:
            concat, offset = self.placed[v.name]
            axis = int(concat.attrs["axis"])
            size = self._shape(v.type)[axis]
            view = self._view(concat.result).slice(axis, offset, size)
            self.views[v.name] = view
            return view
        alias = self._alias_of(v)
        if alias is not None:
            node = v.producer
            view = self._view(node.operands[alias])
            self.views[v.name] = view
            return view
        return self._new_buffer(v, "local")

    def _plan_placements(self) -> None:
        updated = {n.operands[o].name for n in self.g.nodes.values() for o in self._aliases(n).values()}
        for node in self.g.topo_order():
            if node.opdef.lowers_to != "placement":
                continue
            names = [x.name for x in node.operands]
            ok = all(self._placeable(x, updated) for x in node.operands) and len(set(names)) == len(names)
            if not ok:
                continue
            axis, offset = int(node.attrs["axis"]), 0
            for x in node.operands:
                self.placed[x.name] = (node, offset)
                offset += self._shape(x.type)[axis]

    def _placeable(self, x: Value, updated: set[str]) -> bool:
        node = x.producer
        if node is None or x.type.is_token or x.name in self.placed or x.name in updated:
            return False
        if node.opdef.lowers_to in ("view", "placement") or _is_dummy(node):
            return False
        return self._alias_of(x) is None

    def _classify(self, node: Node) -> None:
        if _is_dummy(node):
            self.kind[node.name] = "dummy"
            return
        lowers_to = node.opdef.lowers_to
        if lowers_to == "placement" and node.operands and all(x.name in self.placed for x in node.operands):
            self.kind[node.name] = "view"
            return
        if lowers_to == "view" and len(node.operands) == 1 and len(node.results) == 1:
            view = view_rule(node)(self._view(node.operands[0]), self._attrs(node))
            if view is not None:
                if view.shape != tuple(self._shape(node.result.type)):
                    raise LoweringError(f"view rule for '{node.op}' gives shape {view.shape}, declared "
                                        f"{node.result.type}", node.where)
                self.views[node.result.name] = view
                self.kind[node.name] = "view"
                return
        self.kind[node.name] = "kernel"

    # ---- order ----------------------------------------------------------------------------------
    def _version_root(self, v: Value) -> str:
        while v.producer is not None and self.kind.get(v.producer.name) == "view" \
                and v.producer.opdef.lowers_to != "placement":
            v = v.producer.operands[0]
        return v.name

    def _writers(self) -> dict[str, Node]:
        """Version (root value name) → the node that overwrites it in place (computed once: the graph
        does not change while it is lowered, and the view classification is complete before the first call)."""
        if self._writers_memo is not None:
            return self._writers_memo
        out = {}
        for node in self.g.nodes.values():
            for o in self._aliases(node).values():
                out[self._version_root(node.operands[o])] = node
        self._writers_memo = out
        return out

    def _program_order(self) -> list[Node]:
        """The graph's topological order (networkx's lexicographical_topological_sort of its edges, key seq)
        with an edge from every reader of a buffer version to the node that overwrites it in place."""
        writers = self._writers()
        war = []
        for reader in self.g.nodes.values():
            if self.kind[reader.name] != "kernel":
                continue
            for u in reader.operands:
                writer = writers.get(self._version_root(u))
                if writer is not None and writer is not reader and not u.type.is_token:
                    war.append((reader, writer))
        order = self.g.order_with(war)
        if order is None:
            edges = self.g.to_networkx()
            edges.add_edges_from((a.name, b.name) for a, b in war)
            cycle = " -> ".join(e[0] for e in nx.find_cycle(edges))
            raise LoweringError(f"no valid submission order: an in-place update must wait for a reader "
                                f"of the old contents that itself depends on the update ({cycle})",
                                f"graph '@{self.g.name}'")
        return order

    def _check_not_stale(self, v: Value) -> None:
        writer = self._writers().get(self._version_root(v))
        if writer is not None:
            raise LoweringError(f"returns %{v.name}, whose buffer '{writer.name}' later overwrites in place",
                                f"graph '@{self.g.name}'")

    # ---- tasks ----------------------------------------------------------------------------------
    def _attrs(self, node: Node) -> dict[str, Any]:
        return {k: self._concrete(v, node) for k, v in node.attrs.items()}

    def _concrete(self, value: Any, node: Node) -> Any:
        """_concrete(value, env, node), once per dim (the layers share them)."""
        if not isinstance(value, Dim):
            return _concrete(value, self.env, node)
        known = self._dim_values.get(id(value))
        if known is None or known[0] is not value:
            known = self._dim_values[id(value)] = (value, _concrete(value, self.env, node))
        return known[1]

    def _make_task(self, tid: int, node: Node) -> Task:
        opdef = node.opdef
        attrs = self._attrs(node)
        if self.kind[node.name] == "dummy":
            return Task(tid, node.name, node.op, "dummy", "none", 1, [], attrs, opdef.reference_name(),
                        opdef.family, "", self._results(node), sched=str(attrs.get("sched") or ""))
        core = opdef.core_of(node.attrs)
        return Task(
            tid, node.name, node.op, "kernel", "vector" if core == "none" else core, int(attrs.get("blocks", 1)),
            self._args(node), attrs, opdef.reference_name(), opdef.family, "", self._results(node),
            operands=len(node.operands), collective=bool(opdef.collective),
            accumulate=str(attrs.get("accumulate", "none")),
            sched=str(attrs.get("sched") or ""))

    def _args(self, node: Node) -> list[Arg]:
        opdef = node.opdef
        aliases = self._aliases(node)
        inout = set(aliases.values()) | _side_effect_operands(node)
        args = []
        for i, u in enumerate(node.operands):
            if u.type.is_token:
                continue
            direction = "inout" if i in inout else "in"
            args.append(Arg(_operand_name(node, i), u.name, direction, self._dtype(u.type), self._view(u), i,
                            self._dims(u.type)))
        for r, v in enumerate(node.results):
            if v.type.is_token or r in aliases:
                continue
            name = opdef.results[r] if r < len(opdef.results) else f"out{r}"
            args.append(Arg(name, v.name, "out", self._dtype(v.type), self._view(v), r, self._dims(v.type)))
        return args

    def _results(self, node: Node) -> list[dict]:
        aliases = self._aliases(node)
        return [{"value": v.name, "alias": aliases.get(r), "token": v.type.is_token, "dtype": self._dtype(v.type)}
                for r, v in enumerate(node.results)]

    def _producers(self, v: Value, memo: dict[str, frozenset[int]]) -> frozenset[int]:
        if v.name in memo:
            return memo[v.name]
        node = v.producer
        if node is None:
            out: frozenset[int] = frozenset()
        elif node.name in self.task_of:
            out = frozenset({self.task_of[node.name]})
        else:  # a view: whoever produced what it views
            out = frozenset().union(*(self._producers(u, memo) for u in node.operands + node.deps))
        memo[v.name] = out
        return out

    def _declared(self, node: Node) -> dict[int, set[str]]:
        """Predecessor task → why: `explicit` (deps(...)), `token` (token operand), `join` (join input)."""
        memo: dict[str, frozenset[int]] = {}
        dummy = self.kind[node.name] == "dummy"
        ordering = [(u, "explicit") for u in node.deps]
        ordering += [(u, "join" if dummy else "token") for u in node.operands if dummy or u.type.is_token]
        out: dict[int, set[str]] = {}
        for u, why in ordering:
            for t in self._producers(u, memo):
                if t != self.task_of[node.name]:
                    out.setdefault(t, set()).add(why)
        return out


def _derive_deps(tasks: list[Task], declared: Mapping[int, Mapping[int, set[str]]]) -> None:
    """Hazards ∪ declared edges, transitively reduced, with the provenance of every kept edge."""
    kinds: dict[tuple[int, int], set[str]] = {}
    for h in find_hazards(tasks):
        kinds.setdefault((h.first, h.second), set()).add(f"{h.kind}:{h.buffer}")
    for t in tasks:
        for d, why in declared[t.id].items():
            if d >= t.id:
                raise LoweringError(f"{t.label()} is declared to wait for later task {d}")
            kinds.setdefault((d, t.id), set()).update(why)
    kept = transitive_reduction(len(tasks), kinds)
    by_task: dict[int, list[int]] = {}
    for d, j in kept:
        by_task.setdefault(j, []).append(d)
    for t in tasks:
        t.deps = sorted(by_task.get(t.id, ()))
        t.dep_kinds = {d: sorted(kinds[(d, t.id)]) for d in t.deps}


def _side_effect_operands(node: Node) -> set[int]:
    """Operands an op updates in place without returning a new version: the signal window a notifier
    AtomicAdds into (`notify_operand`). They are `inout` arguments, so the notifier → waiter order is a
    derived RAW dependency (on hardware TensorMap never sees remote writes: the edge must be explicit)."""
    name = getattr(node.opdef, "notify_operand", None)
    if name is None:
        return set()
    return {i for i, n in enumerate(node.opdef.operands) if n.lstrip("*") == name and i < len(node.operands)}


def _aliases(node: Node) -> dict[int, int]:
    """The op's in-place aliases that apply to this node (an optional operand may be absent)."""
    return {r: o for r, o in node.opdef.aliases.items() if o < len(node.operands) and r < len(node.results)}


def _operand_name(node: Node, i: int) -> str:
    """The op's operand name; items of a variadic tail are numbered unless there is just one."""
    opdef = node.opdef
    fixed, variadic = opdef.arity()
    if i < fixed:
        return opdef.operands[i]
    base = opdef.operands[-1].lstrip("*") if variadic else "in"
    return base if len(node.operands) == fixed + 1 else f"{base}{i - fixed}"


def _is_dummy(node: Node) -> bool:
    opdef = node.opdef
    if opdef.lowers_to == "dummy":
        return True
    return opdef.core_of(node.attrs) == "none" and opdef.lowers_to not in ("view", "placement") \
        and all(v.type.is_token for v in node.results)


def _concrete(value: Any, env: Mapping[str, int], node: Node) -> Any:
    if isinstance(value, Dim):
        n = value.value(env)
        if n is None:
            raise LoweringError(f"attribute value {value} has unbound symbols", node.where)
        return n
    if isinstance(value, (tuple, list)):
        return tuple(_concrete(v, env, node) for v in value)
    if isinstance(value, (bool, int, float, str)) or value is None:
        return value
    inner = getattr(value, "value", None)
    return inner if isinstance(inner, str) else value


def kernel_stem(name: str, taken: set[str]) -> str:
    """A file/function name for a task: the node name with non-identifier characters as '_'."""
    stem = re.sub(r"[^0-9A-Za-z_]", "_", name)
    if not stem or stem[0].isdigit():
        stem = "k_" + stem
    candidate, i = stem, 2
    while candidate in taken:
        candidate, i = f"{stem}_{i}", i + 1
    taken.add(candidate)
    return candidate

"""The verifier: structural, type, attribute, tiling and buffer invariants. Errors name the node."""
from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Mapping

from .dims import Dim
from .errors import DimError, ShapeError, VerifyError
from .graph import Graph, Node, Value, infer_types
from .ops.base import format_attr_value
from .types import TensorType

GraphCheck = Callable[[Graph], Iterable[VerifyError]]
GRAPH_CHECKS: list[GraphCheck] = []


def register_graph_check(fn: GraphCheck) -> GraphCheck:
    """Add a whole-graph check (e.g. the signal protocol rules of ops/signal.py) to every verify."""
    if fn not in GRAPH_CHECKS:
        GRAPH_CHECKS.append(fn)
    return fn


def verify(g: Graph) -> None:
    """Raise the first VerifyError found."""
    for error in check(g):
        raise error


def _count(least: int) -> tuple[str, Callable[[Any], bool]]:
    return f"an integer >= {least}", lambda v: type(v) is int and v >= least


_TEXT = ("a string", lambda v: isinstance(v, str))
# The graph attributes the tools read, and what each must be; other attributes are free-form notes.
GRAPH_ATTRIBUTES: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "layer": _TEXT, "config": _TEXT, "kind": _TEXT,
    "tp": _count(1), "ranks": _count(1), "ep": _count(1), "layers": _count(1),
    "layer_id": _count(0), "max_context": _count(0),
    "outputs": ("a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v)),
}


def check(g: Graph) -> Iterator[VerifyError]:
    """Yield every problem found, in a deterministic order (header, then nodes in order)."""
    header_errors = list(_check_header(g))
    yield from header_errors
    yield from _check_references(g)
    try:
        order = g.topo_order()
    except VerifyError as e:
        yield e
        return
    node_errors = False
    env, declared, rules = g.env, set(g.symbols), _Rules()
    for node in order:
        for error in _check_node(g, node, env, declared, rules):
            node_errors = True
            yield error
    yield from _check_buffers(g, order)
    if node_errors or header_errors:
        return
    from .ops import load_all

    load_all()
    for graph_check in GRAPH_CHECKS:
        yield from graph_check(g)


def _err(message: str, where: str) -> VerifyError:
    return VerifyError(message, where)


def _shown(value: Any) -> str:
    text = format_attr_value(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _check_header(g: Graph) -> Iterator[VerifyError]:
    where = f"{g.loc}: graph '@{g.name}'" if g.loc else f"graph '@{g.name}'"
    for name, value in g.symbols.items():
        if value is not None and value < 1:
            yield _err(f"symbol {name} = {value}: a bound symbol must be at least 1", where)
    for key, value in g.attributes.items():
        rule = GRAPH_ATTRIBUTES.get(key)
        if rule is not None and not rule[1](value):
            yield _err(f"graph attribute '{key}' must be {rule[0]}, got {_shown(value)}", where)
    declared, env = set(g.symbols), g.env
    for p in g.params:
        unknown = p.type.symbols() - declared
        if unknown:
            yield _err(f"parameter %{p.name} uses undeclared symbol '{sorted(unknown)[0]}'", where)
        else:
            problem = _extent_problem(p.type, env)
            if problem:
                yield _err(f"parameter %{p.name}: {problem}", where)
        if p.inout and p.type.is_token:
            yield _err(f"parameter %{p.name}: a token cannot be inout", where)
    if not g.returns:
        yield _err("graph returns nothing", where)


def _extent_problem(t: TensorType, env: Mapping[str, int]) -> str | None:
    """Why a type's shape is not a list of extents >= 0 once `env` binds its symbols, or None."""
    for d in t.shape:
        problem = _dim_problem(d, env)
        if problem:
            return f"{t}: {problem}"
        n = d.value(env)
        if n is not None and n < 0:
            return f"{t}: extent {d} is {n}{_bound(d, env)}"
    return None


def _dim_problem(d: Dim, env: Mapping[str, int]) -> str | None:
    try:
        d.evaluate(env)
    except DimError as e:
        return f"{d} has a {e.message}{_bound(d, env)}"
    return None


def _bound(d: Dim, env: Mapping[str, int]) -> str:
    bound = [f"{s} = {env[s]}" for s in sorted(d.symbols()) if s in env]
    return f" at {', '.join(bound)}" if bound else ""


def _attr_problems(attrs: Mapping[str, Any], declared: set[str], env: Mapping[str, int]) -> list[str]:
    """Dim attributes: symbols declared, no division by zero once bound, blocks >= 1."""
    problems = []
    for key, value in attrs.items():
        for d in (value,) if isinstance(value, Dim) else value if isinstance(value, tuple) else ():
            if not isinstance(d, Dim):
                continue
            unknown = d.symbols() - declared
            if unknown:
                problems.append(f"attribute '{key}' uses undeclared symbol '{sorted(unknown)[0]}'")
                continue
            problem = _dim_problem(d, env)
            if problem:
                problems.append(f"attribute '{key}': {problem}")
                continue
            n = d.value(env)
            if key == "blocks" and n is not None and n < 1:
                value = f"{d}" if str(d) == str(n) else f"{d} = {n}"
                problems.append(f"attribute 'blocks' must be at least 1, got {value}")
    return problems


def _check_references(g: Graph) -> Iterator[VerifyError]:
    for node in g.nodes.values():
        for v in list(node.operands) + list(node.deps):
            if g.values.get(v.name) is not v:
                yield _err(f"operand %{v.name} is not defined in this graph", node.where)
    for v in g.returns:
        if g.values.get(v.name) is not v:
            yield _err(f"return value %{v.name} is not defined in this graph", f"graph '@{g.name}'")


class _Rule:
    """An op's attribute check, shape rule and tile axes for one set of operand types and attribute values."""

    def __init__(self, opdef, types: list[TensorType], values: tuple):
        self.opdef, self.types, self.values = opdef, types, values   # held: the ids in its key stay theirs
        self.inferred: list[TensorType] | None = None
        self.axes: list | None = None
        self._same: dict[tuple[int, int], tuple] = {}   # (result, id(declared type)) → (type, _same_type)
        self._extents: dict[int, int | None] = {}        # tiled axis → its extent's value
        self._attr_problems: list[str] | None = None

    def attr_problems(self, node: Node, declared: set[str], env: dict[str, int]) -> list[str]:
        if self._attr_problems is None:
            self._attr_problems = _attr_problems(node.attrs, declared, env)
        return self._attr_problems

    def same_type(self, r: int, declared: TensorType, env: dict[str, int]) -> bool:
        """_same_type(declared, the inferred type of result r, env)."""
        known = self._same.get((r, id(declared)))
        if known is None or known[0] is not declared:
            known = self._same[(r, id(declared))] = (declared, _same_type(declared, self.inferred[r], env))
        return known[1]

    def extent(self, axis: int, env: dict[str, int]) -> int | None:
        if axis not in self._extents:
            self._extents[axis] = self.axes[axis][1].value(env)
        return self._extents[axis]

    def infer(self, node: Node) -> list[TensorType]:
        """Raises ShapeError."""
        if self.inferred is None:
            self.opdef.normalize_attrs(node.attrs)
            self.inferred = infer_types(self.opdef, self.types, node.attrs, node.name)
        return self.inferred

    def tile_axes(self, node: Node) -> list:
        if self.axes is None:
            self.axes = self.opdef().tile_axes(self.types, self.inferred, node.attrs)
        return self.axes


class _Rules:
    """The rules asked once per op, operand types and attribute values (by identity: a model's layers share
    them) in one check: they depend on nothing else."""

    def __init__(self):
        self._known: dict[tuple, _Rule] = {}
        self._unknown: dict[int, tuple] = {}     # id(type) → (type, its undeclared symbols)
        self._extent: dict[int, tuple] = {}      # id(type) → (type, _extent_problem(type))

    def extent_problem(self, t: TensorType, env: dict[str, int]) -> str | None:
        """_extent_problem(t, env) (the graph's env: the same throughout a check)."""
        known = self._extent.get(id(t))
        if known is None or known[0] is not t:
            known = self._extent[id(t)] = (t, _extent_problem(t, env))
        return known[1]

    def undeclared(self, t: TensorType, declared: set[str]) -> frozenset[str]:
        """t.symbols() - declared (the graph's symbols: the same throughout a check)."""
        known = self._unknown.get(id(t))
        if known is None or known[0] is not t:
            known = self._unknown[id(t)] = (t, t.symbols() - declared)
        return known[1]

    def of(self, node: Node) -> _Rule:
        opdef, types, values = node.opdef, [v.type for v in node.operands], tuple(node.attrs.values())
        key = (opdef, tuple(map(id, types)), tuple(node.attrs), tuple(map(id, values)))
        rule = self._known.get(key)
        if rule is None:
            rule = self._known[key] = _Rule(opdef, types, values)
        return rule


def _check_node(g: Graph, node: Node, env: dict[str, int], declared_symbols: set[str],
                rules: _Rules) -> Iterator[VerifyError]:
    rule = rules.of(node)
    try:
        inferred = rule.infer(node)
    except ShapeError as e:
        yield _err(e.message, node.where)
        return
    problems = rule.attr_problems(node, declared_symbols, env)
    for problem in problems:
        yield _err(problem, node.where)
    if problems:
        return
    for r, (v, expected) in enumerate(zip(node.results, inferred)):
        unknown = rules.undeclared(v.type, declared_symbols)
        if unknown:
            yield _err(f"result %{v.name} uses undeclared symbol '{sorted(unknown)[0]}'", node.where)
            continue
        problem = rules.extent_problem(v.type, env)
        if problem:
            yield _err(f"result %{v.name}: {problem}", node.where)
            continue
        try:
            same = rule.same_type(r, v.type, env)
        except DimError as e:      # the inferred type divides by zero where the declared one does not
            yield _err(f"result %{v.name}: {node.op} gives {expected}, which has a {e.message}", node.where)
            continue
        if not same:
            yield _err(f"result %{v.name} has type {v.type} but {node.op} gives {expected}", node.where)
    if len(inferred) != len(node.results):
        yield _err(f"{node.op} gives {len(inferred)} results, {len(node.results)} declared", node.where)
    for d in node.deps:
        if d.producer is None and not d.type.is_token:
            yield _err(f"deps(%{d.name}): an explicit dependency must name an op's result", node.where)
    yield from _check_tiles(node, rule, env)


def _check_tiles(node: Node, rule: _Rule, env: dict[str, int]) -> Iterator[VerifyError]:
    tile = node.attrs.get("tile")
    if tile is None:
        return
    axes = rule.tile_axes(node)
    if len(tile) != len(axes):
        names = ", ".join(a for a, _ in axes) or "none"
        yield _err(f"tile has {len(tile)} entries but {node.op} tiles {len(axes)} axes ({names})", node.where)
        return
    for i, ((axis, _), size) in enumerate(zip(axes, tile)):
        if size <= 0:
            yield _err(f"tile size for axis '{axis}' must be positive, got {size}", node.where)
            continue
        try:
            n = rule.extent(i, env)
        except DimError:           # reported on the type it comes from
            continue
        if n is None or n % size == 0 or node.attrs.get("tail") == "clamp":
            continue
        yield _err(f"tile {size} does not divide axis '{axis}' = {n} (declare tail = clamp)", node.where)


def _check_buffers(g: Graph, order: list[Node]) -> Iterator[VerifyError]:
    """In-place updates must chain from an inout parameter, one writer per version, no stale reads."""
    writer_of: dict[str, Node] = {}
    for node in order:
        for r_index, o_index in node.opdef.aliases.items():
            if o_index >= len(node.operands) or r_index >= len(node.results):
                continue
            buf = node.operands[o_index]
            root = _buffer_root(buf, node)
            if root is None or not (root.inout or (root.producer is not None and root.producer.opdef.allocates)):
                yield _err(f"updates %{buf.name} in place, but it is neither an inout parameter "
                           "nor a locally allocated buffer", node.where)
                continue
            if buf.name in writer_of:
                yield _err(f"%{buf.name} is updated in place twice (also by '{writer_of[buf.name].name}')",
                           node.where)
                continue
            writer_of[buf.name] = node
    if not writer_of:
        return
    for name, writer in writer_of.items():
        for reader in g.users(g.values[name]):
            # reader ∈ nx.descendants(writer): a path writer → … → reader (Graph.reaches, no networkx)
            if reader is not writer and g.reaches(writer, reader):
                yield _err(f"reads %{name} after '{writer.name}' overwrote it in place", reader.where)
    for p in g.params:
        if p.inout and _last_version(g, p, writer_of) not in g.returns:
            yield _err(f"the final version of inout buffer %{p.name} is not returned", f"graph '@{g.name}'")


def _buffer_root(v: Value, seen_from: Node) -> Value | None:
    while v.producer is not None:
        node = v.producer
        if node.opdef.allocates:
            return v
        alias = node.opdef.aliases.get(v.index)
        if alias is None:
            return None
        v = node.operands[alias]
    return v


def _last_version(g: Graph, p: Value, writer_of: dict[str, Node]) -> Value:
    v = p
    while v.name in writer_of:
        node = writer_of[v.name]
        index = next(r for r, o in node.opdef.aliases.items() if node.operands[o] is v)
        v = node.results[index]
    return v


def _same_type(a: TensorType, b: TensorType, env: dict[str, int]) -> bool:
    if a == b:
        return True
    return a.dtype == b.dtype and a.rank == b.rank and a.evaluate(env) == b.evaluate(env)

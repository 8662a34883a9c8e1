"""typed-gather: consumers of an all-to-all / all-gather read the exchange window; the copy-out wave goes."""
from __future__ import annotations

from dataclasses import dataclass

from dspark_ir.graph import Graph, Node, Value

from .base import Pass, RewriteRecord, Skip, register_pass
from .contracts import BITWISE
from .rewriting import is_returned, set_deps

COPY_OUT, RELEASE = "window_copy_out", "window_release"
VIEW_OPS = frozenset({"slice", "reshape"})   # pure views (no task): their readers are the real readers


@register_pass
@dataclass(frozen=True)
class TypedGather(Pass):
    """Let the consumers of an exchange read its window rows directly, dropping the copy-out wave.

    Before (dspark-model.md §3.5, §6(b)): an exchange task puts every rank's payload into its peers' windows and
    waits for barrier 1 (`o_group_a2a`: every peer's rows have landed); then `window_copy_out` copies the data rows
    of the window into a local tensor (the unpack wave, row by row in the seed), waits for barrier 2 (every peer
    has copied out, so the window may be overwritten) and resets the credit cells; the consumers (`o_proj_a` per
    local O group) read the local copy.
    After: the consumers take the window itself as their typed input — the view of its data rows along the copy
    axis (row src_rank·T + t; the pad rows up to the window's capacity are skipped: `slice {start = 0,
    size = rows}`, or the window itself when it has no pad rows) — so the local tensor and the copy-out wave
    disappear and the consumers start right after barrier 1. Two edges keep it correct:
    * wait → consumer: each consumer gets `deps(<exchange>)`. The window is written by the peers' puts, which
      TensorMap never sees, so the edge from the task that waited for them is declared, not inferred.
    * release: barrier 2's old job (no peer may rewrite the window while a consumer still reads it) moves to a
      `window_release` of the window whose deps are every last reader of the window; it meets the peers and resets
      the credit cells, moving no data. Its window operand also orders it before any later writer of the window,
      and every later rendezvous collective of the graph (the reduce-scatter) gets a dep on it: all ranks must meet
      their peers in one collective order, or two ranks each hold their cores at a different rendezvous (deadlock).
    Explicit deps of the copy-out are carried to the consumers (the release follows them).
    Bitwise: the consumers read exactly the bytes the copy-out copied.
    It does not fire when the copy is returned by the graph (the local tensor must then exist; a consumer cannot
    update the copy in place, the verifier only allows that on allocated buffers), when the copied value is not an
    exchange's result, when the window is returned or copied out twice (one release per window), or when nothing
    reads the copy. At TP1 there is no exchange: a no-op.
    """

    name = "typed-gather"
    contract = BITWISE

    def match(self, g: Graph):
        for node in g.topo_order():
            if node.op != COPY_OUT:
                continue
            reason = _refusal(g, node)
            if reason is not None:
                yield Skip(node.name, reason)
                continue
            yield node

    def rewrite(self, g: Graph, copy: Node) -> RewriteRecord | None:
        if _refusal(g, copy) is not None:
            return None
        window = copy.operands[0]
        exchange = window.producer
        view = _rows_view(g, copy, window, exchange)
        for node in g.users(copy.result):          # an ordering-only user waits for the landed window
            if copy.result not in node.operands:
                set_deps(g, node, _sorted_unique([window if d is copy.result else d for d in node.deps]))
        g.replace_uses(copy.result, view)
        consumers = readers(g, view) if view is not window else [u for u in readers(g, window) if u is not copy]
        for node in consumers:
            _add_deps(g, node, [window] + copy.deps)
        last = [u for u in readers(g, window) if u is not copy]
        release = g.add_op(RELEASE, [window], names=g.fresh_name(exchange.name + ".release"),
                           deps=_sorted_unique([u.results[0] for u in last]), near=copy)
        g.remove_node(copy)
        later = _order_after(g, release)
        rows = f"%{view.name}" if view is not window else "the whole window"
        before = f", before {', '.join('%' + n.name for n in later)}" if later else ""
        return RewriteRecord("typed-view", copy.name,
                             f"{', '.join('%' + n.name for n in consumers)} read {rows}; "
                             f"%{release.name} after {len(last)} reader(s){before}")


def readers(g: Graph, value: Value) -> list[Node]:
    """The nodes that read `value` as data, looking through pure view ops (which lower to no task)."""
    out: list[Node] = []
    for user in g.users(value):
        if value not in user.operands:
            continue
        if user.op in VIEW_OPS:
            out += [r for r in readers(g, user.result) if r not in out]
        elif user not in out:
            out.append(user)
    return out


def meets_peers(node: Node) -> bool:
    """A rendezvous collective: each rank's task meets its peers' (an exchange, a barrier). Signal notifies/waits
    and one-sided puts have their own protocol and are not ordered here."""
    opdef = node.opdef
    return bool(opdef.collective and not opdef.aliases and getattr(opdef, "notify_operand", None) is None
                and getattr(opdef, "wait_operand", None) is None)


def _order_after(g: Graph, release: Node) -> list[Node]:
    """Give every rendezvous collective that is not already ordered around the release a dep on it: every rank must
    meet its peers in the same collective order, else two ranks each hold their cores at a different rendezvous
    and wait for the other (a deadlock). Returns the nodes that got the edge."""
    ordered = _reach(g, release, up=True) | _reach(g, release, up=False) | {release.name}
    later = g.in_topo_order([n for n in g.nodes.values() if n.name not in ordered and meets_peers(n)])
    for node in later:
        _add_deps(g, node, [release.result])
    return later


def _reach(g: Graph, start: Node, up: bool) -> set[str]:
    """nx.ancestors (up) / nx.descendants of `start` on g.to_networkx(), by walking operands+deps
    (up) or users (down) without building the networkx graph."""
    seen: set[str] = set()
    stack = [start]
    while stack:
        cur = stack.pop()
        if up:
            nxt = [v.producer for v in (*cur.operands, *cur.deps)
                   if v.producer is not None and v.producer.name in g.nodes]
        else:
            nxt = [u for v in cur.results for u in g.users(v)]
        for n in nxt:
            if n.name not in seen:
                seen.add(n.name)
                stack.append(g.nodes[n.name])
    seen.discard(start.name)
    return seen


def _refusal(g: Graph, copy: Node) -> str | None:
    window = copy.operands[0]
    exchange = window.producer
    if exchange is None or not exchange.opdef.collective:
        what = "a graph parameter" if exchange is None else f"%{exchange.name} ({exchange.op}), not an exchange"
        return f"copies %{window.name}, which is {what}: there is no peer-written window to read"
    if is_returned(g, copy):
        return f"the copy %{copy.result.name} is returned by the graph: the local tensor must stay"
    copies = [u for u in g.users(window) if u.op == COPY_OUT and u is not copy]
    if copies:
        return f"the window %{window.name} is also copied out by %{copies[0].name}: one release per window"
    if _escapes(g, window, skip=copy):
        return f"the window %{window.name} (or a view of it) is returned by the graph: its release cannot follow " \
               "every reader"
    if not readers(g, copy.result):
        return f"nothing reads the copy %{copy.result.name}"
    return None


def _rows_view(g: Graph, copy: Node, window: Value, exchange: Node) -> Value:
    """The window itself when the copy takes all of it, else the slice of its data rows (skipping pad rows)."""
    axis, rows = copy.attrs["axis"], copy.attrs["rows"]
    if window.type.shape[axis] == rows:
        return window
    view = g.add_op("slice", [window], {"axis": axis, "start": 0, "size": rows},
                    names=g.fresh_name(exchange.name + ".rows"), near=copy)
    return view.result


def _escapes(g: Graph, value: Value, skip: Node) -> bool:
    if value in g.returns:
        return True
    return any(_escapes(g, u.result, skip) for u in g.users(value)
               if u is not skip and u.op in VIEW_OPS and value in u.operands)


def _add_deps(g: Graph, node: Node, extra: list[Value]) -> None:
    set_deps(g, node, _sorted_unique(node.deps + extra))


def _sorted_unique(values: list[Value]) -> list[Value]:
    return sorted({id(v): v for v in values}.values(), key=lambda v: v.name)

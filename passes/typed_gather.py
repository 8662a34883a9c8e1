"""typed-gather: the context-parallel all-gathers in the seed's typed form.

Compressor payloads (CSA main/aux, HCA; docs/seed-baselines.md): the untyped step cp_wire_pack → cp_allgather →
window_copy_out → cp_wire_unpack becomes cp_typed_allgather → cp_typed_readback (the push reads the typed rows as
their wire bits, the read-back decodes into the typed tensors: no pack or unpack wave; push, waits, read-back
and retire stay). Token gathers (SWA): consumers of the read-back read the window; the read-back wave goes.

The rewrite (consumers read the exchange window, a window_release takes over barrier 2) is shared with
a2a-direct-read (passes/a2a_direct_read.py), which applies it to the O path's all-to-all: a pass names the exchange
op kinds it acts on (`exchanges`). docs/seed-baselines.md says why they are two passes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from operator import attrgetter
from typing import ClassVar

from dspark_ir.graph import Graph, Node, Value
from dspark_ir.ops.collective import CpAllGather, CpTypedAllGather, CpTypedReadback, WindowCopyOut
from dspark_ir.ops.core import Slice
from dspark_ir.ops.window_release import WindowRelease
from dspark_ir.ops.wire import CpWirePack, CpWireUnpack

from .infra.base import Pass, RewriteRecord, Skip, register_pass
from .infra.contracts import BITWISE
from .infra.rewriting import is_returned, set_deps

_NAME = attrgetter("name")


@register_pass
@dataclass(frozen=True)
class TypedGather(Pass):
    """Let the consumers of a context-parallel all-gather read its window rows directly, dropping the read-back.

    The seed's typed gathers (dspark-model.md §6(b); docs/seed-baselines.md) are the CP all-gathers of the
    compressor payloads (seed decode_cp_csa_{main,aux}_typed_allgather_step). Their untyped base packs the f32
    values / scores (and the kv row) into bf16 wire rows (`cp_wire_pack`), pushes them (`cp_allgather`), reads
    them back (`window_copy_out`) and unpacks them (`cp_wire_unpack`). Rewrite "typed-step": the push takes the
    typed rows (`cp_typed_allgather`, the same workers) and the read-back decodes them (`cp_typed_readback`, the
    same workers, waits and retire), so both waves go. Bitwise (the wire form is a bit reinterpretation). It does
    not fire when the wire rows (packed, gathered or read back) have another user or are returned.

    On the other CP all-gathers (the token gathers) the consumers read the gathered window (rewrite
    "typed-view", below; a2a-direct-read applies it to the O path's o_group_a2a, `exchanges`).

    Before (dspark-model.md §3.5, §6(b)): an exchange task puts every rank's payload into its peers' windows and
    waits for barrier 1 (`o_group_a2a` / `cp_allgather`: every peer's rows have landed); then `window_copy_out`
    copies the data rows of the window into a local tensor (the seed's gather / read-back workers), waits for
    barrier 2 (every peer has copied out, so the window may be overwritten) and resets the credit cells; the
    consumers (e.g. `o_proj_a` per local O group) read the local copy.
    After: the consumers take the window itself as their typed input — the view of its data rows along the copy
    axis (row src_rank·T + t; the pad rows up to the window's capacity are skipped: `slice {start = 0,
    size = rows}`, or the window itself when it has no pad rows) — so the local tensor and the copy-out wave
    disappear and the consumers start right after barrier 1. Two edges keep it correct:
    * wait → consumer: each consumer gets `deps(<exchange>)`. The window is written by the peers' puts, which
      TensorMap never sees, so the edge from the task that waited for them is declared, not inferred.
    * release: barrier 2's old job (no peer may rewrite the window while a consumer still reads it) moves to a
      `window_release` of the window whose deps are every last reader of the window; it meets the peers and resets
      the credit cells, moving no data. Its window operand also orders it before any later writer of the window,
      and it is ordered before every later rendezvous collective of the graph: all ranks must meet their peers in
      one collective order, or two ranks each hold their cores at a different rendezvous (deadlock). Only the
      first of them not yet after the release (the reduce-scatter) gets a dep on it; the later ones follow that
      one through the rank's chain of collectives, so the deps stay one per release however many layers follow.
    Explicit deps of the copy-out are carried to the consumers (the release follows them).
    Bitwise: the consumers read exactly the bytes the copy-out copied.
    It does not fire when the copy is returned by the graph (the local tensor must then exist; a consumer cannot
    update the copy in place, the verifier only allows that on allocated buffers), when the copied value is not an
    exchange's result, when the window is returned or copied out twice (one release per window), or when nothing
    reads the copy. At TP1 there is no exchange: a no-op.
    """

    name = "typed-gather"
    origin = "seed PR (dspark-model.md §6(b)): consumers read the exchange window"
    contract = BITWISE
    exchanges: ClassVar[tuple[type, ...]] = (CpAllGather,)
    typed_steps: ClassVar[bool] = True      # also rewrite the untyped compressor-payload steps (below)

    def match(self, g: Graph):
        sweep = _Sweep()
        for node in g.topo_order():
            if node.opdef is CpWireUnpack and self.typed_steps:
                chain = _payload_chain(g, node)
                if isinstance(chain, str):
                    yield Skip(node.name, chain)
                elif chain is not None:
                    yield node
                continue
            if node.opdef is not WindowCopyOut or not self.acts_on(node) or _unpacked(g, node):
                continue
            reason = _refusal(g, node)
            if reason is not None:
                yield Skip(node.name, reason)
                continue
            yield _Site(node, sweep)

    def rewrite(self, g: Graph, site: "_Site | Node") -> RewriteRecord | None:
        if isinstance(site, Node) and site.opdef is CpWireUnpack:
            return _typed_step(g, site) if self.typed_steps else None
        copy, sweep = (site.node, site.sweep) if isinstance(site, _Site) else (site, _Sweep())
        if not self.acts_on(copy) or _refusal(g, copy) is not None:
            return None
        sweep.start(g, copy)
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
        release = g.add_op(WindowRelease.name, [window], names=g.fresh_name(exchange.name + ".release"),
                           deps=_sorted_unique([u.results[0] for u in last]), near=copy)
        g.remove_node(copy)
        sweep.edited(copy, [view.producer] if view is not window else [], release)
        later, edged = _order_after(g, release, sweep)
        sweep.finish(g, later)
        rows = f"%{view.name}" if view is not window else "the whole window"
        before = f", before {', '.join('%' + n.name for n in edged)}" if edged else ""
        return RewriteRecord("typed-view", copy.name,
                             f"{', '.join('%' + n.name for n in consumers)} read {rows}; "
                             f"%{release.name} after {len(last)} reader(s){before}")


    def acts_on(self, copy: Node) -> bool:
        """Is `copy` the copy-out of an exchange of one of this pass's kinds?"""
        exchange = copy.operands[0].producer
        return exchange is not None and exchange.opdef in self.exchanges


def readers(g: Graph, value: Value) -> list[Node]:
    """The nodes that read `value` as data, looking through pure view ops (which lower to no task)."""
    out: list[Node] = []
    for user in g.users(value):
        if value not in user.operands:
            continue
        if _is_view(user):
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


def _order_after(g: Graph, release: Node, sweep: "_Sweep") -> tuple[list[Node], list[Node]]:
    """Order the new release before every rendezvous collective not already before it: every rank must meet its
    peers in the same collective order, else two ranks each hold their cores at a different rendezvous and wait
    for the other (a deadlock). Taken in topological order, a collective gets a dep on the release only when
    the release does not reach it yet: the ones that follow an earlier one (the next in the rank's chain of
    collectives, or one that got the edge) are after the release already. Returns (those collectives in
    topological order, the ones that got the edge)."""
    up = g.ancestors(release)          # the release was just added: no node is after it yet
    later = g.in_topo_order([n for n in sweep.peers if n.name not in up and n is not release], sweep.chained)
    edged: list[Node] = []
    for prev, node in zip([None] + later, later):
        if prev is not None and (sweep.follows(g, prev, node) or any(g.reaches(e, node) for e in edged)):
            continue
        _add_deps(g, node, [release.result])
        edged.append(node)
    return later, edged


@dataclass(eq=False)
class _Sweep:
    """What one match() sweep keeps between its rewrites, while only this pass edits the graph (the graph version
    says): the rendezvous collectives (a rewrite removes its copy and may add a release), and the pairs of them
    found chained when ordering the last release (see Graph.in_topo_order's `known`): the next release's later
    collectives are mostly the same chain, so it is not walked again."""

    version: int = -1
    peers: list[Node] = field(default_factory=list)      # in g.nodes order
    later: list[Node] = field(default_factory=list)      # the last release's later collectives, in order
    chained: dict = field(default_factory=dict)          # pairs of consecutive ones found chained

    def start(self, g: Graph, copy: Node) -> None:
        """Before rewriting `copy`. A rewrite removes only edges at its copy, so a chained pair stays chained
        unless the copy may lie on its path: not when the pair comes after the copy in the last order (a path
        from it to the copy would have put it before; the release edges added since start at a node it does
        not reach)."""
        if g.version != self.version:
            self.peers, self.later, self.chained = [n for n in g.nodes.values() if meets_peers(n)], [], {}
        at = next((i for i, n in enumerate(self.later) if n is copy), len(self.later))
        for a, b in zip(self.later[:at + 1], self.later[1:at + 2]):      # the pairs up to the one after the copy
            key = (id(a), id(b))
            if key in self.chained and (b is copy or a is copy or (g.reaches(a, copy) and g.reaches(copy, b))):
                del self.chained[key]

    def edited(self, copy: Node, views: list[Node], release: Node) -> None:
        """The rewrite removed `copy` and added `views` and then `release` (at the end of g.nodes)."""
        self.peers = [n for n in self.peers if n is not copy] + [n for n in (*views, release) if meets_peers(n)]

    def follows(self, g: Graph, a: Node, b: Node) -> bool:
        """Does `a` reach `b`? A pair found chained is remembered (the nodes stay referenced, so their ids stay
        theirs)."""
        key = (id(a), id(b))
        if key in self.chained:
            return True
        if not g.reaches(a, b):
            return False
        self.chained[key] = (a, b)
        return True

    def finish(self, g: Graph, later: list[Node]) -> None:
        pairs = {(id(a), id(b)) for a, b in zip(later, later[1:])}
        self.chained = {k: v for k, v in self.chained.items() if k in pairs}
        self.later, self.version = later, g.version


@dataclass(frozen=True, eq=False)
class _Site:
    node: Node
    sweep: _Sweep


def _unpacked(g: Graph, copy: Node) -> bool:
    """Is `copy` the read-back of an untyped payload step (read by a wire unpack)? The typed-step rewrite owns it."""
    return any(u.opdef is CpWireUnpack for u in readers(g, copy.result))


def _payload_chain(g: Graph, unpack: Node) -> "tuple[Node, Node, Node] | str | None":
    """(pack, gather, copy) of an untyped compressor-payload step ending at `unpack`; None when `unpack` reads no
    read-back of an all-gather (not this pass's pattern), a refusal when the chain cannot be typed."""
    copy = unpack.operands[0].producer
    if copy is None or copy.opdef is not WindowCopyOut:
        return None
    gather = copy.operands[0].producer
    if gather is None or gather.opdef is not CpAllGather:
        return None
    pack = gather.operands[0].producer
    if pack is None or pack.opdef is not CpWirePack:
        return f"%{gather.name} gathers %{gather.operands[0].name}, not a wire pack: no typed form to take"
    if copy.attrs["axis"] != 0:
        return f"%{copy.name} reads back along axis {copy.attrs['axis']}, not the rows"
    for value, reader in ((pack.result, gather), (gather.result, copy), (copy.result, unpack)):
        others = [u for u in g.users(value) if u is not reader]
        if value in g.returns or others:
            who = "the graph" if value in g.returns else f"%{others[0].name}"
            return f"%{value.name} is also used by {who}: the wire rows must stay"
    values, kv = pack.operands[0], pack.operands[2:]
    width = values.type.shape[1].value(g.env)
    kv_cols = kv[0].type.shape[1].value(g.env) if kv else 0
    if (unpack.attrs.get("width"), unpack.attrs.get("kv", 0)) != (width, kv_cols):
        return f"%{unpack.name} decodes width {unpack.attrs.get('width')}, kv {unpack.attrs.get('kv', 0)}; " \
               f"%{pack.name} packs {width}, {kv_cols}"
    return pack, gather, copy


def _typed_step(g: Graph, unpack: Node) -> RewriteRecord | None:
    """pack → cp_allgather → window_copy_out → unpack  ⇒  cp_typed_allgather → cp_typed_readback (bitwise: the
    wire form is a bit reinterpretation; the push and the read-back keep their workers, waits and retire)."""
    chain = _payload_chain(g, unpack)
    if chain is None or isinstance(chain, str):
        return None
    pack, gather, copy = chain
    push_attrs = {k: v for k, v in gather.attrs.items()}
    push = g.add_op(CpTypedAllGather.name, list(pack.operands), push_attrs,
                    names=g.fresh_name(gather.name + ".typed"), deps=_sorted_unique(pack.deps + gather.deps),
                    near=gather)
    read_attrs = {k: v for k, v in copy.attrs.items() if k not in ("axis", "rows")}
    read_attrs.update(rows=copy.attrs["rows"], width=unpack.attrs["width"], kv=unpack.attrs.get("kv", 0))
    names = [g.fresh_name(gather.name + ".readback")] + [g.fresh_name(f"{gather.name}.readback.{r}")
                                                         for r in CpTypedReadback.results[1:len(unpack.results)]]
    readback = g.add_op(CpTypedReadback.name, [push.result], read_attrs, names=names,
                        deps=_sorted_unique(copy.deps + unpack.deps), near=copy)
    for old, new in zip(unpack.results, readback.results):
        g.replace_uses(old, new)
    g.replace_uses(copy.result, readback.results[0])        # ordering-only users of the removed tasks
    g.replace_uses(gather.result, push.result, skip=copy)
    g.replace_uses(pack.result, push.result, skip=gather)
    for node in (unpack, copy, gather, pack):
        g.remove_node(node)
    return RewriteRecord("typed-step", gather.name,
                         f"%{push.name} pushes {', '.join('%' + v.name for v in pack.operands)} as wire bits (no "
                         f"%{pack.name}); %{readback.name} decodes the read-back (no %{unpack.name})")


def _refusal(g: Graph, copy: Node) -> str | None:
    window = copy.operands[0]
    exchange = window.producer
    if exchange is None or not exchange.opdef.collective:
        what = "a graph parameter" if exchange is None else f"%{exchange.name} ({exchange.op}), not an exchange"
        return f"copies %{window.name}, which is {what}: there is no peer-written window to read"
    if is_returned(g, copy):
        return f"the copy %{copy.result.name} is returned by the graph: the local tensor must stay"
    copies = [u for u in g.users(window) if u.opdef is WindowCopyOut and u is not copy]
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
    view = g.add_op(Slice.name, [window], {"axis": axis, "start": 0, "size": rows},
                    names=g.fresh_name(exchange.name + ".rows"), near=copy)
    return view.result


def _escapes(g: Graph, value: Value, skip: Node) -> bool:
    if value in g.returns:
        return True
    return any(_escapes(g, u.result, skip) for u in g.users(value)
               if u is not skip and _is_view(u) and value in u.operands)


def _add_deps(g: Graph, node: Node, extra: list[Value]) -> None:
    set_deps(g, node, _sorted_unique(node.deps + extra))


def _sorted_unique(values: list[Value]) -> list[Value]:
    return sorted(dict.fromkeys(values), key=_NAME)     # values hash by identity


def _is_view(node: Node) -> bool:
    """A pure view (slice, reshape: no task): its readers are the real readers."""
    return node.opdef.lowers_to == "view"

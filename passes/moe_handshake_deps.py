"""moe-handshake-deps: order each cross-rank wait after its local notifier, one combine notify per rank, no AER."""
from __future__ import annotations

from dataclasses import dataclass
from operator import attrgetter

from dspark_ir.graph import Graph, Node
from dspark_ir.ops.moe import Combine
from dspark_ir.ops.signal import SignalBarrier, SignalWait, is_notifier, is_waiter, notifies_per_epoch

from .infra.analysis import analyses
from .infra.base import Pass, RewriteRecord, Skip, register_pass
from .infra.contracts import BITWISE
from .infra.rewriting import set_deps


@dataclass(frozen=True)
class Site:
    rule: str          # anchor-wait | one-notify | drop-aer
    node: Node
    detail: str = ""


@register_pass
@dataclass(frozen=True)
class MoeHandshakeDeps(Pass):
    """Anchor the MoE dispatch/combine waits after their notifiers and take early resolve off the handshake.

    Before (dspark-model.md §6(g)): `dispatch_wait` is anchored only by a read of the routing indices, not by
    `dispatch_push`; every block of `combine` notifies `combine_arrived` and `combine_wait`, with no edge at all,
    waits for epoch·NL notifies; every stage allows early resolve (AER). A wait spins and holds a core group
    (§5), so a waiter dispatched early can hold the very cores its rank's notifier still needs, while the peers
    wait for that notifier: EP8 prefill deadlocked after enough rounds. After, as in the seed PR (#982):

    * anchor-wait  every `signal_wait` gets `deps(<its notifier>)`, so it starts only once its own rank's
                   notifier has finished (dispatch_push → dispatch_wait). Skipped when the wait is already
                   ordered after the notifier, or when the notifier runs after the wait (a cycle).
    * one-notify   a wait whose notifier is in `barrier_notifiers` (default `moe_combine`) and notifies per
                   block becomes one notify + wait (`signal_barrier`, expected = epoch): the notifier stops
                   notifying (`notify_per = none`) and the barrier, gated on the whole scatter grid
                   (`deps(combine)`) and on the notifiers of the waits before it (`dispatch_push`), sends one
                   notify per rank. Only the nearest of those notifiers gets the edge: one upstream of another
                   (an earlier layer's dispatch_push) is before the barrier through it already, so the deps do
                   not grow with the layers before it. The payload-before-notify rule (§5) holds because the
                   barrier runs after every put it announces. The waiter keeps its name and becomes its own
                   notifier, so `check_signals`' link expected = epoch × per-epoch count stays true (1 notify
                   per epoch). Refused when another waiter still counts the notifier's per-block notifies. The
                   dispatch_push dep is implied through dispatch_wait → dispatch_gather → … → combine; it is
                   kept to match the seed's task list (canonicalize's canonical-deps would drop it, harmlessly).
                   The wait is satisfied by the same event as before (every peer finished its whole scatter
                   grid), and combine's grid no longer sets a count, so re-tiling it cannot break the link
                   (§6(g) hazard).
    * drop-aer     AER off on the one-notify notifiers (combine), on every node gated by a wait's token
                   (dispatch_gather, shared_routed), on the one-notify barriers (combine_wait: it is built
                   without AER) and, with `drop_aer_on_waits` (default), on every cross-rank wait
                   (dispatch_meta, dispatch_wait): a waiter then cannot be parked on a core before its inputs
                   are done. The seed PR kept AER on dispatch_meta and dispatch_wait (with the push edge,
                   dispatch_wait cannot be dispatched before push is done anyway); `drop_aer_on_waits = false`
                   reproduces exactly that form (tests/layers/test_moe_layer.py's hand-applied after form).

    Contract: bitwise. Only ordering edges, scheduling hints and where the combine notify is sent change; every
    computed value is the same. Liveness is what it buys: the multi-rank simulator (lowering.simulate)
    deadlocks the before form under a small core budget (1 cube + 2 vector cores per rank) and completes the
    after form (tests/passes/test_moe_handshake_deps.py).
    """

    name = "moe-handshake-deps"
    origin = "seed PR #982 (dspark-model.md §6(g)): MoE handshake deps"
    contract = BITWISE
    fixpoint = False     # one sweep: the one-notify barrier is made without AER, nothing else creates a site
    barrier_notifiers: tuple[str, ...] = (Combine.name,)   # op kinds, by name (a pass option)
    drop_aer_on_waits: bool = True

    def match(self, g: Graph):
        # the wait sites and the signal links are kept in the run's analysis cache (`analyses(g)`) while this
        # pass edits g: a rewrite that changes edges drops the sites (`_forget_sites`), the links are updated
        for node in g.topo_order():
            if node.opdef is SignalWait:
                yield from self._wait_sites(g, node)
            if node.attrs.get("aer"):
                role = self.aer_role(g, node)
                if role is not None:
                    yield Site("drop-aer", node, role)

    def rewrite(self, g: Graph, site: Site) -> RewriteRecord | None:
        node = site.node
        if site.rule == "drop-aer":
            if not node.attrs.get("aer") or self.aer_role(g, node) is None:
                return None
            g.set_attrs(node, {k: v for k, v in node.attrs.items() if k != "aer"})
            return RewriteRecord("drop-aer", node.name, site.detail)
        sites = [s for s in self._wait_sites(g, node) if isinstance(s, Site)]
        if not sites or sites[0].rule != site.rule:
            return None
        _forget_sites(g)   # edges change: the sites seen so far are recomputed from here on
        if site.rule == "anchor-wait":
            return _anchor(g, node)
        return _one_notify(g, node)

    # ---- candidates -------------------------------------------------------------------------------------
    # The one-notify handshakes are the (wait, notifier) pairs still to fold (a signal_wait that one-notify
    # would rewrite) or folded (a signal_barrier that is its own notifier, gated on a silenced notifier).
    def _is_handshake_wait(self, g: Graph, node: Node) -> bool:
        """Is `node` the wait of a one-notify handshake?"""
        if node.opdef is SignalWait:
            return self._one_notify_site(g, node)
        if node.opdef is SignalBarrier and node.attrs.get("notifier") == node.name:
            return any(_silenced(v.producer, self.barrier_notifiers) for v in node.deps)
        return False

    def _is_handshake_notifier(self, g: Graph, node: Node) -> bool:
        """Is `node` the notifier of a one-notify handshake?"""
        for wait in _linked(g, node.name):
            if wait.opdef is SignalWait and self._one_notify_site(g, wait):
                return True
        if not _silenced(node, self.barrier_notifiers):
            return False
        return any(user.opdef is SignalBarrier and user.attrs.get("notifier") == user.name
                   and any(v.producer is node for v in user.deps)
                   for r in node.results for user in g.users(r))

    def _one_notify_site(self, g: Graph, wait: Node) -> bool:
        return any(isinstance(s, Site) and s.rule == "one-notify" for s in self._wait_sites(g, wait))

    def _wait_sites(self, g: Graph, wait: Node):
        return iter(analyses(g).get(("sites", wait.name), lambda: list(self._wait_sites_of(g, wait))))

    def _wait_sites_of(self, g: Graph, wait: Node):
        """The rule that applies to a signal_wait (one-notify before anchor-wait), or why none does."""
        name = wait.attrs.get("notifier", "")
        notifier = g.nodes.get(name)
        if notifier is None or notifier is wait or not is_notifier(notifier):
            yield Skip(wait.name, f"notifier '{name}' is not another notifying node of this graph")
            return
        if _is_ancestor(g, wait, notifier):
            yield Skip(wait.name, f"%{notifier.name} runs after the wait: an edge would make a cycle")
            return
        if notifier.op in self.barrier_notifiers:
            reason = _one_notify_refusal(g, wait, notifier)
            if reason is None:
                yield Site("one-notify", wait)
                return
            yield Skip(wait.name, f"one-notify: {reason}")
        if _is_ancestor(g, notifier, wait):
            yield Skip(wait.name, f"already ordered after its notifier %{notifier.name}")
            return
        yield Site("anchor-wait", wait)

    def aer_role(self, g: Graph, node: Node) -> str | None:
        """Why `node` must not resolve early (None: AER may stay)."""
        if is_waiter(node):
            if self.drop_aer_on_waits:
                return "a cross-rank wait"
            if self._is_handshake_wait(g, node):
                return "the one-notify wait"
        # a pair's notifier is always of a barrier_notifiers kind (one-notify needs it, _silenced checks it)
        if node.op in self.barrier_notifiers and self._is_handshake_notifier(g, node):
            return "the scatter grid a one-notify wait is gated on"
        gate = next((v.producer for v in node.deps + node.operands
                     if v.type.is_token and v.producer is not None and is_waiter(v.producer)), None)
        if gate is not None:
            return f"gated by the wait %{gate.name}"
        return None


# ---- rewrites -----------------------------------------------------------------------------------------------
def _anchor(g: Graph, wait: Node) -> RewriteRecord:
    notifier = g.nodes[wait.attrs["notifier"]]
    set_deps(g, wait, _by_name(wait.deps + [notifier.results[0]]))
    return RewriteRecord("anchor-wait", wait.name, f"deps(%{notifier.name}): starts after its rank's notifier")


def _one_notify(g: Graph, wait: Node) -> RewriteRecord:
    notifier = g.nodes[wait.attrs["notifier"]]
    gates = [notifier.results[0]] + _earlier_notifiers(g, wait, notifier)
    attrs = {k: v for k, v in wait.attrs.items() if k not in ("notifier", "expected", "aer")}
    attrs.update(notifier=wait.name, expected=wait.attrs.get("epoch", 1))
    barrier = g.add_op(SignalBarrier.name, list(wait.operands), attrs, names=g.fresh_name(wait.name + ".barrier"),
                       deps=_by_name(wait.deps + gates), near=wait)
    g.set_attrs(notifier, notifier.opdef.normalize_attrs({**notifier.attrs, "notify_per": "none"}))
    g.replace_uses(wait.result, barrier.result)
    g.remove_node(wait)
    g.rename(barrier.result, wait.name)
    _relinked(g, wait, barrier)
    names = ", ".join(f"%{v.name}" for v in gates)
    detail = (f"one notify per rank after {names}; expected = {barrier.attrs['expected']}, no AER; "
              f"%{notifier.name} notify_per = none")
    return RewriteRecord("one-notify", wait.name, detail)


# ---- helpers ------------------------------------------------------------------------------------------------
def _one_notify_refusal(g: Graph, wait: Node, notifier: Node) -> str | None:
    if notifier.attrs.get("notify_per") != "block":
        return f"%{notifier.name} does not notify per block"
    others = [n.name for n in _linked(g, notifier.name) if n is not wait and is_waiter(n)]
    if others:
        return f"%{others[0]} also counts %{notifier.name}'s per-block notifies"
    per_epoch = notifies_per_epoch(notifier)
    epoch = wait.attrs.get("epoch", 1)
    if per_epoch is None or (epoch * per_epoch).evaluate(g.env) != wait.attrs["expected"].evaluate(g.env):
        return f"expected = {wait.attrs['expected']} is not epoch × %{notifier.name}'s notifies"
    return None


def _earlier_notifiers(g: Graph, wait: Node, notifier: Node) -> list:
    """Results of the nearest notifiers of the signal_waits upstream of `notifier` (dispatch_push for combine):
    those not upstream of another of them (an earlier layer's push is before its successor's)."""
    found: list[Node] = []
    for name in sorted(g.ancestors(notifier) & g.names_of_op(SignalWait.name)):
        node = g.nodes[name]
        if node is wait:
            continue
        other = g.nodes.get(node.attrs.get("notifier", ""))
        if other is not None and other is not node and is_notifier(other) and other not in found:
            found.append(other)
    nearest: list[Node] = []
    for node in sorted(found, key=attrgetter("seq"), reverse=True):   # latest first: the rest are mostly upstream
        if any(node.name in g.ancestors(n) for n in nearest):
            continue
        up = g.ancestors(node)
        nearest = [n for n in nearest if n.name not in up] + [node]
    return [n.results[0] for n in _by_name(nearest)]


def _forget_sites(g: Graph) -> None:
    """Before a rewrite that changes edges: drop the cached sites (they depend on paths); the signal links
    stay (`_relinked` keeps them up to date)."""
    analyses(g).invalidate(keep=("linked",))


def _relinked(g: Graph, wait: Node, barrier: Node) -> None:
    """The cached signal links after one-notify: `wait` went (it named its notifier) and `barrier`, now named
    like it and last in g.nodes, names itself."""
    linked = analyses(g).peek("linked")
    if linked is None:
        return
    name = wait.attrs.get("notifier")
    if name in linked:
        linked[name] = [n for n in linked[name] if n is not wait]
    linked.setdefault(barrier.attrs["notifier"], []).append(barrier)


def _linked(g: Graph, notifier: str) -> list[Node]:
    """The nodes whose `notifier` attribute names `notifier`, in g.nodes order (cached for the pass)."""
    return analyses(g).get("linked", lambda: _links(g)).get(notifier, [])


def _links(g: Graph) -> dict[str, list[Node]]:
    """notifier name → the nodes naming it, in g.nodes order."""
    linked: dict[str, list[Node]] = {}
    for n in g.nodes.values():
        name = n.attrs.get("notifier")
        if isinstance(name, str):
            linked.setdefault(name, []).append(n)
    return linked


def _is_ancestor(g: Graph, a: Node, b: Node) -> bool:
    """Is `a` an ancestor of `b` (a path a → … → b)? `a.name in nx.ancestors(g.to_networkx(), b.name)`."""
    return g.reaches(a, b)


def _silenced(node: Node | None, kinds: tuple[str, ...]) -> bool:
    """A notifier of one of `kinds` whose notifies a one-notify barrier took over."""
    return node is not None and node.op in kinds and node.attrs.get("notify_per") == "none"


def _by_name(values: list) -> list:
    return sorted(dict.fromkeys(values), key=attrgetter("name"))     # values hash by identity

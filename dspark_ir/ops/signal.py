"""Cross-rank windows and signals: window allocation, notify, wait, barrier and put (dspark-model.md §5).

Signal protocol in the IR
-------------------------
* A signal window is a `window` value of type `i32[R,1]` (one INT32 cell per source rank, R = `ranks`). Notifies
  are remote AtomicAdds into it and are **not** dataflow: a notifier and a waiter share the window as an operand,
  which orders both after the allocation and nothing else. An edge from notifier to waiter exists only if it is
  written (`deps(...)`), as on hardware where TensorMap never sees remote writes.
* A **notifier** is any op with a `notify_per` attribute (`task`: one notify per peer per task; `block`: one per
  SPMD block, so the count follows the op's `blocks`; `none`). Its class names the operand it notifies
  (`notify_operand`).
* A **waiter** is any op with the wait attributes `notifier` (name of the node whose instances on the peer ranks
  notify this window), `epoch` (1-based call id; counters are monotonic) and `expected` (the Ge threshold). Its
  class names the operand it waits on (`wait_operand`). `expected` must equal `epoch × count(notifier)` where
  count is the notifier's per-epoch notify count (`value`, times its `blocks` when `notify_per = block`):
  `check_signals` enforces the link, so a pass that re-tiles a notifier must rewrite its waiters.
* `waits(g)` lists every wait site with everything a scheduler/simulator needs (window, epoch, expected,
  notifier node, notifies per epoch). Waits spin and hold a core group (`core = mix`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from ..dims import Dim, dim
from ..errors import VerifyError
from ..types import TOKEN, DType, TensorType
from .base import REQUIRED, Attr, OpDef, expect, numpy_reference, register_op

WAIT_ATTRS: dict[str, Attr] = {
    "notifier": Attr("str", REQUIRED, doc="node whose instances on the peer ranks notify the waited window"),
    "epoch": Attr("dim", 1, doc="1-based call id: monotonic counters, so the threshold grows with the epoch"),
    "expected": Attr("dim", REQUIRED, doc="Ge threshold per peer cell = epoch × notifies per epoch"),
}
NOTIFY_PER = Attr("enum", "task", choices=("task", "block", "none"),
                  doc="one notify per peer per task, per SPMD block, or none")


def is_signal_window(t: TensorType) -> bool:
    return t.dtype == DType.i32 and t.rank == 2 and t.shape[1] == dim(1)


def expect_signal(t: TensorType, what: str = "signal") -> None:
    expect(is_signal_window(t), f"{what} must be an i32[R,1] signal window, got {t}")


@register_op
class Window(OpDef):
    """A per-rank window buffer (host `alloc_window_buffer`), zero-filled; peers write it remotely."""
    name = "window"
    operands = ()
    attrs = {"shape": Attr("dims", REQUIRED), "dtype": Attr("dtype", "i32")}
    core = "none"
    allocates = True
    lowers_to = "host"
    reference = numpy_reference("signal", "window")
    family = "signal"

    def infer(self, ins, attrs):
        return [TensorType(attrs["dtype"], attrs["shape"])]


@register_op
class SignalNotify(OpDef):
    """AtomicAdd `value` into cell[my_rank] of every peer's signal window (after the `after` operands)."""
    name = "signal_notify"
    operands = ("signal", "*after")
    attrs = {"value": Attr("int", 1), "notify_per": NOTIFY_PER}
    collective = True
    lowers_to = "signal"
    notify_operand = "signal"
    reference = numpy_reference("signal", "signal_notify")
    family = "signal"

    def infer(self, ins, attrs):
        expect_signal(ins[0])
        return [TOKEN]


@register_op
class SignalWait(OpDef):
    """Spin until every peer's cell of the window is ≥ `expected` (`pld.system.wait`, WaitCmp.Ge).

    The extra operands are anchors: values read only so that the wait is not dispatched before them.
    """
    name = "signal_wait"
    operands = ("signal", "*anchors")
    attrs = dict(WAIT_ATTRS)
    core = "mix"
    collective = True
    lowers_to = "signal"
    wait_operand = "signal"
    reference = numpy_reference("signal", "signal_wait")
    family = "signal"

    def infer(self, ins, attrs):
        expect_signal(ins[0])
        return [TOKEN]


@register_op
class SignalBarrier(OpDef):
    """One notify to every peer, then wait for every peer's cell ≥ `expected`: its own notifier."""
    name = "signal_barrier"
    operands = ("signal", "*anchors")
    attrs = {"value": Attr("int", 1), **WAIT_ATTRS}
    core = "mix"
    collective = True
    lowers_to = "signal"
    notify_operand = "signal"
    wait_operand = "signal"
    reference = numpy_reference("signal", "signal_barrier")
    family = "signal"

    def infer(self, ins, attrs):
        expect_signal(ins[0])
        return [TOKEN]


@register_op
class Put(OpDef):
    """One-sided row puts: rank s writes src[i] into row `row[i]` of rank `peer[i]`'s window (peer < 0: skip).

    `pld.tensor.put` / `pld.tile.remote_store`. Returns the window's new version on every rank.
    """
    name = "put"
    operands = ("window", "src", "peer", "row")
    aliases = {0: 0}
    collective = True
    reference = numpy_reference("signal", "put")
    family = "signal"

    def infer(self, ins, attrs):
        win, src, peer, row = ins
        expect(win.dtype == src.dtype, f"window {win} and payload {src} differ in dtype")
        expect(src.rank >= 1 and win.rank == src.rank and win.shape[1:] == src.shape[1:],
               f"payload rows {src} do not match window rows {win}")
        for t, what in ((peer, "peer"), (row, "row")):
            expect(t.dtype == DType.i32 and t.rank == 1 and t.shape[0] == src.shape[0],
                   f"{what} must be i32[{src.shape[0]}], got {t}")
        return [win]


# ---- the signal links: wait sites, their notifiers and expected counts ----------------------------------------
@dataclass(frozen=True)
class WaitSite:
    """One wait: the window it spins on, its threshold, and the node that notifies it (on the peer ranks)."""

    node: Any                 # the waiting Node
    signal: Any               # the window Value
    notifier: Any | None      # the notifying Node (None if the name does not resolve)
    epoch: Dim
    expected: Dim
    per_epoch: Dim | None     # notifies per peer per epoch delivered by the notifier


def operand(node, name: str):
    """The operand of `node` declared as `name` in its op definition."""
    return node.operands[node.opdef.operands.index(name)]


def notifies_per_epoch(node) -> Dim | None:
    """Notifies each peer cell receives from one task of `node`: value × (blocks if per block). None if unknown."""
    per = node.attrs.get("notify_per", "task")
    if per == "none":
        return dim(0)
    value = node.attrs.get("value", 1)
    if per == "task":
        return dim(value)
    blocks = node.attrs.get("blocks")
    return None if blocks is None else dim(value) * blocks


def is_waiter(node) -> bool:
    return getattr(node.opdef, "wait_operand", None) is not None


def is_notifier(node) -> bool:
    return getattr(node.opdef, "notify_operand", None) is not None


def waits(g) -> list[WaitSite]:
    """Every wait site of `g`, in topological order."""
    sites = []
    for node in g.topo_order():
        if not is_waiter(node):
            continue
        notifier = g.nodes.get(node.attrs.get("notifier", ""))
        per_epoch = notifies_per_epoch(notifier) if notifier is not None and is_notifier(notifier) else None
        sites.append(WaitSite(node, operand(node, node.opdef.wait_operand), notifier, node.attrs.get("epoch", dim(1)),
                              node.attrs["expected"], per_epoch))
    return sites


def check_signals(g) -> Iterator[VerifyError]:
    """Each wait's window has one cell per rank; its notifier exists, notifies the same window, and
    expected = epoch × the notifier's per-epoch count."""
    env: Mapping[str, int] = g.env
    ranks = dim(g.attributes.get("ranks", 1))
    for site in waits(g):
        node, name = site.node, site.node.attrs.get("notifier")
        cells = site.signal.type.shape[0]
        if cells.evaluate(env) != ranks:
            yield VerifyError(f"signal %{site.signal.name} has {cells} cells but the graph runs on {ranks} ranks",
                              node.where)
        if site.notifier is None:
            yield VerifyError(f"notifier '{name}' is not a node of this graph", node.where)
            continue
        if not is_notifier(site.notifier):
            yield VerifyError(f"notifier '{name}' ({site.notifier.op}) does not notify", node.where)
            continue
        if operand(site.notifier, site.notifier.opdef.notify_operand) is not site.signal:
            yield VerifyError(f"notifier '{name}' notifies a different window than %{site.signal.name}", node.where)
            continue
        if site.per_epoch is None:
            yield VerifyError(f"notifier '{name}' notifies per block but has no 'blocks'", node.where)
            continue
        want = (site.epoch * site.per_epoch).evaluate(env)
        if site.expected.evaluate(env) != want:
            yield VerifyError(f"expected = {site.expected} but epoch {site.epoch} × {site.per_epoch} notifies "
                              f"per epoch from '{name}' = {want}", node.where)


from ..verifier import register_graph_check  # noqa: E402  (registered once this module loads)

register_graph_check(check_signals)

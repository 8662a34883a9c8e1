"""INT32 signal counters of every rank's signal windows, and the checks that tie waits to their notifiers.

A notify from rank s adds its amount to cell[s] of the window on every peer rank (never on s itself); a wait on
rank r passes when every peer's cell on r is ≥ its expected count (dspark-model.md §5). Counters are monotonic
within a run and start at 0 (windows are allocated by the host before the run).

Epoch checks:
* static, before the run: a waiter's named notifier exists and notifies the same window, and
  `expected == epoch × (notifies per epoch of the notifier)` (the IR's link, re-checked on the task graph, which
  may come from a file); and `expected` is reachable at all: it is at most what every notifier of that window in
  the graph delivers to a peer cell in one run. An unreachable count (say an epoch-3 wait on a window this graph
  allocated) would spin forever; it is reported as an epoch mismatch rather than left to look like starvation.
* dynamic, when a wait passes: each peer's cell must hold at least one epoch of notifies from the *named*
  notifier. A wait that passes on notifies from some other notifier of the window (a barrier of the wrong epoch,
  a shared window) is an epoch mismatch even though the run goes on.
"""
from __future__ import annotations

from collections import defaultdict

from .adapter import NotifySpec, SimTask, WaitSpec
from .problems import Problem


def notifies_per_task(t: SimTask) -> int:
    """What one instance of notifier `t` adds to each peer cell over the whole task."""
    spec = t.notify
    if spec is None or spec.per == "none":
        return 0
    return spec.value * (t.blocks if spec.per == "block" else 1)


def static_checks(tasks: list[SimTask], ranks: int) -> list[Problem]:
    by_name = {t.name: t for t in tasks}
    delivered: dict[str, int] = defaultdict(int)
    for t in tasks:
        if t.notify is not None:
            delivered[t.notify.buffer] += notifies_per_task(t)
    problems = []
    for t in tasks:
        if t.wait is None:
            continue
        problems += _link(t, t.wait, by_name.get(t.wait.notifier))
        if ranks > 1 and t.wait.expected > delivered[t.wait.buffer]:
            problems.append(Problem(
                "epoch-mismatch", f"waits for %{t.wait.buffer} ≥ {t.wait.expected} (epoch {t.wait.epoch}) but the "
                f"notifiers of that window deliver {delivered[t.wait.buffer]} per peer in this graph: it can never "
                f"pass", t.name))
    return problems


def _link(t: SimTask, wait: WaitSpec, notifier: SimTask | None) -> list[Problem]:
    if notifier is None:
        return [Problem("signal-link", f"notifier '{wait.notifier}' is not a task of this graph", t.name)]
    if notifier.notify is None or notifier.notify.buffer != wait.buffer:
        return [Problem("signal-link", f"notifier '{wait.notifier}' does not notify %{wait.buffer}", t.name)]
    per_epoch = notifies_per_task(notifier)
    if wait.expected != wait.epoch * per_epoch:
        return [Problem("epoch-mismatch", f"expected = {wait.expected} but epoch {wait.epoch} × {per_epoch} "
                        f"notifies per epoch from '{wait.notifier}' = {wait.epoch * per_epoch}", t.name)]
    return []


class Counters:
    """cell values per (rank, window) and, for the epoch check, who contributed them."""

    def __init__(self, ranks: int):
        self.ranks = ranks
        self.cells: dict[tuple[int, str], list[int]] = defaultdict(lambda: [0] * ranks)
        self.by: dict[tuple[int, str, int], dict[str, int]] = defaultdict(lambda: defaultdict(int))

    def notify(self, src: int, spec: NotifySpec, amount: int, who: str) -> None:
        for dst in range(self.ranks):
            if dst == src or amount == 0:
                continue
            self.cells[(dst, spec.buffer)][src] += amount
            self.by[(dst, spec.buffer, src)][who] += amount

    def short(self, rank: int, wait: WaitSpec) -> list[tuple[int, int]]:
        """(peer, cell value) of every peer whose cell on `rank` is still below the expected count."""
        cells = self.cells[(rank, wait.buffer)]
        return [(p, cells[p]) for p in range(self.ranks) if p != rank and cells[p] < wait.expected]

    def satisfied(self, rank: int, wait: WaitSpec) -> bool:
        return not self.short(rank, wait)

    def epoch_check(self, rank: int, t: SimTask, per_epoch: int, step: int) -> Problem | None:
        """At a pass: every peer delivered at least one epoch of notifies from the named notifier."""
        wait = t.wait
        if per_epoch <= 0:
            return None
        for p in range(self.ranks):
            got = self.by[(rank, wait.buffer, p)].get(wait.notifier, 0)
            if p != rank and got < per_epoch:
                cell = self.cells[(rank, wait.buffer)][p]
                others = {k: v for k, v in self.by[(rank, wait.buffer, p)].items() if k != wait.notifier}
                return Problem("epoch-mismatch", f"passed on %{wait.buffer} cell[{p}] = {cell} ≥ {wait.expected} "
                               f"(epoch {wait.epoch}) with {got} notifies from '{wait.notifier}' on rank {p} "
                               f"(one epoch is {per_epoch}); the rest came from {_names(others)}",
                               t.name, rank, step)
        return None


def _names(contrib: dict[str, int]) -> str:
    return ", ".join(f"'{k}' ({v})" for k, v in sorted(contrib.items())) or "nobody"

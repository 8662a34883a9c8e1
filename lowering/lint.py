"""Dependency lint: do the explicit task deps cover every hazard and every declared ordering?

From the tasks' read/write regions alone (never from how the deps were built) it computes every RAW,
WAR and WAW hazard in submission order and checks that a path of explicit deps leads from the first
task to the second (coverage up to transitivity). A hazard without such a path is a race. Declared
orderings (the IR's `deps(...)`, token operands, join inputs) must be covered the same way: TensorMap
cannot see them (remote writes, scheduling edges). It also reports edges that other paths already
imply, and deps on later tasks (no valid submission order).

Across ranks (a task graph of more than one rank), where the regions alone cannot tell:
* remote-race (error): a task reads data a one-sided collective (`put`, MoE dispatch_push / combine: an op that
  updates a window in place) writes on the *peer* ranks, but no wait announcing those writes (a waiter whose
  `notifier` is that collective, or a barrier declared after it) is on a dependency path before the read. A
  local path only orders the read after this rank's instance of the writer.
* unanchored-wait (warning): a waiter is not ordered after its own rank's notifier by anything but the signal
  window (which TensorMap does not track): spinning, it can hold the cores that notifier still needs.
Warnings that do not fail the lint: redundant edges, duplicate dep entries, edges that order nothing (no
hazard between the two tasks and no declared ordering), and order-dependent accumulations (atomic split tasks:
their bits depend on the order the splits land in, splitk.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Mapping, Sequence

from .hazards import Hazard, ancestors, find_hazards
from .splitk import order_dependent, split_count
from .taskgraph import Task, TaskGraph

WARNINGS = ("redundant", "duplicate", "orders-nothing", "unanchored-wait", "order-dependent")


@dataclass(frozen=True)
class LintIssue:
    kind: str          # race | remote-race | missing-order | backward-dep | unknown-dep (errors), WARNINGS
    first: int
    second: int
    message: str
    buffer: str = ""

    @property
    def is_error(self) -> bool:
        return self.kind not in WARNINGS

    def __str__(self) -> str:
        return f"{self.kind}: {self.message}"


@dataclass
class LintReport:
    issues: list[LintIssue] = field(default_factory=list)
    hazards: int = 0
    edges: int = 0

    @property
    def errors(self) -> list[LintIssue]:
        return [i for i in self.issues if i.is_error]

    @property
    def races(self) -> list[LintIssue]:
        return [i for i in self.issues if i.kind == "race"]

    @property
    def redundant(self) -> list[LintIssue]:
        return [i for i in self.issues if i.kind == "redundant"]

    @property
    def ok(self) -> bool:
        return not self.errors

    def count(self, kind: str) -> int:
        return sum(1 for i in self.issues if i.kind == kind)

    def summary(self) -> str:
        extra = [f"{n} {what}" for kind, what in (("duplicate", "duplicate dep entries"),
                                                  ("orders-nothing", "edges that order nothing"),
                                                  ("unanchored-wait", "unanchored waits"),
                                                  ("order-dependent", "order-dependent accumulations"))
                 if (n := self.count(kind))]
        return (f"{self.hazards} hazards, {self.edges} edges: {len(self.races)} races, "
                f"{len(self.errors) - len(self.races)} other errors, {len(self.redundant)} redundant edges"
                + "".join(f", {e}" for e in extra))

    def __iter__(self) -> Iterator[LintIssue]:
        return iter(self.issues)


def lint(tg: TaskGraph | Sequence[Task], deps: Mapping[int, Sequence[int]] | None = None) -> LintReport:
    """Check `deps` (default: the tasks' own) against the hazards of the tasks' regions."""
    from dspark_ir.gctools import paused_gc

    with paused_gc():     # no result depends on it; with the graphs alive, each collection walks them all
        return _lint(tg, deps)


def _lint(tg: TaskGraph | Sequence[Task], deps: Mapping[int, Sequence[int]] | None) -> LintReport:
    tasks = list(tg.tasks if isinstance(tg, TaskGraph) else tg)
    n = len(tasks)
    deps = {t.id: list(t.deps) for t in tasks} if deps is None else {k: list(v) for k, v in deps.items()}
    report = LintReport(edges=sum(len(v) for v in deps.values()))
    clean: dict[int, list[int]] = {}
    for j in range(n):
        clean[j] = []
        listed = list(deps.get(j, ()))
        for d in sorted({d for d in listed if listed.count(d) > 1}):
            report.issues.append(LintIssue("duplicate", d, j, f"{tasks[j].label()} lists its dep on task {d} "
                                           f"{listed.count(d)} times"))
        for d in dict.fromkeys(listed):
            if not 0 <= d < n:
                report.issues.append(LintIssue("unknown-dep", d, j, f"{tasks[j].label()} depends on unknown task {d}"))
            elif d >= j:
                report.issues.append(LintIssue("backward-dep", d, j, f"{tasks[j].label()} depends on "
                                               f"{tasks[d].label()}, which is submitted later"))
            else:
                clean[j].append(d)
    anc = ancestors(n, clean)
    hazards = find_hazards(tasks)
    report.hazards = len(hazards)
    reported: set[tuple[int, int]] = set()
    for h in hazards:
        if not anc[h.second] >> h.first & 1 and (h.first, h.second) not in reported:
            reported.add((h.first, h.second))
            report.issues.append(LintIssue("race", h.first, h.second, _race_message(h, tasks), h.buffer))
    for t in tasks:
        for d in t.declared:
            if d < t.id and not anc[t.id] >> d & 1:
                report.issues.append(LintIssue(
                    "missing-order", d, t.id,
                    f"{t.label()} is declared (deps/token/join) to run after {tasks[d].label()}, "
                    "but no dependency path orders them"))
    reasons = {(h.first, h.second) for h in hazards}
    for j in range(n):
        for d in clean[j]:
            via = [e for e in clean[j] if e != d and (anc[e] >> d & 1)]
            if via:
                report.issues.append(LintIssue(
                    "redundant", d, j, f"edge {d} -> {j} ({tasks[d].name} -> {tasks[j].name}) is implied by "
                    f"the path through task {via[0]} '{tasks[via[0]].name}'"))
            elif (d, j) not in reasons and d not in tasks[j].declared:
                report.issues.append(LintIssue(
                    "orders-nothing", d, j, f"edge {d} -> {j} ({tasks[d].name} -> {tasks[j].name}) orders nothing: "
                    "no hazard between the two tasks and no declared ordering"))
    for t in order_dependent(tasks):
        report.issues.append(LintIssue("order-dependent", t.id, t.id, f"{t.label()} accumulates "
                                       f"{split_count(t)} splits atomically: not bitwise across schedules"))
    if isinstance(tg, TaskGraph) and tg.ranks > 1:
        report.issues += _cross_rank(tasks, hazards, anc)
    return report


def _cross_rank(tasks: Sequence[Task], hazards: Sequence[Hazard], anc: list[int]) -> list[LintIssue]:
    """remote-race and unanchored-wait (module docstring)."""
    by_name = {t.name: t for t in tasks}
    waiters = [t for t in tasks if "notifier" in t.attrs and _signal_operand(t, "wait_operand") is not None]
    windows = {b for t in tasks for b in (_signal_operand(t, "wait_operand"), _signal_operand(t, "notify_operand"))
               if b is not None}
    waiting = {w.id for w in waiters}
    announcers: dict[int, list[Task]] = {}   # task id → the waits naming it as their notifier or declared after it
    for w in waiters:
        notifier = by_name.get(w.attrs["notifier"]) if isinstance(w.attrs["notifier"], str) else None
        for announced in dict.fromkeys([*([notifier.id] if notifier is not None else []), *w.declared]):
            announcers.setdefault(announced, []).append(w)
    issues: list[LintIssue] = []
    reported: set[tuple[int, int]] = set()
    for h in hazards:
        writer, reader = tasks[h.first], tasks[h.second]
        if h.kind != "raw" or h.buffer in windows or not _writes_remotely(writer) or reader.id in waiting:
            continue
        announcing = announcers.get(writer.id, [])
        if any(w.id == reader.id or anc[reader.id] >> w.id & 1 for w in announcing) or \
                (writer.id, reader.id) in reported:
            continue
        reported.add((writer.id, reader.id))
        names = ", ".join(f"'{w.name}'" for w in announcing)
        issues.append(LintIssue(
            "remote-race", writer.id, reader.id,
            f"{reader.label()} reads %{h.buffer}, which {writer.label()} writes on the peer ranks, but "
            + (f"no wait announcing those writes ({names}) is ordered before it" if announcing
               else "no wait announces those writes") + ": another rank's writes may not have landed", h.buffer))
    data_anc: list[int] | None = None
    for w in waiters:
        notifier = by_name.get(str(w.attrs.get("notifier")))
        if notifier is None or notifier.id >= w.id:
            continue
        if data_anc is None:
            data_anc = _data_ancestors(tasks, hazards, windows)
        if not data_anc[w.id] >> notifier.id & 1:
            issues.append(LintIssue(
                "unanchored-wait", notifier.id, w.id,
                f"{w.label()} waits for '{notifier.name}' on the peer ranks but only its signal window orders it "
                f"after its own rank's '{notifier.name}' (TensorMap does not track it): spinning, it can hold "
                "the cores that notifier still needs"))
    return issues


def _signal_operand(t: Task, which: str) -> str | None:
    """The buffer of a signal op's notify/wait operand (None: not such an op)."""
    from dspark_ir.ops import get_op

    if t.is_dummy:
        return None
    opdef = get_op(t.op)
    name = getattr(opdef, which, None)
    if name is None:
        return None
    index = [o.lstrip("*") for o in opdef.operands].index(name)
    return next((a.view.buffer for a in t.args if a.index == index and a.direction in ("in", "inout")), None)


def _writes_remotely(t: Task) -> bool:
    """A one-sided collective: it updates a window in place on the peer ranks."""
    from dspark_ir.ops import get_op

    return t.collective and not t.is_dummy and bool(getattr(get_op(t.op), "aliases", None))


def _data_ancestors(tasks: Sequence[Task], hazards: Sequence[Hazard], windows: set[str]) -> list[int]:
    """Per task, its ancestors through declared edges and hazards off the signal windows (what TensorMap sees),
    as bitmasks; every such edge goes to a later task, so one sweep gives them all."""
    preds: dict[int, set[int]] = {t.id: set(d for d in t.declared if d < t.id) for t in tasks}
    for h in hazards:
        if h.buffer not in windows:
            preds[h.second].add(h.first)
    return ancestors(len(tasks), preds)


def _race_message(h: Hazard, tasks: Sequence[Task]) -> str:
    return f"{h.describe(tasks)}, but no dependency path orders them"


def mutation_check(tg: TaskGraph) -> list[tuple[int, int]]:
    """Delete each explicit edge in turn; return the edges whose deletion the lint did NOT flag."""
    base = tg.deps_map()
    unflagged = []
    for j, ds in base.items():
        for d in ds:
            mutated = dict(base)
            mutated[j] = [x for x in ds if x != d]
            if lint(tg, mutated).ok:
                unflagged.append((d, j))
    return unflagged

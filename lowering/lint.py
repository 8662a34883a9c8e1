"""Dependency lint: do the explicit task deps cover every hazard and every declared ordering?

From the tasks' read/write regions alone (never from how the deps were built) it computes every RAW,
WAR and WAW hazard in submission order and checks that a path of explicit deps leads from the first
task to the second (coverage up to transitivity). A hazard without such a path is a race. Declared
orderings (the IR's `deps(...)`, token operands, join inputs) must be covered the same way: TensorMap
cannot see them (remote writes, scheduling edges). It also reports edges that other paths already
imply, and deps on later tasks (no valid submission order).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterator, Mapping, Sequence

from .hazards import Hazard, ancestors, find_hazards
from .taskgraph import Task, TaskGraph


@dataclass(frozen=True)
class LintIssue:
    kind: str          # race | missing-order | backward-dep | unknown-dep | redundant
    first: int
    second: int
    message: str
    buffer: str = ""

    @property
    def is_error(self) -> bool:
        return self.kind != "redundant"

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

    def summary(self) -> str:
        return (f"{self.hazards} hazards, {self.edges} edges: {len(self.races)} races, "
                f"{len(self.errors) - len(self.races)} other errors, {len(self.redundant)} redundant edges")

    def __iter__(self) -> Iterator[LintIssue]:
        return iter(self.issues)


def lint(tg: TaskGraph | Sequence[Task], deps: Mapping[int, Sequence[int]] | None = None) -> LintReport:
    """Check `deps` (default: the tasks' own) against the hazards of the tasks' regions."""
    tasks = list(tg.tasks if isinstance(tg, TaskGraph) else tg)
    n = len(tasks)
    deps = {t.id: list(t.deps) for t in tasks} if deps is None else {k: list(v) for k, v in deps.items()}
    report = LintReport(edges=sum(len(v) for v in deps.values()))
    clean: dict[int, list[int]] = {}
    for j in range(n):
        clean[j] = []
        for d in deps.get(j, ()):
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
    for j in range(n):
        for d in clean[j]:
            via = [e for e in clean[j] if e != d and (anc[e] >> d & 1)]
            if via:
                report.issues.append(LintIssue(
                    "redundant", d, j, f"edge {d} -> {j} ({tasks[d].name} -> {tasks[j].name}) is implied by "
                    f"the path through task {via[0]} '{tasks[via[0]].name}'"))
    return report


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

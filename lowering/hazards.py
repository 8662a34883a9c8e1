"""Buffer hazards between tasks, and transitive reduction of the dependency edges.

Submission order is the sequential meaning of a task graph: task j must observe every effect of the
tasks before it on the storage it touches. For i < j, an overlapping pair of accesses is
  RAW  i writes, j reads        WAW  i writes, j writes        WAR  i reads, j writes.
Unlike pypto's TensorMap, all three are derived, and regions are compared element for element across
reshaped and sliced views of one buffer.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

import networkx as nx

from .regions import Region, View
from .taskgraph import Task


@dataclass(frozen=True)
class Hazard:
    first: int
    second: int
    kind: str        # raw | war | waw
    buffer: str
    first_param: str
    second_param: str

    def describe(self, tasks: Sequence[Task]) -> str:
        a, b = tasks[self.first], tasks[self.second]
        verb = {"raw": ("writes", "reads"), "war": ("reads", "writes"), "waw": ("writes", "writes")}[self.kind]
        return (f"{a.label()} {verb[0]} buffer %{self.buffer} (as {self.first_param}) and {b.label()} "
                f"{verb[1]} it (as {self.second_param}): {self.kind.upper()}")


def hazard_kind(first_writes: bool, second_writes: bool) -> str | None:
    if first_writes:
        return "waw" if second_writes else "raw"
    return "war" if second_writes else None


def find_hazards(tasks: Sequence[Task]) -> list[Hazard]:
    """Every conflicting pair of accesses, one Hazard per (first, second, kind, buffer)."""
    accesses: dict[str, list[tuple[int, Region, bool, str]]] = {}
    writes_of: dict[str, list[tuple[int, Region, bool, str]]] = {}   # the writing ones: all a read can meet
    seen: set[tuple[int, int, str, str]] = set()
    found: list[Hazard] = []
    regions: dict[int, Region] = {}          # id(view) → its region: many arguments share a view
    for task in tasks:
        mine = [(_region(a.view, regions), a.direction in ("out", "inout"), a.param, a.direction in ("in", "inout"))
                for a in task.args]                   # (region, writes, param, reads): Arg.writes, Arg.reads
        for region, writes, param, reads in mine:
            earlier = accesses if writes else writes_of      # a read conflicts with writes only
            for other_id, other_region, other_writes, other_param in earlier.get(region.buffer, ()):
                kinds = [hazard_kind(other_writes, writes)]
                if writes and reads and other_writes:  # an inout after a write is RAW and WAW
                    kinds = ["raw", "waw"]
                for kind in kinds:
                    key = (other_id, task.id, kind, region.buffer)
                    if kind is None or key in seen or not region.overlaps(other_region):
                        continue
                    seen.add(key)
                    found.append(Hazard(other_id, task.id, kind, region.buffer, other_param, param))
        for region, writes, param, _ in mine:
            accesses.setdefault(region.buffer, []).append((task.id, region, writes, param))
            if writes:
                writes_of.setdefault(region.buffer, []).append((task.id, region, writes, param))
    return found


def _region(view: View, known: dict[int, Region]) -> Region:
    region = known.get(id(view))           # the tasks keep their views alive: an id stays its view's
    if region is None:
        region = known[id(view)] = view.region()
    return region


def transitive_reduction(n: int, edges: Iterable[tuple[int, int]]) -> set[tuple[int, int]]:
    """The minimal edge set with the same reachability (edges must go from lower to higher ids).

    The same edges as networkx's transitive_reduction (unique for a DAG): an edge d → j is redundant
    exactly when d is an ancestor of another direct predecessor of j. Ancestor sets are int bitmasks,
    so this is O(E) big-int operations instead of a DFS per node."""
    preds: dict[int, set[int]] = {}
    for d, j in edges:
        if not (0 <= d < j < n):
            return _nx_transitive_reduction(n, edges)      # not id-ordered: the general algorithm
        preds.setdefault(j, set()).add(d)
    anc = ancestors(n, preds)
    kept: set[tuple[int, int]] = set()
    for j, ps in preds.items():
        covered = 0
        for p in ps:
            covered |= anc[p]
        kept.update((d, j) for d in ps if not (covered >> d) & 1)
    return kept


def _nx_transitive_reduction(n: int, edges: Iterable[tuple[int, int]]) -> set[tuple[int, int]]:
    g = nx.DiGraph()
    g.add_nodes_from(range(n))
    g.add_edges_from(edges)
    return set(nx.transitive_reduction(g).edges())


def ancestors(n: int, deps: Mapping[int, Iterable[int]]) -> list[int]:
    """Ancestor sets as int bitmasks, assuming every dep points to a lower id."""
    anc = [0] * n
    for j in range(n):
        mask = 0
        for d in deps.get(j, ()):
            mask |= anc[d] | (1 << d)
        anc[j] = mask
    return anc

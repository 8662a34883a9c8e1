"""Explain a deadlock: the wait-for graph of the stuck instances and its shortest cycle.

Nodes are instances (rank, task). An instance that is not done waits for
* spinning waiter  → the named notifier on every peer rank whose cell is still short;
* rendezvous block → the same task on every rank that has not arrived;
* parked block     → its deps that are not done (an early-dispatched AER block holds its cores meanwhile);
* not dispatchable → its deps that are not done (or, for AER, not resolved);
* dispatchable but no free core → the instances holding the cores of the kind it lacks.
The report is the shortest cycle through a spinning waiter (else through any core holder, else any cycle): which
task on which rank holds which cores waiting for which notifier that cannot get a core. Runs of "needs its dep"
hops print as one line.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import networkx as nx

from .cores import NEEDS, describe_need

Node = tuple[int, int]   # (rank, task id)


@dataclass(frozen=True)
class Hop:
    rank: int
    task: str
    task_id: int
    kind: str        # spin | rendezvous | parked | blocked | no-core
    text: str        # what this instance is doing and what it waits for


@dataclass
class Deadlock:
    step: int
    ranks: int
    cube: int
    vector: int
    cycle: list[Hop] = field(default_factory=list)
    held: dict[int, list[str]] = field(default_factory=dict)     # rank → "aic0 aiv0 aiv1: 'task' spinning"
    stuck: int = 0                                              # instances not done

    @property
    def waiters(self) -> list[Hop]:
        return [h for h in self.cycle if h.kind == "spin"]

    def format(self) -> str:
        lines = [f"deadlock at step {self.step}: {self.stuck} task instances on {self.ranks} rank(s) cannot finish "
                 f"({self.cube} cube + {self.vector} vector cores per rank); nothing is running"]
        if self.cycle:
            lines.append(f"wait-for cycle ({len(self.cycle)} hops):")
            lines += [f"  rank {h.rank}: {h.text}" for h in self.cycle]
            lines.append(f"  ... and rank {self.cycle[0].rank} '{self.cycle[0].task}' again")
        else:
            lines.append("no wait-for cycle: a waiter spins for notifies that no remaining task will send")
        lines.append("held cores:")
        for rank in sorted(self.held):
            for entry in self.held[rank]:
                lines.append(f"  rank {rank}: {entry}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.format()


def explain(engine) -> Deadlock:
    graph = nx.DiGraph()
    nodes: dict[Node, tuple[str, str]] = {}
    for row in engine.inst:
        for i in row:
            if i.state != "done":
                _edges(engine, i, graph, nodes)
    report = Deadlock(engine.now, engine.ranks, engine.config.cube, engine.config.vector,
                      held=_held(engine), stuck=sum(i.state != "done" for row in engine.inst for i in row))
    cycle = _shortest_cycle(graph, nodes)
    report.cycle = _hops(engine, graph, nodes, cycle)
    return report


# ---- the wait-for graph ------------------------------------------------------------------------------------------
def _edges(engine, i, graph: nx.DiGraph, nodes: dict) -> None:
    me: Node = (i.rank, i.task.id)
    t = i.task
    for b in i.blocks:
        cores = " ".join(b.cores)
        if b.phase == "spinning":
            short = engine.counters.short(i.rank, t.wait)
            cells = _cells(short)
            nodes[me] = ("spin", f"{t.label} holds {cores}, spinning since step {b.since} on %{t.wait.buffer} "
                                 f"({cells} < {t.wait.expected})")
            notifier = _task_id(engine, t.wait.notifier)
            for p, _ in short:
                if notifier is not None and engine.inst[p][notifier].state != "done":
                    graph.add_edge(me, (p, notifier), why=f"waits for '{t.wait.notifier}' on rank {p} to notify")
            return
        if b.phase == "arrived":
            missing = [r for r in range(engine.ranks) if r not in engine.arrived.get(t.id, set())]
            nodes[me] = ("rendezvous", f"{t.label} holds {cores} until every rank arrives (missing: "
                                       f"rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))})")
            for p in missing:
                graph.add_edge(me, (p, t.id), why=f"waits for '{t.name}' to start on rank {p}")
            return
        if b.phase == "parked":
            nodes[me] = ("parked", f"{t.label} holds {cores}, parked (early resolve) until its deps complete")
            for d in t.deps:
                if not engine._done(i.rank, d):
                    graph.add_edge(me, (i.rank, d), why=f"needs '{engine.tasks[d].name}'")
            return
    if i.state == "waiting":
        check = engine._resolved if t.aer else engine._done
        pending = [d for d in t.explicit if not engine._done(i.rank, d)] + \
                  [d for d in t.inferred if not check(i.rank, d)]
        nodes[me] = ("blocked", f"{t.label} is not dispatched")
        for d in pending:
            graph.add_edge(me, (i.rank, d), why=f"needs '{engine.tasks[d].name}'")
        return
    if i.todo > 0:
        pool = engine.pools[i.rank]
        short = [k for k, n in NEEDS[t.core].items() if len(pool.free[k]) < n]
        holders = _holders(engine, i.rank, short)
        who = "; ".join(f"{' '.join(c)} by '{engine.tasks[tid].name}'" for tid, c in holders.items())
        nodes[me] = ("no-core", f"{t.label} cannot get {describe_need(t.core)}: held ({who})")
        for tid in holders:
            if tid != t.id:
                graph.add_edge(me, (i.rank, tid), why="holds the cores it needs")


def _cells(short: list[tuple[int, int]]) -> str:
    """`cell[1] = 0`, or for many peers `cells[0-3, 5-15] = 0`, grouped by value."""
    by_value: dict[int, list[int]] = {}
    for peer, value in short:
        by_value.setdefault(value, []).append(peer)
    parts = []
    for value, peers in sorted(by_value.items()):
        if len(peers) <= 2:
            parts += [f"cell[{p}] = {value}" for p in peers]
        else:
            parts.append(f"cells[{_ranges(peers)}] = {value}")
    return ", ".join(parts)


def _ranges(ids: list[int]) -> str:
    runs: list[list[int]] = []
    for k in sorted(ids):
        if runs and k == runs[-1][1] + 1:
            runs[-1][1] = k
        else:
            runs.append([k, k])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs)


def _holders(engine, rank: int, kinds: list[str]) -> dict[int, list[str]]:
    prefixes = tuple("aic" if k == "cube" else "aiv" for k in kinds)
    out: dict[int, list[str]] = {}
    for i in engine.inst[rank]:
        for b in i.blocks:
            cores = [c for c in b.cores if c.startswith(prefixes)]
            if cores:
                out.setdefault(i.task.id, []).extend(cores)
    return out


def _task_id(engine, name: str) -> int | None:
    return next((t.id for t in engine.tasks if t.name == name), None)


def _held(engine) -> dict[int, list[str]]:
    held: dict[int, list[str]] = {}
    for r, row in enumerate(engine.inst):
        for i in row:
            for b in i.blocks:
                held.setdefault(r, []).append(f"{' '.join(b.cores)}: {i.task.label} {b.phase} since step {b.since}")
    return held


# ---- the cycle ---------------------------------------------------------------------------------------------------
def _shortest_cycle(graph: nx.DiGraph, nodes: dict) -> list[Node]:
    for kinds in (("spin",), ("spin", "rendezvous", "parked"), None):
        starts = sorted(n for n in graph if kinds is None or nodes.get(n, ("",))[0] in kinds)
        best: list[Node] = []
        for u in starts:
            for v in sorted(graph.successors(u)):
                try:
                    path = nx.shortest_path(graph, v, u)
                except nx.NetworkXNoPath:
                    continue
                if not best or len(path) < len(best):
                    best = [u] + path[:-1]
        if best:
            return _rotate(best, nodes)
    return []


def _rotate(cycle: list[Node], nodes: dict) -> list[Node]:
    """Start the cycle at a spinning waiter (lowest rank first), else at a core holder, so it reads as "who holds
    what, waiting for whom"."""
    for kinds in (("spin",), ("rendezvous", "parked"), None):
        starts = [k for k, n in enumerate(cycle) if kinds is None or nodes.get(n, ("",))[0] in kinds]
        if starts:
            start = min(starts, key=lambda k: cycle[k])
            return cycle[start:] + cycle[:start]
    return cycle


def _hops(engine, graph: nx.DiGraph, nodes: dict, cycle: list[Node]) -> list[Hop]:
    hops: list[Hop] = []
    k = 0
    while k < len(cycle):
        node = cycle[k]
        kind, text = nodes.get(node, ("blocked", engine.inst[node[0]][node[1]].task.label))
        if kind == "blocked":
            chain = [node]
            while k + 1 < len(cycle) and nodes.get(cycle[k + 1], ("",))[0] == "blocked":
                k += 1
                chain.append(cycle[k])
            nxt = cycle[(k + 1) % len(cycle)]
            names = [f"'{engine.tasks[n[1]].name}'" for n in chain[1:]] + [f"'{engine.tasks[nxt[1]].name}'"]
            text = f"{text}: it waits for its deps {' → '.join(names)}"
        else:
            nxt = cycle[(k + 1) % len(cycle)]
            why = graph.edges[node, nxt]["why"] if graph.has_edge(node, nxt) else ""
            if kind != "no-core" and why:
                text = f"{text}; it {why}"
        hops.append(Hop(node[0], engine.tasks[node[1]].name, node[1], kind, text))
        k += 1
    return hops

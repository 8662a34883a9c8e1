"""Values: the numpy references run as the simulated tasks complete, one memory per rank (the numpy executor's
memory model: flat buffers, strided views, poisoned local buffers).

* A local task runs its reference on its rank's memory when its instance completes.
* A collective task (its reference takes every rank's operands) runs once, when every rank's instance has reached
  its *publish point*: its start for a rendezvous collective and for a notify-then-wait task (a barrier,
  dispatch_meta: the payload is put before the notify), its completion for a one-sided put / notifier and for a
  pure wait. Each rank's read-only operands are snapshotted when its instance starts (later local writes must
  not leak in); in-place operands (windows, signal cells) are read at the publish time. The results are written
  into every rank's memory then: that is when the remote writes *land*.
* Landing is tracked with or without memories: a task whose RAW producer is a collective that has not landed yet
  reads remote data no rank has written yet (`remote-read`), whatever the values are.
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Mapping, Sequence

from .adapter import (
    Memory,
    SimTask,
    TaskGraph,
    kernel_attrs,
    operand_arrays,
    reference_of,
    signal_buffers,
    store_results,
    store_side_effects,
)
from .problems import Problem


def publishes_at_start(t: SimTask) -> bool:
    return t.comm == "rendezvous" or (t.wait is not None and t.notify is not None)


class Values:
    def __init__(self, tg: TaskGraph, tasks: list[SimTask], ranks: int, inputs: Any = None):
        self.tasks = tasks
        self.ranks = ranks
        self.signals = signal_buffers(tasks)
        self.mems: list[Memory] | None = None
        if inputs is not None:
            per_rank = [inputs] if isinstance(inputs, Mapping) else list(inputs)
            if len(per_rank) != ranks:
                from .adapter import SimError

                raise SimError(f"the task graph runs on {ranks} ranks, got inputs for {len(per_rank)}")
            self.mems = [Memory(tg, r) for r in per_rank]
        self.snapshots: dict[int, dict[int, list]] = defaultdict(dict)
        self.published: dict[int, set[int]] = defaultdict(set)
        self.landed: set[int] = set()
        self.problems: list[Problem] = []

    @property
    def computing(self) -> bool:
        return self.mems is not None

    # ---- hooks called by the engine ------------------------------------------------------------------------
    def host(self, t: SimTask) -> None:
        """A host allocation: computed on every rank before the run."""
        for r in range(self.ranks):
            self._local(t, r, 0)
        self.landed.add(t.id)

    def on_start(self, t: SimTask, rank: int, step: int) -> None:
        self._check_reads(t, rank, step)
        if t.comm == "local":
            return
        if self.computing:
            self.snapshots[t.id][rank] = self._operands(t, rank, readonly_only=True)
        if publishes_at_start(t):
            self._publish(t, rank, step)

    def on_complete(self, t: SimTask, rank: int, step: int) -> None:
        if t.role == "dummy":
            return
        if t.comm == "local":
            self._local(t, rank, step)
        elif not publishes_at_start(t):
            self._publish(t, rank, step)

    def outputs(self) -> list[dict] | None:
        return None if self.mems is None else [m.outputs() for m in self.mems]

    # ---- internals -----------------------------------------------------------------------------------------
    def _check_reads(self, t: SimTask, rank: int, step: int) -> None:
        for producer, buffer in t.raw:
            p = self.tasks[producer]
            if p.comm == "local" or producer in self.landed:
                continue
            missing = sorted(set(range(self.ranks)) - self.published[producer])
            waiters = [w for w in self.tasks if w.wait is not None]
            waits = [w.name for w in waiters if w.wait.notifier == p.name] or \
                [w.name for w in waiters if producer in w.explicit]       # a barrier gated on the producer
            after = f"; the wait{'s' if len(waits) > 1 else ''} announcing them: " + \
                ", ".join(f"'{w}'" for w in waits) if waits else "; no wait announces them"
            self.problems.append(Problem(
                "remote-read", f"reads %{buffer} before the remote writes of '{p.name}' landed "
                f"(not yet done on rank{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))}){after}",
                t.name, rank, step))

    def _publish(self, t: SimTask, rank: int, step: int) -> None:
        self.published[t.id].add(rank)
        if len(self.published[t.id]) < self.ranks:
            return
        self.landed.add(t.id)
        if not self.computing:
            return
        per_rank = []
        for r in range(self.ranks):
            live = self._operands(t, r, readonly_only=False)
            snap = self.snapshots[t.id].get(r, live)
            per_rank.append([s if self._readonly(t, i) else v for i, (s, v) in enumerate(zip(snap, live))])
        self.snapshots.pop(t.id, None)
        self._call(t, per_rank, list(range(self.ranks)), step, collective=True)

    def _local(self, t: SimTask, rank: int, step: int) -> None:
        if self.computing and t.task is not None:
            self._call(t, [self._operands(t, rank, readonly_only=False)], [rank], step, collective=False)

    def _operands(self, t: SimTask, rank: int, readonly_only: bool) -> list:
        ops = operand_arrays(t.task, self.mems[rank])
        if readonly_only:
            return [v if self._readonly(t, i) else None for i, v in enumerate(ops)]
        return ops

    def _call(self, t: SimTask, per_rank: Sequence[list], ranks: list[int], step: int, collective: bool) -> None:
        task = t.task
        fn = reference_of(task)
        attrs = kernel_attrs(task)
        try:
            if collective:
                results = fn([list(ops) for ops in per_rank], ranks=self.ranks, **attrs)
            else:
                results = [fn(*per_rank[0], **attrs)]
            for r, ops, out in zip(ranks, per_rank, results):
                store_results(task, self.mems[r], out)
                store_side_effects(task, self.mems[r], ops)
        except Exception as e:  # a reference failing is a finding of the run, not a crash of the simulator
            detail = getattr(e, "message", None) or f"{type(e).__name__}: {e}"
            self.problems.append(Problem("value", f"{task.op} reference failed: {detail}; values are no longer "
                                         "computed", t.name, ranks[0] if len(ranks) == 1 else None, step))
            self.mems = None

    def _readonly(self, t: SimTask, operand: int) -> bool:
        """An operand the task only reads, snapshotted at its start; signal windows are live state, never."""
        return any(a.index == operand and a.direction == "in" and a.view.buffer not in self.signals
                   for a in t.task.args)


# ---- static check: reads of data no task writes ------------------------------------------------------------------
def unwritten_reads(tg: TaskGraph, tasks: list[SimTask]) -> list[Problem]:
    """Reads of a local buffer's elements that no earlier task (in submission order, on any rank) writes."""
    written: dict[str, list[tuple[int, int]]] = defaultdict(list)
    problems = []
    for t in tasks:
        if t.task is None:
            continue
        seen = set()
        for a in t.task.args:
            buf = tg.buffers.get(a.view.buffer)
            if not a.reads or buf is None or buf.kind != "local" or (buf.name, a.view) in seen:
                continue
            seen.add((buf.name, a.view))
            missing = _uncovered(a.region().intervals, written[buf.name])
            if missing:
                problems.append(Problem("unwritten-read", f"reads {missing} element(s) of %{buf.name} "
                                        f"({a.view.label()}) that no task writes before it, on any rank", t.name))
        for a in t.task.args:
            if a.writes:
                written[a.view.buffer] = _merge(written[a.view.buffer] + list(a.region().intervals))
    return problems


def _merge(intervals: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[list[int]] = []
    for a, b in sorted(intervals):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return [(a, b) for a, b in out]


def _uncovered(wanted: Sequence[tuple[int, int]], have: Sequence[tuple[int, int]]) -> int:
    """How many elements of `wanted` no interval of `have` (merged, sorted) covers."""
    missing, j = 0, 0
    for a, b in wanted:
        pos = a
        while j < len(have) and have[j][1] <= pos:
            j += 1
        k = j
        while pos < b:
            if k >= len(have) or have[k][0] >= b:
                missing += b - pos
                break
            if have[k][0] > pos:
                missing += have[k][0] - pos
            pos = max(pos, have[k][1])
            k += 1
    return missing

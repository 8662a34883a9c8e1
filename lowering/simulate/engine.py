"""The discrete-event scheduler: every rank runs the same task graph on its own cores; time is in steps.

The model (exact; `lowering/simulate/__init__.py` summarises it for users)
--------------------------------------------------------------------------
Instances. Each task runs once per rank: instance (task, rank). Host tasks (`window`: the host driver's
`alloc_window_buffer`) are done before step 0; dummy tasks (joins) and zero-block tasks take no core and no time
and are done the moment their deps are; every other task has `blocks` SPMD blocks of one core kind (cores.py:
a cube block takes 1 AIC, a vector block 1 AIV, a mix block a core group = 1 AIC + 2 AIV at once).

Dependencies (adapter.py): explicit = the IR-declared edges (`deps(...)`, token operands, join inputs: pypto
`deps=`); inferred = RAW/WAR/WAW hazards of the tasks' buffer regions (what TensorMap infers), except hazards on
signal windows, which TensorMap never sees (`track_signal_windows` keeps them), and on host windows. A dep is
*done* when its instance on the same rank has completed, *resolved* once every block of it has been placed on a
core (or it is done).

Dispatch. An instance becomes dispatchable when
  * (no AER) all its explicit and inferred deps are done;
  * (AER, `aer = true`) all its explicit deps are done and all its inferred deps are resolved: early resolve lets
    a consumer be dispatched while the producers it depends on only through inferred hazards are still running,
    never before they hold cores (`early_resolve = "ignored"` drops that condition: the literal reading, under
    which consumers park ahead of unplaced producers and even the attention layers deadlock on small budgets).
When an instance becomes dispatchable it draws a priority from the seeded RNG (instances are visited rank by rank,
in task-id order, so the draws are reproducible); with `waiters_first` every waiter goes before every other task
(the adversarial order: a waiter grabs the cores its rank's notifier may still need). At every step, after the
completions of that step, each rank
serves its dispatchable instances in priority order: an instance places as many of its remaining blocks as its
core kind has free cores; a lower-priority instance may use cores a higher one cannot (backfill). A placed block
holds its cores until it completes.

Running. A block starts when all deps (explicit and inferred) of its instance are done: at once for a normal
dispatch; an early-dispatched AER block is *parked* on its cores until then. Once started:
  * compute block: completes `duration` steps later (1 by default), plus a draw in 0..`jitter` from a second
    seeded stream (default 0: no draw), so blocks, and with them the ranks, drift apart;
  * waiter (signal_wait, signal_barrier, moe_dispatch_meta): a notify-then-wait task first delivers its notify,
    then the block *spins*, holding its cores, until every peer's cell of its window on this rank is ≥ expected;
    it completes 1 step after the step at which that holds;
  * rendezvous collective (a collective that is neither notifier, waiter nor in-place put: o_group_a2a,
    window_copy_out, window_release, tp_o_reduce_scatter): the block holds its cores until the instance has
    started on every rank, then completes `duration` steps after the last arrival;
  * one-sided collective (put, dispatch_push, combine: update a window in place): like a compute block; its
    remote writes land when every rank's instance has completed (values.py).
Notifies: `notify_per = block` adds `value` to cell[my rank] of every peer's window as each block completes,
`task` when the last block completes (a notify-then-wait task: when it starts), `none` never.

Deadlock: a step at which nothing is due to complete (every placed block is parked, spinning or at a rendezvous)
while some instance is not done. The engine stops and deadlock.py explains it.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from dspark_ir.hardware import HARDWARE

from .adapter import SimError, SimTask, TaskGraph, buffer_bytes, sim_tasks
from .cores import CorePool, describe_need
from .problems import Problem
from .signals import Counters, notifies_per_task, static_checks
from .values import Values, unwritten_reads

WAITING, READY, DONE = "waiting", "ready", "done"


@dataclass(frozen=True)
class SimConfig:
    """Core budget per rank, the seed of the dispatch order, and the cost of a block."""

    cube: int = HARDWARE.cube_cores
    vector: int = HARDWARE.vector_cores
    seed: int = 0
    duration: Callable[[SimTask], int] | None = None    # steps per block (default 1)
    jitter: int = 0                                     # + a seeded draw in 0..jitter steps per block (ranks drift)
    waiters_first: bool = False                         # ready waiters take cores before other ready tasks
    track_signal_windows: bool = False                  # keep notifier→waiter window hazards as inferred deps
    early_resolve: str = "dispatched"                   # AER: inferred deps must be "dispatched" | "ignored"
    max_steps: int = 10_000_000
    max_blocks: int = 2_000_000                         # SPMD blocks over all ranks the engine agrees to simulate
    max_bytes: int = 4 << 30                            # buffer bytes over all ranks the values may allocate
    trace: bool = False                                 # record (step, rank, task, event, cores) events

    def __post_init__(self):
        if self.early_resolve not in ("dispatched", "ignored"):
            raise SimError(f"early_resolve must be 'dispatched' or 'ignored', got {self.early_resolve!r}")
        if self.cube < 0 or self.vector < 0:
            raise SimError(f"core counts must be >= 0, got {self.cube} cube and {self.vector} vector")
        if self.jitter < 0:
            raise SimError(f"jitter must be >= 0, got {self.jitter}")

    def steps(self, t: SimTask) -> int:
        return 1 if self.duration is None else max(1, int(self.duration(t)))


@dataclass(frozen=True)
class Event:
    step: int
    rank: int
    task: str
    event: str                      # dispatch | start | spin | arrive | finish | done
    cores: tuple[str, ...] = ()

    def __str__(self) -> str:
        cores = f" on {' '.join(self.cores)}" if self.cores else ""
        return f"step {self.step:>4}  rank {self.rank}  {self.event:<8} {self.task}{cores}"


@dataclass(eq=False)
class Block:
    inst: "Instance"
    cores: tuple[str, ...]
    phase: str = "parked"           # parked | running | spinning | arrived
    end: int | None = None
    since: int = 0


@dataclass(eq=False)
class Instance:
    task: SimTask
    rank: int
    state: str = WAITING
    priority: float = 0.0
    todo: int = 0                   # blocks not yet placed
    finished: int = 0
    started: bool = False
    blocks: list[Block] = field(default_factory=list)

    @property
    def label(self) -> str:
        return f"rank {self.rank} {self.task.label}"


class Engine:
    def __init__(self, tg: TaskGraph, config: SimConfig = SimConfig(), inputs: Any = None):
        self.tg = tg
        self.config = config
        self.ranks = max(int(tg.ranks), 1)
        self.tasks = sim_tasks(tg, track_signal_windows=config.track_signal_windows)
        self.rng = np.random.default_rng(config.seed)
        self.jitter = np.random.default_rng([config.seed, 1])      # its own stream: jitter 0 keeps the schedule
        self.pools = [CorePool(config.cube, config.vector) for _ in range(self.ranks)]
        self._check_budget()
        if inputs is not None:
            self._check_memory()
        self.inst = [[Instance(t, r, todo=t.blocks) for t in self.tasks] for r in range(self.ranks)]
        self.counters = Counters(self.ranks)
        self.values = Values(tg, self.tasks, self.ranks, inputs)
        self.problems: list[Problem] = static_checks(self.tasks, self.ranks) + unwritten_reads(tg, self.tasks)
        self.per_epoch = {t.id: self._per_epoch(t) for t in self.tasks if t.wait is not None}
        self.arrived: dict[int, set[int]] = {}
        self.heap: list[tuple[int, int, Block]] = []
        self._seq = 0
        self.now = 0
        self.makespan = 0
        self.trace: list[Event] | None = [] if config.trace else None
        self.busy = [{"cube": 0, "vector": 0} for _ in range(self.ranks)]     # core-steps spent computing
        self.held = [{"cube": 0, "vector": 0} for _ in range(self.ranks)]     # core-steps parked / spinning

    # ---- setup ---------------------------------------------------------------------------------------------
    def _check_budget(self) -> None:
        blocks = sum(t.blocks for t in self.tasks if t.core is not None) * self.ranks
        if blocks > self.config.max_blocks:
            raise SimError(f"{blocks} SPMD blocks over {self.ranks} rank(s) exceed the simulator's limit of "
                           f"{self.config.max_blocks} (simulate smaller extents)",
                           f"task graph '@{self.tg.name}'")
        for t in self.tasks:
            if t.core is not None and t.blocks > 0 and not self.pools[0].fits(t.core):
                raise SimError(f"{t.label} needs {describe_need(t.core)} but each rank has {self.config.cube} "
                               f"cube and {self.config.vector} vector cores")

    def _check_memory(self) -> None:
        need = buffer_bytes(self.tg) * self.ranks
        if need > self.config.max_bytes:
            raise SimError(f"computing values needs {need} bytes of buffers over {self.ranks} rank(s), more than "
                           f"the limit of {self.config.max_bytes} (simulate without inputs for timing only)",
                           f"task graph '@{self.tg.name}'")

    def _per_epoch(self, t: SimTask) -> int:
        notifier = next((n for n in self.tasks if n.name == t.wait.notifier), None)
        return 0 if notifier is None else notifies_per_task(notifier)

    # ---- the loop ------------------------------------------------------------------------------------------
    def run(self) -> bool:
        """Simulate to completion (True) or deadlock (False)."""
        for t in self.tasks:
            if t.role == "host":
                self.values.host(t)
                for r in range(self.ranks):
                    self._mark_done(self.inst[r][t.id])
        while True:
            self._settle()
            if all(i.state == DONE for row in self.inst for i in row):
                return True
            if not self.heap:
                return False
            when = self.heap[0][0]
            if when > self.config.max_steps:
                raise SimError(f"no completion within {self.config.max_steps} steps")
            self._account(when - self.now)
            self.now = when
            while self.heap and self.heap[0][0] == when:
                self._finish(heapq.heappop(self.heap)[2])

    def _settle(self) -> None:
        """Everything that happens at `now` without time passing, until nothing changes."""
        changed = True
        while changed:
            changed = False
            for r in range(self.ranks):
                changed |= self._promote(r)
                changed |= self._dispatch(r)
                changed |= self._start_parked(r)
            changed |= self._check_spinners()

    def _account(self, dt: int) -> None:
        for r in range(self.ranks):
            for i in self.inst[r]:
                for b in i.blocks:
                    bucket = self.busy[r] if b.phase == "running" else self.held[r]
                    for core in b.cores:
                        bucket["cube" if core.startswith("aic") else "vector"] += dt

    # ---- dependencies --------------------------------------------------------------------------------------
    def _done(self, r: int, tid: int) -> bool:
        return self.inst[r][tid].state == DONE

    def _resolved(self, r: int, tid: int) -> bool:
        i = self.inst[r][tid]
        return i.state == DONE or (i.state == READY and i.todo == 0 and i.task.blocks > 0)

    def deps_done(self, i: Instance) -> bool:
        return all(self._done(i.rank, d) for d in i.task.explicit) and \
            all(self._done(i.rank, d) for d in i.task.inferred)

    def dispatchable(self, i: Instance) -> bool:
        t = i.task
        if not all(self._done(i.rank, d) for d in t.explicit):
            return False
        if t.aer and self.config.early_resolve == "ignored":
            return True
        check = self._resolved if t.aer else self._done
        return all(check(i.rank, d) for d in t.inferred)

    # ---- state changes -------------------------------------------------------------------------------------
    def _promote(self, r: int) -> bool:
        changed = False
        for i in self.inst[r]:
            if i.state != WAITING or not self.dispatchable(i):
                continue
            if i.task.role == "dummy" or i.task.blocks == 0:
                if not self.deps_done(i):
                    continue
                self._start_instance(i)
                self._complete(i)
            else:
                i.state = READY
                i.priority = float(self.rng.random()) - (1.0 if self.config.waiters_first and i.task.wait else 0.0)
            changed = True
        return changed

    def _dispatch(self, r: int) -> bool:
        ready = sorted((i for i in self.inst[r] if i.state == READY and i.todo > 0),
                       key=lambda i: (i.priority, i.task.id))
        changed = False
        for i in ready:
            while i.todo > 0:
                cores = self.pools[r].take(i.task.core)
                if cores is None:
                    break
                i.todo -= 1
                block = Block(i, cores, since=self.now)
                i.blocks.append(block)
                self._log(i, "dispatch", cores)
                changed = True
                if self.deps_done(i):
                    self._start(block)
        return changed

    def _start_parked(self, r: int) -> bool:
        changed = False
        for i in self.inst[r]:
            if i.state != READY or not any(b.phase == "parked" for b in i.blocks) or not self.deps_done(i):
                continue
            for b in i.blocks:
                if b.phase == "parked":
                    self._start(b)
            changed = True
        return changed

    def _start_instance(self, i: Instance) -> None:
        if i.started:
            return
        i.started = True
        t = i.task
        if t.role == "compute":
            self.values.on_start(t, i.rank, self.now)
        if t.wait is not None and t.notify is not None and t.notify.per != "none":
            self.counters.notify(i.rank, t.notify, notifies_per_task(t), t.name)

    def _start(self, b: Block) -> None:
        i, t = b.inst, b.inst.task
        self._start_instance(i)
        b.since = self.now
        if t.wait is not None:
            b.phase = "spinning"
        elif t.comm == "rendezvous":
            b.phase = "arrived"
        else:
            b.phase = "running"
            self._schedule(b, self.now + self._steps(t))
        self._log(i, {"spinning": "spin", "arrived": "arrive"}.get(b.phase, "start"), b.cores)
        if b.phase == "arrived":
            self._arrive(b)

    def _arrive(self, b: Block) -> None:
        tid = b.inst.task.id
        self.arrived.setdefault(tid, set()).add(b.inst.rank)
        if len(self.arrived[tid]) < self.ranks:
            return
        for r in range(self.ranks):
            for blk in self.inst[r][tid].blocks:
                if blk.phase == "arrived":
                    blk.phase = "running"
                    self._schedule(blk, self.now + self._steps(blk.inst.task))

    def _check_spinners(self) -> bool:
        changed = False
        for row in self.inst:
            for i in row:
                for b in i.blocks:
                    if b.phase != "spinning" or b.end is not None:
                        continue
                    if not self.counters.satisfied(i.rank, i.task.wait):
                        continue
                    problem = self.counters.epoch_check(i.rank, i.task, self.per_epoch.get(i.task.id, 0), self.now)
                    if problem is not None:
                        self.problems.append(problem)
                    self._schedule(b, self.now + 1)
                    changed = True
        return changed

    def _steps(self, t: SimTask) -> int:
        extra = int(self.jitter.integers(0, self.config.jitter + 1)) if self.config.jitter else 0
        return self.config.steps(t) + extra

    def _schedule(self, b: Block, when: int) -> None:
        b.end = when
        self._seq += 1
        heapq.heappush(self.heap, (when, self._seq, b))

    def _finish(self, b: Block) -> None:
        i, t = b.inst, b.inst.task
        self.pools[i.rank].give(b.cores)
        i.blocks.remove(b)
        self._log(i, "finish", b.cores)
        i.finished += 1
        self.makespan = max(self.makespan, self.now)
        if t.notify is not None and t.notify.per == "block" and t.wait is None:
            self.counters.notify(i.rank, t.notify, t.notify.value, t.name)
        if i.finished == t.blocks:
            if t.notify is not None and t.notify.per == "task" and t.wait is None:
                self.counters.notify(i.rank, t.notify, t.notify.value, t.name)
            self._complete(i)

    def _complete(self, i: Instance) -> None:
        self.values.on_complete(i.task, i.rank, self.now)
        self._mark_done(i)

    def _mark_done(self, i: Instance) -> None:
        i.state = DONE
        i.todo = 0
        if i.task.role != "host":
            self._log(i, "done")

    def _log(self, i: Instance, event: str, cores: tuple[str, ...] = ()) -> None:
        if self.trace is not None:
            self.trace.append(Event(self.now, i.rank, i.task.name, event, cores))

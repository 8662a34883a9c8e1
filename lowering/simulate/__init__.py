"""Multi-rank simulation of lowered task graphs: cores, early dispatch, signals, spinning waits, deadlocks.

    from lowering.simulate import SimConfig, simulate
    result = simulate(task_graph_or_graph, inputs, SimConfig(cube=1, vector=2, seed=0))
    result.status          # "completed" | "deadlock"
    result.makespan        # simulated steps
    result.deadlock        # a Deadlock (wait-for cycle, held cores) or None; print(result.deadlock)
    result.problems        # epoch mismatches, reads of data no rank wrote (yet), failed references
    result.outputs         # per-rank outputs of the numpy references (when inputs were given)

    from lowering.simulate.explore import explore      # many schedules: drawn core budgets, seeds, jitter
    exploration = explore(task_graph, inputs, SimConfig(), count=24)
    exploration.failed     # [(Schedule, SimResult)] of the schedules that deadlocked or found a problem

The scheduling model (engine.py has the exact text next to the code):
* Every rank runs every task once (an *instance*) on its own cores: `cube` AICs and `vector` AIVs per rank. A
  task's SPMD blocks go to free cores of its kind: cube → 1 AIC, vector → 1 AIV, mix → a core group (1 AIC +
  2 AIV, all at once). A block holds its cores until it completes. Host tasks (`window`) are done before step 0;
  dummies (joins) need no core and no time.
* Deps: *explicit* = IR-declared (deps(...), token operands, join inputs); *inferred* = RAW/WAR/WAW buffer hazards,
  except on signal windows (TensorMap never sees remote atomics: a waiter is ordered after its notifier only by an
  explicit edge or an anchor) and on host windows.
* An instance is dispatchable when its explicit deps are done on its rank and its inferred deps are done (no AER)
  or merely *resolved*, i.e. every block of theirs placed on a core (AER: allow early resolve). Its blocks start
  when all its deps are done; until then an early-dispatched AER block is *parked*, holding its cores.
* Dispatch order: each instance draws a priority from the seeded RNG when it becomes dispatchable; at each step
  every rank places blocks of its dispatchable instances in priority order wherever cores are free (backfill).
* Blocks take `duration` steps (1 by default). A waiter spins on its cores until every peer's cell of its window
  is ≥ expected and completes the step after; a notify-then-wait task (barrier, dispatch_meta) notifies when it
  starts. Notifiers add `value` to cell[my rank] of every peer per block or per task as they complete. A
  rendezvous collective (o_group_a2a, window_copy_out, window_release, tp_o_reduce_scatter) holds its cores until
  it has started on every rank.
* Deadlock: nothing due to complete and some instance not done. The report gives the shortest wait-for cycle
  (which task on which rank holds which cores, spinning for which notifier, which cannot get a core) and every
  held core.
* Values: each local task runs its numpy reference when its instance completes; a collective runs once, when
  every rank has reached its publish point (values.py), and its remote writes land then. A task reading a
  collective's result before it landed is a `remote-read` problem; a read no task ever writes is
  `unwritten-read`; epoch checks are in signals.py.
* Limits: `max_blocks` (SPMD blocks over all ranks) and, with inputs, `max_bytes` of buffers: beyond them the
  simulator refuses with a SimError instead of running for ever or allocating without bound.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .adapter import SimError, SimTask, build_task_graph
from .deadlock import Deadlock, Hop, explain
from .engine import Engine, Event, SimConfig
from .problems import Problem

__all__ = ["SimConfig", "SimResult", "Event", "SimError", "SimTask", "Deadlock", "Hop", "Problem", "simulate"]


@dataclass
class SimResult:
    status: str                         # completed | deadlock
    makespan: int                       # step of the last completion
    ranks: int
    config: SimConfig
    tasks: int
    blocks: int                         # SPMD blocks per rank
    deadlock: Deadlock | None = None
    problems: list[Problem] = field(default_factory=list)
    outputs: list[dict] | None = None   # per rank, when inputs were given and no reference failed
    busy: list[dict] = field(default_factory=list)   # per rank: core-steps computing, by core kind
    held: list[dict] = field(default_factory=list)   # per rank: core-steps parked / spinning / at a rendezvous
    trace: list[Event] | None = None    # with SimConfig(trace=True)

    @property
    def completed(self) -> bool:
        return self.status == "completed"

    @property
    def ok(self) -> bool:
        return self.completed and not self.problems

    def summary(self) -> str:
        c = self.config
        budget = f"{c.cube} cube + {c.vector} vector cores per rank, seed {c.seed}"
        if not self.completed:
            return (f"deadlock at step {self.deadlock.step} on {self.ranks} rank(s) ({budget}); "
                    f"{self.deadlock.stuck} task instances stuck")
        capacity = max(self.makespan, 1) * (c.cube + c.vector) * self.ranks
        busy = sum(sum(b.values()) for b in self.busy)
        held = sum(sum(h.values()) for h in self.held)
        return (f"completed in {self.makespan} steps on {self.ranks} rank(s) ({budget}); {self.tasks} tasks, "
                f"{self.blocks} blocks per rank; cores busy {100 * busy / capacity:.0f}%, held waiting "
                f"{100 * held / capacity:.0f}%")

    def report(self) -> str:
        lines = [self.deadlock.format() if self.deadlock is not None else self.summary()]
        lines += [f"problem: {p}" for p in self.problems]
        return "\n".join(lines)


def simulate(target: Any, inputs: Any = None, config: SimConfig | None = None, **overrides: Any) -> SimResult:
    """Simulate a lowered TaskGraph (or a Graph, lowered first). `inputs` (a dict, or one per rank) turns on the
    values; `overrides` are SimConfig fields (`simulate(tg, cube=1, vector=2, seed=3)`)."""
    from dataclasses import replace

    config = replace(config or SimConfig(), **overrides)
    tg = target if hasattr(target, "tasks") and hasattr(target, "buffers") else build_task_graph(target)
    engine = Engine(tg, config, inputs)
    completed = engine.run()
    problems = engine.problems + engine.values.problems
    return SimResult(
        status="completed" if completed else "deadlock", makespan=engine.makespan, ranks=engine.ranks,
        config=config, tasks=len(engine.tasks), blocks=sum(t.blocks for t in engine.tasks if t.core is not None),
        deadlock=None if completed else explain(engine), problems=problems,
        outputs=engine.values.outputs() if completed else None, busy=engine.busy, held=engine.held,
        trace=engine.trace)

"""Schedule exploration: one simulated run proves little, so `explore` runs many.

With ample cores every rank runs the same graph in lockstep, and a missing cross-rank edge (a wait that does not
order a read after the peers' remote writes, a waiter that may hold the cores its notifier needs) never shows.
`explore` runs the given schedule and then `count - 1` more, each drawn from (seed, index):
* a core budget: half of them (the odd ones) the smallest one that can run every task (1 cube + 2 vector cores
  when a mix task is there), the rest between that and the given budget (log-uniform), so waiters starve
  notifiers;
* a dispatch seed (the order among ready tasks); every fourth (1, 5, 9, ...) puts ready waiters first, the
  adversarial order in which a waiter takes the cores its own rank's notifier still needs;
* jitter 0..3: each block takes 1 + a draw in 0..jitter steps, so the ranks drift apart and a rank's reads race
  its peers' writes.
Values (the numpy references) run in the given schedule only; the others check timing, deadlock, epochs and
remote reads, which need no values. The schedules depend only on the base config and `count`: a failing one is
reproduced by its own config (`Schedule.flags()`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from .adapter import TaskGraph, sim_tasks
from .cores import NEEDS

MAX_JITTER = 3


@dataclass(frozen=True)
class Schedule:
    index: int
    config: Any                 # SimConfig

    def flags(self) -> str:
        c = self.config
        jitter = f" --jitter {c.jitter}" if c.jitter else ""
        first = " --waiters-first" if c.waiters_first else ""
        return f"--cores-cube {c.cube} --cores-vector {c.vector} --seed {c.seed}{jitter}{first} --schedules 1"


@dataclass
class Exploration:
    schedules: list[Schedule]
    results: list[Any]          # SimResult per schedule, in order

    @property
    def failed(self) -> list[tuple[Schedule, Any]]:
        return [(s, r) for s, r in zip(self.schedules, self.results) if not r.ok]

    def summary(self) -> str:
        n, bad = len(self.schedules), self.failed
        cubes = sorted({s.config.cube for s in self.schedules})
        vectors = sorted({s.config.vector for s in self.schedules})
        jitters = sorted({s.config.jitter for s in self.schedules})
        what = (f"cores {cubes[0]}..{cubes[-1]} cube, {vectors[0]}..{vectors[-1]} vector, "
                f"jitter {jitters[0]}..{jitters[-1]}")
        if not bad:
            return f"explored {n} schedule{'s' if n > 1 else ''} ({what}): all completed without problems"
        deadlocks = sum(1 for _, r in bad if not r.completed)
        return (f"explored {n} schedules ({what}): {len(bad)} failed ({deadlocks} deadlock"
                f"{'s' if deadlocks != 1 else ''}, {len(bad) - deadlocks} with problems)")


def schedules(tg: TaskGraph, base: Any, count: int) -> list[Schedule]:
    """The base schedule, then `count - 1` drawn from (base.seed, index)."""
    out = [Schedule(0, base)]
    low_cube, low_vector = minimal_budget(tg)
    low_cube, low_vector = min(low_cube, base.cube), min(low_vector, base.vector)
    for k in range(1, count):
        rng = np.random.default_rng([base.seed, k, 0x5CED])
        if k % 2 == 1:
            cube, vector = low_cube, low_vector
        else:
            cube, vector = _between(rng, low_cube, base.cube), _between(rng, low_vector, base.vector)
        out.append(Schedule(k, replace(base, cube=cube, vector=vector, seed=int(rng.integers(0, 1 << 31)),
                                       jitter=int(rng.integers(0, MAX_JITTER + 1)), waiters_first=k % 4 == 1)))
    return out


def minimal_budget(tg: TaskGraph) -> tuple[int, int]:
    """The fewest cube and vector cores per rank on which every task's blocks fit."""
    cube = vector = 0
    for t in sim_tasks(tg):
        if t.core is not None and t.blocks > 0:
            need = NEEDS[t.core]
            cube, vector = max(cube, need.get("cube", 0)), max(vector, need.get("vector", 0))
    return cube, vector


def explore(tg: TaskGraph, inputs: Any, config: Any, count: int) -> Exploration:
    from . import SimConfig, simulate

    plan = schedules(tg, config or SimConfig(), max(count, 1))   # (dspark simulate: --schedules, default 24)
    results = [simulate(tg, inputs if s.index == 0 else None, s.config) for s in plan]
    return Exploration(plan, results)


def _between(rng: np.random.Generator, low: int, high: int) -> int:
    if high <= low:
        return high
    value = math.exp(rng.uniform(math.log(max(low, 1)), math.log(high + 1)))
    return max(low, min(high, int(value)))

"""Split reductions as the executors see them: which order the k splits of an atomic task arrive in.

A task with `accumulate = atomic` and `k_split = n > 1` adds n partial results into its seeded
accumulator. On hardware the order is the blocks' completion order; the op's numpy reference takes it
as `split_order` (default ascending, the reference order). The `shuffled` executor passes a random
permutation per seed, so an order-dependent fp32 reduction shows up as differing bits. `ordered`
reductions write disjoint partials that a separate task sums in ascending order: nothing to vary.

`order_dependent` names the atomic split tasks left in a task graph: the one answer the lint (an
`order-dependent` warning), `dspark run` and the compile report give to "is this bitwise across schedules?".
"""
from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from .taskgraph import Task


@lru_cache(maxsize=None)
def accepts_split_order(fn: Callable[..., Any]) -> bool:
    try:
        return "split_order" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def split_count(task: Task) -> int:
    return int(task.attrs.get("k_split", 1) or 1)


def is_atomic_split(task: Task) -> bool:
    return task.accumulate == "atomic" and split_count(task) > 1


def random_split_order(task: Task, rng: np.random.Generator) -> Sequence[int] | None:
    """A random arrival order of an atomic task's splits (None: nothing to vary)."""
    if not is_atomic_split(task):
        return None
    return [int(i) for i in rng.permutation(split_count(task))]


def order_dependent(tasks: Iterable[Task]) -> list[Task]:
    """The tasks whose result depends on the order their splits land in (atomic split accumulation)."""
    return [t for t in tasks if is_atomic_split(t)]


def determinism(tasks: Iterable[Task]) -> str:
    """One line: bitwise across schedules, or not, naming every order-dependent accumulation."""
    found = order_dependent(tasks)
    if not found:
        return "bitwise across schedules (no order-dependent accumulation)"
    names = ", ".join(f"'{t.name}' (accumulate = atomic, k_split = {split_count(t)})" for t in found)
    return (f"not bitwise across schedules: {len(found)} order-dependent accumulation{'s' if len(found) > 1 else ''}"
            f" ({names}); deterministic-split-k{{targets=all}} orders them")

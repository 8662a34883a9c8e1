"""Split reductions as the executors see them: which order the k splits of an atomic task arrive in.

A task with `accumulate = atomic` and `k_split = n > 1` adds n partial results into its seeded
accumulator. On hardware the order is the blocks' completion order; the op's numpy reference takes it
as `split_order` (default ascending, the reference order). The `shuffled` executor passes a random
permutation per seed, so an order-dependent fp32 reduction shows up as differing bits. `ordered`
reductions write disjoint partials that a separate task sums in ascending order: nothing to vary.
"""
from __future__ import annotations

import inspect
from functools import lru_cache
from typing import Any, Callable, Sequence

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

"""Executors of a task graph: `numpy` (submission order), `shuffled` (random valid order) and `pypto`.

All three share one memory model: one flat array per buffer (per rank), task arguments are strided
views of it, kernels read copies of their inputs and their results are written through their output
views. Local buffers start poisoned (NaN, or a sentinel for integers), so a task that runs before its
producer reads garbage instead of plausible zeros.

* `run_numpy` calls each kernel's numpy reference (the op's `reference`) in submission order. It is
  the interpreter's semantics, so for a correct lowering its outputs equal `dspark_ir.interp.run`
  bit for bit.
* `run_shuffled(seed)` runs a random topological order of the explicit deps only, so a missing
  dependency shows up as different results for some seed; split reductions add their partials in a
  random order for `accumulate = atomic` (the reference's `split_order`); `ordered` ones are fixed.
* `run_pypto` (in `lowering.pypto_exec`) runs each kernel's generated pypto source through the harness.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from dspark_ir.errors import ShapeError
from dspark_ir.ops import get_op
from dspark_ir.semantics.dtypes import NP_DTYPES

from .errors import LoweringError
from .regions import View, materialize
from .splitk import accepts_split_order, random_split_order
from .taskgraph import Task, TaskGraph

INT_POISON = -0x5A5A5A5A


def reference_of(task: Task) -> Callable[..., Any]:
    """The numpy semantics of the task's op (its op definition's `reference`)."""
    try:
        return get_op(task.op).reference_fn()
    except ShapeError as e:
        raise LoweringError(f"task {task.name}: {e}") from None


class Memory:
    """The buffers of one rank."""

    def __init__(self, tg: TaskGraph, inputs: Mapping[str, Any], poison: bool = True):
        self.tg = tg
        self.storage: dict[str, np.ndarray] = {}
        for buf in tg.buffers.values():
            dt = np.dtype(NP_DTYPES[buf.dtype])
            if buf.kind in ("input", "inout"):
                param = next((p for p, b in tg.inputs.items() if b == buf.name), buf.name)
                if param not in inputs:
                    raise LoweringError(f"missing input %{param}", f"task graph '@{tg.name}'")
                value = np.asarray(inputs[param]).astype(dt)
                if tuple(value.shape) != buf.shape:
                    raise LoweringError(f"input %{param} has shape {tuple(value.shape)}, expected {list(buf.shape)}",
                                        f"task graph '@{tg.name}'")
                self.storage[buf.name] = np.ascontiguousarray(value).reshape(-1).copy()
            else:
                self.storage[buf.name] = _poisoned(buf.numel, dt) if poison else np.zeros(buf.numel, dt)

    def read(self, view: View) -> np.ndarray:
        return np.array(materialize(self.storage[view.buffer], view))

    def write(self, view: View, value: Any, task: Task, what: str) -> None:
        target = materialize(self.storage[view.buffer], view)
        value = np.asarray(value)
        if value.dtype != target.dtype or value.shape != target.shape:
            raise LoweringError(f"{task.op} returned {value.dtype}{list(value.shape)} for {what}, "
                                f"expected {target.dtype}{list(target.shape)}", f"task {task.id} '{task.name}'")
        target[...] = value

    def outputs(self) -> dict[str, np.ndarray]:
        return {name: self.read(view) for name, view in self.tg.outputs.items()}


def _poisoned(n: int, dt: np.dtype) -> np.ndarray:
    if dt.kind == "f" or dt.name == "bfloat16" or "float" in dt.name:
        return np.full(n, np.nan, dtype=np.float32).astype(dt)
    if dt.kind in "iu":
        return np.full(n, INT_POISON, dtype=np.int64).astype(dt)
    return np.zeros(n, dt)


def operand_arrays(task: Task, mem: Memory) -> list[np.ndarray]:
    """The task's operands in operand order (tokens are passed as None)."""
    arrays: list[Any] = [None] * task.operands
    for a in task.args:
        if a.reads:
            arrays[a.index] = mem.read(a.view)
    return arrays


def store_results(task: Task, mem: Memory, out: Any) -> None:
    outs = out if isinstance(out, tuple) else (out,)
    if len(outs) != len(task.results):
        raise LoweringError(f"{task.op} returned {len(outs)} values for {len(task.results)} results",
                            f"task {task.id} '{task.name}'")
    by_operand = {a.index: a for a in task.args if a.direction == "inout"}
    by_result = {a.index: a for a in task.args if a.direction == "out"}
    for r, (spec, value) in enumerate(zip(task.results, outs)):
        if spec.get("token"):
            continue
        arg = by_operand[spec["alias"]] if spec.get("alias") is not None else by_result[r]
        mem.write(arg.view, value, task, f"%{spec['value']}")


def store_side_effects(task: Task, mem: Memory, operands: Sequence[Any]) -> None:
    """Write back in-place operands that no result returns (a notifier's signal window, which the
    reference AtomicAdds into in place)."""
    returned = {res.get("alias") for res in task.results}
    for a in task.args:
        if a.direction == "inout" and a.index not in returned:
            mem.write(a.view, operands[a.index], task, f"%{a.value} (in place)")


def kernel_attrs(task: Task) -> dict[str, Any]:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in task.attrs.items()}


def run_task(task: Task, mems: Sequence[Memory], split_order: Sequence[int] | None = None) -> None:
    """Run one kernel task on every rank through its numpy reference."""
    if task.is_dummy:
        return
    fn = reference_of(task)
    attrs = kernel_attrs(task)
    per_rank = [operand_arrays(task, m) for m in mems]
    try:
        if task.collective:
            results = fn(per_rank, ranks=len(mems), **attrs)
        elif split_order is not None and accepts_split_order(fn):
            results = [fn(*ops, split_order=list(split_order), **attrs) for ops in per_rank]
        else:
            results = [fn(*ops, **attrs) for ops in per_rank]
    except LoweringError:
        raise
    except Exception as e:
        raise LoweringError(f"{task.op} reference failed: {type(e).__name__}: {e}",
                            f"task {task.id} '{task.name}'") from e
    for mem, ops, out in zip(mems, per_rank, results):
        store_results(task, mem, out)
        store_side_effects(task, mem, ops)


def rank_memories(tg: TaskGraph, inputs) -> tuple[list[Memory], bool]:
    single = isinstance(inputs, Mapping)
    per_rank = [inputs] if single else list(inputs)
    if len(per_rank) != tg.ranks:
        raise LoweringError(f"task graph runs on {tg.ranks} ranks, got inputs for {len(per_rank)}")
    return [Memory(tg, r) for r in per_rank], single


def rank_results(mems: list[Memory], single: bool):
    outs = [m.outputs() for m in mems]
    return outs[0] if single else outs


def check_order(tg: TaskGraph, order: Sequence[int]) -> None:
    pos = {t: i for i, t in enumerate(order)}
    if sorted(order) != list(range(len(tg))):
        raise LoweringError("an execution order must list every task exactly once")
    for t in tg.tasks:
        for d in t.deps:
            if pos[d] > pos[t.id]:
                raise LoweringError(f"order runs task {t.id} '{t.name}' before its dependency {d}")


def run_numpy(tg: TaskGraph, inputs, *, order: Sequence[int] | None = None):
    """Run the numpy references in submission order (or `order`, which must respect the deps)."""
    mems, single = rank_memories(tg, inputs)
    order = list(range(len(tg))) if order is None else list(order)
    check_order(tg, order)
    for tid in order:
        run_task(tg.tasks[tid], mems)
    return rank_results(mems, single)


def random_topological_order(tg: TaskGraph, rng: np.random.Generator) -> list[int]:
    """A uniformly chosen ready task at each step: any valid order of the explicit deps can come out."""
    indeg = {t.id: len(set(t.deps)) for t in tg.tasks}
    users: dict[int, list[int]] = {t.id: [] for t in tg.tasks}
    for t in tg.tasks:
        for d in set(t.deps):
            users[d].append(t.id)
    ready = sorted(t for t, n in indeg.items() if n == 0)
    order = []
    while ready:
        tid = ready.pop(int(rng.integers(len(ready))))
        order.append(tid)
        for u in users[tid]:
            indeg[u] -= 1
            if indeg[u] == 0:
                ready.append(u)
        ready.sort()
    if len(order) != len(tg):
        raise LoweringError("the task deps have a cycle")
    return order


def run_shuffled(tg: TaskGraph, inputs, seed: int = 0, *, vary_splits: bool = True, return_order: bool = False):
    """Run a random valid order of the explicit deps; with `vary_splits`, atomic split reductions add
    their splits in a random order too (else in the reference's ascending order)."""
    rng = np.random.default_rng(seed)
    mems, single = rank_memories(tg, inputs)
    order = random_topological_order(tg, rng)
    for tid in order:
        task = tg.tasks[tid]
        run_task(task, mems, random_split_order(task, rng) if vary_splits else None)
    result = rank_results(mems, single)
    return (result, order) if return_order else result


EXECUTORS: dict[str, Callable[..., Any]] = {"numpy": run_numpy, "shuffled": run_shuffled}

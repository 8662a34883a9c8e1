"""The one place the simulator reads the rest of the compiler: lowered task graphs, hazards, executors' memory.

Everything `lowering.simulate` needs from `lowering` (TaskGraph, Task, find_hazards, the numpy executor's memory
and reference helpers) and from `dspark_ir` (op definitions: which operand a task notifies or waits on) is
imported here and nowhere else, so a change of those APIs touches one module. `sim_tasks(tg)` turns a task graph
into `SimTask`s: what the scheduler needs to know about each task and nothing more.

Dependencies are rebuilt from the task graph's own data rather than read from `Task.deps` (which is transitively
reduced over *all* edges, so an explicit edge implied by a path of inferred ones is gone from it):
* explicit  = `Task.declared`: the IR's `deps(...)`, token operands and join inputs (pypto `deps=`);
* inferred  = every RAW / WAR / WAW hazard of the tasks' buffer regions (what TensorMap infers), except hazards
              on signal windows (below) and on host-allocated windows (allocated before the run starts).
Signal windows (the window a notifier AtomicAdds into or a waiter spins on) are not tracked: TensorMap never sees
remote atomics, so a waiter is ordered after its notifier only by an explicit edge or an anchor read
(dspark-model.md §5). `track_signal_windows=True` keeps those hazards as inferred edges (the lowering's view,
which derives a RAW edge from notifier to waiter).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from dspark_ir.errors import DsparkError
from dspark_ir.ops import get_op

from ..build import build_task_graph  # noqa: F401  (re-exported for the package)
from ..executors import Memory, kernel_attrs, operand_arrays, reference_of, store_results, store_side_effects
from ..hazards import find_hazards
from ..taskgraph import Task, TaskGraph

__all__ = [
    "SimError", "SimTask", "NotifySpec", "WaitSpec", "sim_tasks", "signal_buffers", "buffer_bytes",
    "build_task_graph", "Memory", "kernel_attrs", "operand_arrays", "reference_of", "store_results",
    "store_side_effects", "Task", "TaskGraph",
]

class SimError(DsparkError):
    """A task graph or a core budget the simulator cannot run."""


CORE_KINDS = ("cube", "vector", "mix")


@dataclass(frozen=True)
class NotifySpec:
    """What a notifier adds to cell[my rank] of every peer's `buffer`: `value` per task or per SPMD block."""

    buffer: str
    value: int
    per: str                # task | block | none


@dataclass(frozen=True)
class WaitSpec:
    """A waiter spins until every peer's cell of `buffer` on its rank is ≥ `expected` (WaitCmp.Ge)."""

    buffer: str
    expected: int
    epoch: int
    notifier: str           # name of the task whose instances on the peer ranks notify the window


@dataclass
class SimTask:
    """One task as the scheduler sees it."""

    id: int
    name: str
    op: str
    role: str                       # host | dummy | compute
    core: str | None                # cube | vector | mix (None: host / dummy)
    blocks: int
    aer: bool
    comm: str                       # local | onesided | rendezvous (collective tasks)
    explicit: tuple[int, ...] = ()
    inferred: tuple[int, ...] = ()
    raw: tuple[tuple[int, str], ...] = ()   # (producer, buffer) of every RAW hazard of this task's reads
    notify: NotifySpec | None = None
    wait: WaitSpec | None = None
    task: Task | None = field(default=None, repr=False)

    @property
    def deps(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.explicit) | set(self.inferred)))

    @property
    def label(self) -> str:
        return f"task {self.id} '{self.name}'"


def buffer_bytes(tg: TaskGraph) -> int:
    """Bytes of all buffers of one rank (what the executors' memory allocates)."""
    import numpy as np

    from dspark_ir.semantics.dtypes import NP_DTYPES

    return sum(b.numel * np.dtype(NP_DTYPES[b.dtype]).itemsize for b in tg.buffers.values())


def sim_tasks(tg: TaskGraph, *, track_signal_windows: bool = False) -> list[SimTask]:
    """The task graph as SimTasks (see the module docstring for the dependency model)."""
    tasks = [_sim_task(t) for t in tg.tasks]
    signals = signal_buffers(tasks)
    host = {t.id for t in tasks if t.role == "host"}
    explicit: dict[int, set[int]] = {t.id: set(t.task.declared) - host for t in tasks}
    inferred: dict[int, set[int]] = {t.id: set() for t in tasks}
    raw: dict[int, set[tuple[int, str]]] = {t.id: set() for t in tasks}
    for h in find_hazards(tg.tasks):
        if h.first in host or (h.buffer in signals and not track_signal_windows):
            continue
        inferred[h.second].add(h.first)
        if h.kind == "raw" and h.buffer not in signals and not _is_anchor(tasks[h.second], h.second_param):
            raw[h.second].add((h.first, h.buffer))
    for t in tasks:
        t.explicit = tuple(sorted(explicit[t.id]))
        t.inferred = tuple(sorted(inferred[t.id] - explicit[t.id]))
        t.raw = tuple(sorted(raw[t.id]))
    return tasks


def _is_anchor(t: SimTask, param: str) -> bool:
    """An operand a signal op reads only to be ordered after its producer (`*after`, `*anchors`): not data."""
    if t.task is None or t.role != "compute":
        return False
    variadic = get_op(t.op).operands[-1:] if get_op(t.op).operands else ()
    return bool(variadic) and variadic[0] in ("*after", "*anchors") and param.startswith(variadic[0][1:])


def signal_buffers(tasks: list[SimTask]) -> set[str]:
    return {s.buffer for t in tasks for s in (t.notify, t.wait) if s is not None}


def _sim_task(t: Task) -> SimTask:
    if get_op(t.op).lowers_to == "host":      # host `alloc_window_buffer`: done before the run, no core, no time
        return SimTask(t.id, t.name, t.op, "host", None, 1, False, "local", task=t)
    if t.is_dummy:
        return SimTask(t.id, t.name, t.op, "dummy", None, 1, False, "local", task=t)
    opdef = get_op(t.op)
    core = t.core if t.core in CORE_KINDS else "vector"
    notify, wait = _notify_spec(t, opdef), _wait_spec(t, opdef)
    return SimTask(t.id, t.name, t.op, "compute", core, max(int(t.blocks), 0), bool(t.attrs.get("aer")),
                   _comm(t, opdef, notify, wait), notify=notify, wait=wait, task=t)


def _comm(t: Task, opdef: Any, notify: NotifySpec | None, wait: WaitSpec | None) -> str:
    """How a collective task meets its peers. A notifier or waiter talks through its signal window; a collective
    that updates a window in place (aliases) is a one-sided put; any other collective computes fresh results from
    every rank's operands, so each rank's instance holds its core until all ranks have arrived."""
    if not t.collective:
        return "local"
    if notify is not None or wait is not None or getattr(opdef, "aliases", None):
        return "onesided"
    return "rendezvous"


def _operand_buffer(t: Task, opdef: Any, name: str | None) -> str | None:
    if name is None:
        return None
    index = [n.lstrip("*") for n in opdef.operands].index(name)
    for a in t.args:
        if a.index == index and a.direction in ("in", "inout"):
            return a.view.buffer
    return None


def _notify_spec(t: Task, opdef: Any) -> NotifySpec | None:
    buffer = _operand_buffer(t, opdef, getattr(opdef, "notify_operand", None))
    if buffer is None:
        return None
    return NotifySpec(buffer, int(t.attrs.get("value", 1)), str(t.attrs.get("notify_per", "task")))


def _wait_spec(t: Task, opdef: Any) -> WaitSpec | None:
    buffer = _operand_buffer(t, opdef, getattr(opdef, "wait_operand", None))
    if buffer is None:
        return None
    try:
        return WaitSpec(buffer, int(t.attrs["expected"]), int(t.attrs.get("epoch", 1)), str(t.attrs["notifier"]))
    except (KeyError, TypeError, ValueError):
        raise SimError("waiter has no concrete 'expected'/'notifier' attributes", t.label()) from None

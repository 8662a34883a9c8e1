"""The `pypto` executor and the per-kernel compile/cycle checks, through the harness `kernels.pypto_rt`.

* `run_pypto(tg, inputs)` runs the task graph for real: every kernel task with a template goes through
  pypto 0.2.0 on CPU (SIM + pass-verify with our verify-path fix, so the outputs are pypto's numbers),
  in dependency waves: the ready tasks of a wave run as one `run_jobs` batch, their outputs are written
  into the buffers, then the next wave is formed. Each job also carries the numpy reference's output as
  its golden, so pypto's own tensor-graph check compares against it. Tasks without a template (and
  collectives, which pypto cannot simulate on one process) run their numpy reference and are reported
  as fallbacks, unless `strict=True`. A multi-rank graph (TP > 1, EP) runs one job per task and rank;
  its collectives run on numpy across the ranks.
* `check_kernels(tg, mode)` compiles (`compile`: to the execute graph) or simulates (`sim`: cost-model
  cycles) every templated kernel in one batch; the numbers do not matter there, inputs are zeros.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from .codegen import RUNTIME_SYMBOLS, find_template, inout_input_name, kernel_module
from .errors import LoweringError
from .executors import Memory, _finish, _memories, kernel_attrs, operand_arrays, reference_fn, run_task
from .taskgraph import Task, TaskGraph


@dataclass
class TaskRun:
    """How one task ran under the pypto executor (or a compile/sim check)."""

    id: int
    name: str
    backend: str                  # pypto | numpy-fallback | dummy
    ok: bool = True
    cycles: int | None = None
    pypto_tasks: int | None = None
    wall_s: float = 0.0
    max_abs_err: float | None = None   # pypto output vs the numpy reference on the same inputs
    verify_ok: bool | None = None      # pypto's tensor-graph + pass verify rows all PASS
    error: str = ""

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass
class PyptoReport:
    runs: list[TaskRun] = field(default_factory=list)
    waves: int = 0
    wall_s: float = 0.0

    @property
    def fallbacks(self) -> list[TaskRun]:
        return [r for r in self.runs if r.backend == "numpy-fallback"]

    @property
    def failed(self) -> list[TaskRun]:
        return [r for r in self.runs if not r.ok]

    def summary(self) -> str:
        pypto = [r for r in self.runs if r.backend == "pypto"]
        return (f"{len(pypto)} kernels through pypto, {len(self.fallbacks)} numpy fallbacks, "
                f"{len(self.failed)} failed, {self.waves} waves, {self.wall_s:.1f} s")


def _job(task: Task, tg: TaskGraph, mem: Memory, mode: str, golden: bool, runtime_symbols,
         source: str | None = None) -> Any:
    from kernels.pypto_rt import KernelJob

    inputs, outputs, goldens = {}, {}, {}
    for a in task.args:
        if a.direction == "in":
            inputs[a.param] = np.ascontiguousarray(mem.read(a.view))
        elif a.direction == "inout":
            current = np.ascontiguousarray(mem.read(a.view))
            inputs[inout_input_name(a.param)] = current
            outputs[a.param] = current.copy()
        else:
            outputs[a.param] = (tuple(a.shape), a.dtype)
    if golden:
        goldens = _reference_outputs(task, mem)
    source = source if source is not None else kernel_module(task, tg, runtime_symbols=runtime_symbols)
    return KernelJob(source, task.kernel, inputs, outputs, mode=mode, label=task.name, goldens=goldens)


def _reference_outputs(task: Task, mem: Memory) -> dict[str, np.ndarray]:
    """The numpy reference's results on the task's current inputs, by kernel parameter name."""
    out = reference_fn(task.reference)(*operand_arrays(task, mem), **kernel_attrs(task))
    outs = out if isinstance(out, tuple) else (out,)
    by_operand = {a.index: a for a in task.args if a.direction == "inout"}
    by_result = {a.index: a for a in task.args if a.direction == "out"}
    goldens = {}
    for r, (res, value) in enumerate(zip(task.results, outs)):
        if res.get("token"):
            continue
        arg = by_operand[res["alias"]] if res.get("alias") is not None else by_result[r]
        goldens[arg.param] = np.asarray(value)
    return goldens


def _waves(tg: TaskGraph) -> list[list[int]]:
    level: dict[int, int] = {}
    for t in tg.tasks:
        level[t.id] = 1 + max((level[d] for d in t.deps), default=-1)
    waves: dict[int, list[int]] = {}
    for tid, lv in level.items():
        waves.setdefault(lv, []).append(tid)
    return [waves[k] for k in sorted(waves)]


def runs_on_pypto(task: Task) -> bool:
    return not task.is_dummy and not task.collective and find_template(task) is not None


def run_pypto(tg: TaskGraph, inputs, *, strict: bool = False, workers: int = 2, timeout: float = 300.0,
              runtime_symbols: Iterable[str] = RUNTIME_SYMBOLS, report: PyptoReport | None = None,
              mode: str = "full", sources: Mapping[int, str] | None = None):
    """Execute the task graph with every templated kernel running in pypto 0.2.0 (see the module doc).

    Returns the outputs like `run_numpy`; details (per-task errors, cycles, fallbacks) go to `report`.
    `sources` (task id → kernel module text) replaces the templates' rendering, e.g. the emitted files.
    """
    from kernels.pypto_rt import run_jobs

    runtime_symbols = tuple(runtime_symbols)
    report = report if report is not None else PyptoReport()
    start = time.perf_counter()
    mems, single = _memories(tg, inputs)
    for wave in _waves(tg):
        report.waves += 1
        tasks = [tg.tasks[i] for i in wave]
        on_pypto = [t for t in tasks if runs_on_pypto(t)]
        for t in tasks:
            if t in on_pypto:
                continue
            if t.is_dummy:
                report.runs.append(TaskRun(t.id, t.name, "dummy"))
                continue
            if strict:
                raise LoweringError(f"no pypto template for op '{t.op}'", f"task {t.id} '{t.name}'")
            run_task(t, mems)  # collectives and untemplated kernels: numpy, all ranks in lockstep
            report.runs.append(TaskRun(t.id, t.name, "numpy-fallback"))
        if not on_pypto:
            continue
        placed = [(t, mem) for t in on_pypto for mem in mems]  # one job per task and rank
        jobs = [_job(t, tg, mem, mode, True, runtime_symbols, (sources or {}).get(t.id)) for t, mem in placed]
        results = run_jobs(jobs, timeout, workers=min(workers, len(jobs)))
        for (t, mem), job, res in zip(placed, jobs, results):
            run = TaskRun(t.id, t.name, "pypto", res.ok, res.cycles, res.tasks, res.wall_s,
                          error=res.error or "")
            if res.ok:
                run.verify_ok = res.verify_ok
                run.max_abs_err = _max_err(res.outputs, job.goldens)
                if res.clobbered:
                    run.ok, run.error = False, f"pypto changed inputs {res.clobbered}"
                _store(t, mem, res.outputs)
            report.runs.append(run)
            if not run.ok:
                report.wall_s = time.perf_counter() - start
                raise LoweringError(f"pypto kernel failed: {run.error}", f"task {t.id} '{t.name}'")
    report.wall_s = time.perf_counter() - start
    return _finish(mems, single)


def _store(task: Task, mem: Memory, outputs: Mapping[str, np.ndarray]) -> None:
    for a in task.args:
        if a.writes:
            mem.write(a.view, outputs[a.param], task, f"%{a.value}")


def _max_err(outputs: Mapping[str, np.ndarray], goldens: Mapping[str, np.ndarray]) -> float | None:
    worst = None
    for name, golden in goldens.items():
        got = np.asarray(outputs[name]).astype(np.float64)
        want = np.asarray(golden).astype(np.float64)
        both_nan = np.isnan(got) & np.isnan(want)
        diff = np.where(both_nan, 0.0, np.abs(got - want))
        err = float(np.max(diff)) if diff.size else 0.0
        worst = err if worst is None else max(worst, err)
    return worst


def check_kernels(tg: TaskGraph, mode: str = "compile", *, tasks: Sequence[int] | None = None,
                  workers: int = 2, timeout: float = 300.0,
                  runtime_symbols: Iterable[str] = RUNTIME_SYMBOLS) -> list[TaskRun]:
    """Compile (`compile`) or simulate (`sim`, cycles) every templated kernel; inputs are zeros.

    The results also fill each task's `cycles` / `pypto_tasks` (sim mode)."""
    from kernels.pypto_rt import KernelJob, run_jobs

    chosen = [tg.tasks[i] for i in tasks] if tasks is not None else list(tg.tasks)
    todo = [t for t in chosen if runs_on_pypto(t)]
    jobs = []
    for t in todo:
        inputs = {a.param if a.direction == "in" else inout_input_name(a.param): np.zeros(a.shape, _np_dtype(a.dtype))
                  for a in t.args if a.reads}
        outputs = {a.param: np.zeros(a.shape, _np_dtype(a.dtype)) for a in t.args if a.writes}
        jobs.append(KernelJob(kernel_module(t, tg, runtime_symbols=tuple(runtime_symbols)), t.kernel,
                              inputs, outputs, mode=mode, label=t.name))
    results = run_jobs(jobs, timeout, workers=min(workers, max(1, len(jobs)))) if jobs else []
    runs = []
    for t, res in zip(todo, results):
        runs.append(TaskRun(t.id, t.name, "pypto", res.ok, res.cycles, res.tasks, res.wall_s, error=res.error or ""))
        if res.ok and mode != "compile":
            t.cycles, t.pypto_tasks = res.cycles, res.tasks
    return runs


def _np_dtype(name: str) -> np.dtype:
    from kernels._np import NP_DTYPES

    return np.dtype(NP_DTYPES[name])

"""The `pypto` executor and the per-kernel compile/cycle checks, through the harness `kernels.pypto_rt`.

* `run_pypto(tg, inputs)` runs the task graph for real: every kernel task with a pypto form goes through
  pypto 0.2.0 on CPU (SIM + pass-verify with our verify-path fix, so the outputs are pypto's numbers),
  in dependency waves: the ready tasks of a wave run as one batch on persistent harness workers (one
  `WorkerPool` for the whole graph), their outputs are written into the buffers, then the next wave is
  formed. Each job also carries the numpy reference's output as its golden, so pypto's own tensor-graph
  check compares against it. A multi-rank graph (TP > 1, EP) runs one job per task and rank.
* Where a task runs (`placement`): its op's template (`kernels.registry`; for a collective that is its
  local data part, e.g. window_copy_out's copy, whose barriers move no data and are implied by the wave
  order), or at one rank the one-rank form of a collective (`@one_rank_template`: MoE dispatch_meta,
  dispatch_push and combine, whose peers do not exist). Cross-rank collectives (puts, signals, all-to-all,
  reduce-scatter)
  run their numpy reference on all ranks in lockstep: pypto 0.2.0's distributed ops SIGSEGV in the CPU
  simulation and its calculator cannot interpret them (the op's `unsupported` reason is
  reported). pass-verify is positional; an op whose result rows are sets (`OpDef.row_sets`, the top-k with
  tied scores) passes when pypto's rows equal the reference's as sets.
  A one-rank signal op has no peer and does nothing (`no-op`). A local task without a template
  is a `numpy-fallback` (an error with `strict=True`).
* `check_kernels(tg, mode)` compiles (`compile`: to the execute graph) or simulates (`sim`: cost-model
  cycles) every kernel with a pypto form in one batch; the numbers do not matter there, inputs are zeros.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from dspark_ir.ops import get_op
from kernels import registry

from .codegen import (
    RUNTIME_SYMBOLS,
    Template,
    find_template,
    inout_input_name,
    kernel_module,
    kernel_spec,
    op_definition,
    template_of,
)
from .errors import LoweringError
from .executors import Memory, kernel_attrs, operand_arrays, rank_memories, rank_results, reference_of, run_task
from .taskgraph import Task, TaskGraph

# Where a task runs under the pypto executor (`TaskRun.backend`).
PYPTO = "pypto"
COLLECTIVE = "numpy-collective"   # a cross-rank op: its numpy reference on all ranks (pypto cannot run it on CPU)
NOOP = "no-op"                    # a signal op at one rank: no peer, nothing to compute
FALLBACK = "numpy-fallback"       # a local op without a pypto template (a gap)
DUMMY = "dummy"
CROSS_RANK_WHY = ("cross-rank collectives run their numpy reference on all ranks in lockstep: pypto 0.2.0 expresses "
                  "remote stores and signals only with pypto.distributed / shmem ops, which compile but SIGSEGV in "
                  "the CPU cost-model simulation, and its host calculator cannot interpret them (no numbers on CPU)")


@dataclass
class TaskRun:
    """How one task ran under the pypto executor (or a compile/sim check)."""

    id: int
    name: str
    backend: str                  # pypto | numpy-collective | no-op | numpy-fallback | dummy
    ok: bool = True
    cycles: int | None = None
    pypto_tasks: int | None = None
    wall_s: float = 0.0
    max_abs_err: float | None = None   # pypto output vs the numpy reference on the same inputs
    verify_ok: bool | None = None      # pypto's tensor-graph + pass verify rows all PASS
    verify_as_sets: bool = False       # pypto's positional verify FAILED, the rows equal the reference's as sets
    verify_open: bool = False          # pypto's verify FAILED, the entries the contract fixes (all but the op's
                                       # open_entries) equal the reference's within pypto's verify tolerance
    error: str = ""
    op: str = ""
    why: str = ""                      # not on pypto: the reason; on pypto through a special form: which
    ranks: int = 1                     # jobs (one per rank) for a pypto task

    def to_json(self) -> dict:
        return dict(self.__dict__)


@dataclass
class PyptoReport:
    runs: list[TaskRun] = field(default_factory=list)
    waves: int = 0
    wall_s: float = 0.0
    jobs: int = 0                  # harness jobs (one per pypto task and rank)
    workers: int = 0               # worker processes started (import pypto once each)

    @property
    def fallbacks(self) -> list[TaskRun]:
        """Local tasks that ran on numpy for want of a template (should be none)."""
        return [r for r in self.runs if r.backend == FALLBACK]

    @property
    def failed(self) -> list[TaskRun]:
        return [r for r in self.runs if not r.ok]

    def by_backend(self, backend: str) -> list[TaskRun]:
        return [r for r in self.runs if r.backend == backend]

    def summary(self) -> str:
        pypto = self.by_backend(PYPTO)
        return (f"{len(pypto)} kernels through pypto ({self.jobs} jobs), "
                f"{len(self.by_backend(COLLECTIVE))} cross-rank collectives on numpy, "
                f"{len(self.by_backend(NOOP))} one-rank no-ops, {len(self.fallbacks)} numpy fallbacks, "
                f"{len(self.failed)} failed, {self.waves} waves, {self.workers} pypto workers, {self.wall_s:.1f} s")

    def details(self) -> list[str]:
        """One line per task that did not run on plain pypto templates: what ran instead, and why."""
        lines = []
        for r in self.runs:
            if r.backend == PYPTO and r.why:
                lines.append(f"pypto ({r.why}): task {r.id} '{r.name}' {r.op}")
            elif r.backend in (COLLECTIVE, FALLBACK, NOOP):
                lines.append(f"{r.backend}: task {r.id} '{r.name}' {r.op}: {r.why}")
        return lines

    def describe(self) -> list[str]:
        """The report for a reader: the summary, the details, failures, pass-verify and the largest error."""
        lines = [f"pypto backend: {self.summary()}"] + [f"  {line}" for line in self.details()]
        if self.by_backend(COLLECTIVE):
            lines.append(f"  ({CROSS_RANK_WHY})")
        lines += [f"  FAILED: task {r.id} '{r.name}' {r.op}: {r.error}" for r in self.failed]
        checked = [r for r in self.by_backend(PYPTO) if r.verify_ok is not None]
        if checked:
            errs = [r for r in checked if r.max_abs_err is not None]
            worst = max(errs, key=lambda r: r.max_abs_err) if errs else None
            lines.append(f"  pass-verify: {sum(r.verify_ok for r in checked)}/{len(checked)} pypto tasks PASS"
                         + (f"; largest |pypto - numpy reference| {worst.max_abs_err:.3g} (task {worst.id} "
                            f"'{worst.name}')" if worst else ""))
            lines += [f"  pass-verify PASS as row sets: task {r.id} '{r.name}' {r.op} (pypto's positional verify "
                      f"FAILED on the order of tied entries)" for r in checked if r.verify_as_sets]
            lines += [f"  pass-verify PASS on the fixed entries: task {r.id} '{r.name}' {r.op} (pypto's verify "
                      f"FAILED on entries the op's contract leaves open)" for r in checked if r.verify_open]
            for r in checked:
                if not r.verify_ok:
                    err = "n/a" if r.max_abs_err is None else f"{r.max_abs_err:.3g}"
                    lines.append(f"  pass-verify FAILED: task {r.id} '{r.name}' {r.op} "
                                 f"(|pypto - numpy reference| {err})")
        return lines


def kernel_job(task: Task, tg: TaskGraph, mem: Memory, mode: str, golden: bool | Mapping[str, np.ndarray],
         runtime_symbols, source: str | None = None) -> Any:
    """The harness job of one task on one rank's memory. `golden`: True = the numpy reference's outputs
    (a local op), or the goldens themselves (a collective's rank share). Arrays the kernel does not take
    (a one-rank form leaves its signal window alone) are left out."""
    from kernels.pypto_rt import KernelJob

    placed = placement(task, tg)
    template = placed[2] if placed[0] == PYPTO else None
    params = None if template is None else {t.name for t in kernel_spec(task, runtime_symbols).params()}
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
    if params is not None:
        inputs = {k: v for k, v in inputs.items() if k in params}
        outputs = {k: v for k, v in outputs.items() if k in params}
    if golden is True:
        goldens = _reference_outputs(task, mem)
    elif golden:
        goldens = dict(golden)
    goldens = {k: v for k, v in goldens.items() if k in outputs}
    source = source if source is not None else task_source(task, tg, runtime_symbols)
    return KernelJob(source, task.kernel, inputs, outputs, mode=mode, label=task.name, goldens=goldens)


def placement(task: Task, tg: TaskGraph) -> tuple[str, str, Template | None]:
    """(backend, why, template) of a task under the pypto executor (see the module doc)."""
    if task.is_dummy:
        return DUMMY, "", None
    template = template_of(task, tg)
    if template is not None:
        if not task.collective:
            return PYPTO, "", template
        if template is find_template(task):
            return PYPTO, "local part of a collective; its barriers move no data", template
        return PYPTO, "one-rank form of a collective", template
    if tg.ranks == 1 and get_op(task.op).lowers_to == "signal":
        return NOOP, "signal op at one rank: no peer, nothing to compute", None
    opdef = op_definition(task.op) if task.family else None
    reason = registry.unsupported_reason(opdef) if opdef is not None else None
    if task.collective and tg.ranks == 1:
        return COLLECTIVE, "no one-rank pypto form" + (f": {_one_rank_reason(reason)}" if reason else ""), None
    if task.collective:
        return COLLECTIVE, _short_reason(reason) if reason else "cross-rank collective", None
    return FALLBACK, _short_reason(reason) if reason else "no pypto 0.2.0 template for this op yet", None


def _one_rank_reason(reason: str) -> str:
    """The sentences of an unsupported reason about the one-rank case (they mention EP1 or one rank)."""
    sentences = [x.strip() for x in reason.split(". ")]
    picked = [x for x in sentences if "EP1" in x or "one rank" in x.lower()]
    return ". ".join(picked) if picked else _short_reason(reason)


def _short_reason(reason: str) -> str:
    """The first clause of an unsupported reason (what the op does across ranks)."""
    return reason.split(";")[0].strip()


def task_source(task: Task, tg: TaskGraph, runtime_symbols: Iterable[str] = RUNTIME_SYMBOLS) -> str:
    """The kernel module the pypto executor runs for `task`: the emitted file's text (kernel_module; at one rank
    a collective's one-rank form, see find_template)."""
    return kernel_module(task, tg, runtime_symbols=tuple(runtime_symbols))


def _reference_outputs(task: Task, mem: Memory) -> dict[str, np.ndarray]:
    """The numpy reference's results on the task's current inputs, by kernel parameter name."""
    return _by_param(task, reference_of(task)(*operand_arrays(task, mem), **kernel_attrs(task)))


def _collective_outputs(task: Task, mems: Sequence[Memory]) -> list[dict[str, np.ndarray]]:
    """A collective reference's results on every rank's current inputs: one dict per rank."""
    per_rank = [operand_arrays(task, m) for m in mems]
    results = reference_of(task)(per_rank, ranks=len(mems), **kernel_attrs(task))
    return [_by_param(task, out) for out in results]


def _by_param(task: Task, out: Any) -> dict[str, np.ndarray]:
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


def runs_on_pypto(task: Task, tg: TaskGraph) -> bool:
    """Does the pypto executor run this task in pypto (see `placement`)?"""
    return placement(task, tg)[0] == PYPTO


def run_pypto(tg: TaskGraph, inputs, *, strict: bool = False, workers: int = 2, timeout: float = 300.0,
              runtime_symbols: Iterable[str] = RUNTIME_SYMBOLS, report: PyptoReport | None = None,
              mode: str = "full", sources: Mapping[int, str] | None = None,
              progress: Callable[[int], Any] | None = None):
    """Execute the task graph with every kernel that has a pypto form running in pypto 0.2.0 (module doc).

    Returns the outputs like `run_numpy`; details (per-task errors, cycles, what ran on numpy and why) go
    to `report`. `sources` (task id → kernel module text) replaces the templates' rendering of the tasks
    that use their family's template, e.g. the emitted files. `strict`: a local task without a pypto
    template is an error instead of a numpy fallback. The harness workers persist across the waves.
    `progress(total)` makes a tqdm-like bar (update, close), advanced by each wave's tasks.
    """
    from kernels.pypto_rt import WorkerPool

    runtime_symbols = tuple(runtime_symbols)
    report = report if report is not None else PyptoReport()
    start = time.perf_counter()
    mems, single = rank_memories(tg, inputs)
    pending: list[tuple[TaskRun, Any, Any, Any]] = []  # (run, result, goldens, open masks): verify rows come when
    # the workers exit
    pool = WorkerPool(workers, timeout)
    bar = progress(len(tg.tasks)) if progress is not None else None
    try:
        for wave in _waves(tg):
            report.waves += 1
            on_pypto = []
            for t in (tg.tasks[i] for i in wave):
                backend, why, template = placement(t, tg)
                if backend == PYPTO:
                    on_pypto.append((t, why, template))
                    continue
                if backend == FALLBACK and strict:
                    raise LoweringError(f"no pypto template for op '{t.op}'", f"task {t.id} '{t.name}'")
                if backend != DUMMY:
                    run_task(t, mems)  # collectives, one-rank no-ops and fallbacks: numpy, all ranks in lockstep
                report.runs.append(TaskRun(t.id, t.name, backend, op=t.op, why=why))
            if on_pypto:
                _run_wave(tg, on_pypto, mems, pool, mode, runtime_symbols, sources or {}, report, pending)
            if bar is not None:
                bar.update(len(wave))
    finally:
        if bar is not None:
            bar.close()
        try:
            pool.close()
        finally:
            report.workers += pool.started
            for run, res, goldens, masks in pending:  # every rank's rows must pass
                as_sets = not res.verify_ok and bool(res.verify) and row_sets_equal(run.op, res.outputs, goldens)
                run.verify_as_sets = run.verify_as_sets or as_sets
                fixed = not res.verify_ok and bool(res.verify) and fixed_entries_close(res.outputs, goldens, masks)
                run.verify_open = run.verify_open or fixed
                ok = res.verify_ok or as_sets or fixed
                run.verify_ok = ok if run.verify_ok is None else run.verify_ok and ok
            report.wall_s = time.perf_counter() - start
    return rank_results(mems, single)


def _run_wave(tg, on_pypto, mems, pool, mode, runtime_symbols, sources, report, pending) -> None:
    placed, jobs = [], []
    for t, why, template in on_pypto:
        if t.collective:  # a local form: the goldens are the collective reference's share of each rank
            goldens = _collective_outputs(t, mems)
        else:
            goldens = [True] * len(mems)
        source = sources.get(t.id)
        for mem, golden in zip(mems, goldens):  # one job per task and rank
            placed.append((t, why, mem))
            jobs.append(kernel_job(t, tg, mem, mode, golden, runtime_symbols, source))
    report.jobs += len(jobs)
    results = pool.run(jobs)
    runs: dict[int, TaskRun] = {}
    for (t, why, mem), job, res in zip(placed, jobs, results):
        run = runs.get(t.id)
        if run is None:
            run = runs[t.id] = TaskRun(t.id, t.name, PYPTO, op=t.op, why=why, ranks=0)
            report.runs.append(run)
        run.ranks += 1
        run.cycles = res.cycles if run.cycles is None else max(run.cycles, res.cycles or 0)
        run.pypto_tasks = run.pypto_tasks if run.pypto_tasks is not None else res.tasks
        run.wall_s += res.wall_s
        if not res.ok:
            run.ok, run.error = False, res.error or "failed"
        elif res.clobbered:
            run.ok, run.error = False, f"pypto changed inputs {res.clobbered}"
        else:
            masks = open_entries(t, mem)
            err = _max_err(res.outputs, job.goldens, sort_rows=get_op(t.op).row_sets, masks=masks)
            if err is not None:
                run.max_abs_err = err if run.max_abs_err is None else max(run.max_abs_err, err)
            pending.append((run, res, job.goldens, masks))
            _store(t, mem, res.outputs)
    for run in runs.values():
        if not run.ok:
            raise LoweringError(f"pypto kernel failed: {run.error}", f"task {run.id} '{run.name}'")


def _store(task: Task, mem: Memory, outputs: Mapping[str, np.ndarray]) -> None:
    for a in task.args:
        if a.writes and a.param in outputs:  # a one-rank form does not take its signal window
            mem.write(a.view, outputs[a.param], task, f"%{a.value}")


def row_sets_equal(op: str, outputs: Mapping[str, np.ndarray], goldens: Mapping[str, np.ndarray]) -> bool:
    """pypto's pass-verify compares positionally; for an op whose result rows are sets (OpDef.row_sets: the
    top-k with tied scores) a FAILED verify stands only if some row differs as a set from the reference's."""
    if not get_op(op).row_sets or not goldens:
        return False
    for name, golden in goldens.items():
        got, want = np.asarray(outputs[name]), np.asarray(golden)
        if got.shape != want.shape or not np.array_equal(np.sort(got, axis=-1), np.sort(want, axis=-1)):
            return False
    return True


# pypto's pass-verify tolerance (kernels.pypto_rt.job: pass_verify_error_tol, rtol = atol = 1e-3 by default), used
# for the entries an op's contract fixes when pypto's own verify failed on its open entries
VERIFY_RTOL = VERIFY_ATOL = 1e-3


def open_entries(task: Task, mem: Memory) -> dict[str, np.ndarray]:
    """{output param: boolean mask of the entries the op's contract leaves open (OpDef.open_entries)}, on the
    task's current inputs in `mem` (read before the task's results are stored); empty for ops without any."""
    fn = get_op(task.op).open_entries
    if fn is None or task.collective:
        return {}
    return _by_param(task, fn(*operand_arrays(task, mem), **kernel_attrs(task)))


def fixed_entries_close(outputs: Mapping[str, np.ndarray], goldens: Mapping[str, np.ndarray],
                        masks: Mapping[str, np.ndarray]) -> bool:
    """pypto's verify compares every entry; for an op with open entries (OpDef.open_entries: e.g. idx_score's tail,
    which upstream never writes) a FAILED verify stands only if some fixed entry differs from the reference's by
    more than pypto's verify tolerance."""
    if not masks or not goldens:
        return False
    for name, golden in goldens.items():
        got, want = np.asarray(outputs[name]), np.asarray(golden)
        fixed = ~masks[name] if name in masks else np.ones(want.shape, bool)
        if got.shape != want.shape or not np.allclose(got[fixed], want[fixed], rtol=VERIFY_RTOL, atol=VERIFY_ATOL):
            return False
    return True


def _max_err(outputs: Mapping[str, np.ndarray], goldens: Mapping[str, np.ndarray],
             sort_rows: bool = False, masks: Mapping[str, np.ndarray] | None = None) -> float | None:
    worst = None
    for name, golden in goldens.items():
        got = np.asarray(outputs[name]).astype(np.float64)
        want = np.asarray(golden).astype(np.float64)
        if sort_rows and got.shape == want.shape:   # row sets (OpDef.row_sets): compare rows as sets
            got, want = np.sort(got, axis=-1), np.sort(want, axis=-1)
        if masks and name in masks and got.shape == want.shape:   # open entries: any value is right
            got, want = got[~masks[name]], want[~masks[name]]
        both_nan = np.isnan(got) & np.isnan(want)
        diff = np.where(both_nan, 0.0, np.abs(got - want))
        err = float(np.max(diff)) if diff.size else 0.0
        worst = err if worst is None else max(worst, err)
    return worst


def check_kernels(tg: TaskGraph, mode: str = "compile", *, tasks: Sequence[int] | None = None,
                  workers: int = 2, timeout: float = 300.0, runtime_symbols: Iterable[str] = RUNTIME_SYMBOLS,
                  progress: Callable[[int], Any] | None = None) -> list[TaskRun]:
    """Compile (`compile`) or simulate (`sim`, cycles) every kernel the pypto executor runs in pypto
    (`placement`: templates, local parts of collectives, one-rank forms); inputs are zeros.

    The results also fill each task's `cycles` / `pypto_tasks` (sim mode). With `progress(total)` (a tqdm-like bar:
    update, close) the jobs go to the workers in batches of `workers` and the bar advances per batch."""
    from kernels.pypto_rt import WorkerPool, run_jobs

    chosen = [tg.tasks[i] for i in tasks] if tasks is not None else list(tg.tasks)
    todo = [t for t in chosen if runs_on_pypto(t, tg)]
    jobs = [zeros_job(t, tg, mode, runtime_symbols) for t in todo]
    workers = min(workers, max(1, len(jobs)))
    if progress is None or not jobs:
        results = run_jobs(jobs, timeout, workers=workers) if jobs else []
    else:
        results, bar = [], progress(len(jobs))
        try:
            with WorkerPool(workers, timeout) as pool:
                for i in range(0, len(jobs), workers):
                    results += pool.run(jobs[i:i + workers])
                    bar.update(len(jobs[i:i + workers]))
        finally:
            bar.close()
    runs = []
    for t, res in zip(todo, results):
        runs.append(TaskRun(t.id, t.name, PYPTO, res.ok, res.cycles, res.tasks, res.wall_s, error=res.error or "",
                            op=t.op, why=placement(t, tg)[1]))
        if res.ok and mode != "compile":
            t.cycles, t.pypto_tasks = res.cycles, res.tasks
    return runs


def zeros_job(task: Task, tg: TaskGraph, mode: str = "compile", runtime_symbols: Iterable[str] = RUNTIME_SYMBOLS):
    """The harness job of `task` (as the pypto executor would render it) on zeros: (shape, dtype) specs, which
    the worker makes itself (uninitialised in compile mode), so flash-sized arguments are not shipped."""
    from kernels.pypto_rt import KernelJob

    runtime_symbols = tuple(runtime_symbols)
    spec = kernel_spec(task, runtime_symbols)
    params = {t.name for t in spec.params()}
    inputs = {a.param if a.direction == "in" else inout_input_name(a.param): (tuple(a.shape), np_dtype(a.dtype))
              for a in task.args if a.reads}
    outputs = {a.param: (tuple(a.shape), np_dtype(a.dtype)) for a in task.args if a.writes}
    inputs = {k: v for k, v in inputs.items() if k in params}
    outputs = {k: v for k, v in outputs.items() if k in params}
    return KernelJob(task_source(task, tg, runtime_symbols), task.kernel, inputs, outputs, mode=mode,
                     label=task.name)


def np_dtype(name: str) -> np.dtype:
    from dspark_ir.semantics.dtypes import NP_DTYPES

    return np.dtype(NP_DTYPES[name])

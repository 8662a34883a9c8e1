"""Where a task's cost comes from: pypto's cost model (cached by kernel source hash), the roofline, or a stub.

A cost source maps the tasks of a task graph to `KernelCost`s:

    costs = PyptoCosts().costs(tg)            # {task id: KernelCost}, cost model + roofline fallback
    costs = RooflineCosts().costs(tg)         # roofline only (no pypto)
    costs = FunctionCosts(fn).costs(tg)       # tests: fn(task) -> KernelCost

What a pypto-sourced cost holds (read from the SIM run's `_simulate.swim.json`, per-core task spans):
* `span`: cycles from the kernel's first pypto task start to its last task end, i.e. the kernel's own
  makespan with the whole chip, *without* the program start-up before the first task (a constant ~9.4 k
  cycles per pypto program that a task inside a layer program does not pay; `total` keeps pypto's
  `Total Cycles` with it);
* `work_cube` / `work_vector`: the busy cycles summed over the AIC / AIV lanes (the kernel's work);
* `pypto_tasks`: how many tasks pypto's graph partitioning made.
A task without a pypto template (or whose pypto run failed) gets a roofline estimate instead, flagged
`source = "roofline"` with the reason in `note`: its span is `roofline.blocked_bound` (the task's
bytes and arithmetic on min(blocks, cores) cores), its work span × those cores.

The cache: `$DSPARK_CACHE_DIR/perf-costs/<key>.json` (default `~/.cache/dspark`); the key hashes the
kernel's source generated under the function name `kernel` (lowering.codegen.generate; tasks of different
names with the same body share an entry), the argument shapes and dtypes, pypto's version and `EXTRACTOR_VERSION`.
Failures are cached too (a template error stays an error until the source changes), except timeouts
and crashed workers.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping, Protocol

import numpy as np

from dspark_ir.hardware import HARDWARE, Hardware
from lowering.taskgraph import Task, TaskGraph

from .roofline import blocked_bound, task_work

EXTRACTOR_VERSION = 1
SOURCES = ("pypto", "roofline", "dummy", "given")


@dataclass(frozen=True)
class KernelCost:
    source: str                       # pypto | roofline | dummy | given
    span: float                       # cycles: the kernel's makespan on a whole chip (first task start → last end)
    work_cube: float = 0.0            # busy AIC cycles
    work_vector: float = 0.0          # busy AIV cycles
    total: float | None = None        # pypto "Total Cycles" (program start-up included)
    pypto_tasks: int | None = None
    note: str = ""                    # why roofline (no template, pypto error), or the limit of a roofline estimate

    @property
    def work(self) -> float:
        return self.work_cube + self.work_vector

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(d: Mapping) -> "KernelCost":
        return KernelCost(**{k: d[k] for k in KernelCost.__dataclass_fields__ if k in d})


DUMMY = KernelCost("dummy", 0.0)


class CostSource(Protocol):
    name: str

    def costs(self, tg: TaskGraph, tasks: Iterable[int] | None = None,
              progress: Callable[[int, int], None] | None = None) -> dict[int, KernelCost]: ...


# ---- roofline ------------------------------------------------------------------------------------------
def roofline_cost(task: Task, hw: Hardware = HARDWARE, note: str = "") -> KernelCost:
    """The task's blocked roofline as a cost: span = its bound on min(blocks, cores) cores."""
    if task.is_dummy:
        return DUMMY
    if task.blocks <= 0:
        return KernelCost("roofline", 0.0, note=note or "zero blocks")
    b = blocked_bound(task_work(task), task.core, task.blocks, hw)
    span = b.cycles(hw)
    n = max(1, min(task.blocks, hw.cores(task.core) or 1))
    cube, vector = {"cube": (span * n, 0.0), "vector": (0.0, span * n), "mix": (span * n, 2 * span * n)}.get(
        task.core, (0.0, span * n))
    why = note or "no pypto template"
    return KernelCost("roofline", span, cube, vector, note=f"{why}; {b.limit}-bound")


class RooflineCosts:
    """Every kernel from its blocked roofline (no pypto)."""

    name = "roofline"

    def __init__(self, hw: Hardware = HARDWARE):
        self.hw = hw

    def costs(self, tg, tasks=None, progress=None):
        chosen = list(tasks) if tasks is not None else [t.id for t in tg.tasks]
        return {i: roofline_cost(tg.tasks[i], self.hw, "roofline source") for i in chosen}


class FunctionCosts:
    """Costs from a function of the task (unit tests, what-if studies)."""

    name = "given"

    def __init__(self, fn: Callable[[Task], KernelCost | float]):
        self.fn = fn

    def costs(self, tg, tasks=None, progress=None):
        out = {}
        for i in (list(tasks) if tasks is not None else range(len(tg.tasks))):
            t = tg.tasks[i]
            if t.is_dummy:
                out[i] = DUMMY
                continue
            c = self.fn(t)
            out[i] = c if isinstance(c, KernelCost) else KernelCost("given", float(c),
                                                                      *_even_work(t, float(c)))
        return out


def _even_work(task: Task, span: float) -> tuple[float, float]:
    """Work that keeps a lone task at `span`: span × its blocks, on its core kind."""
    n = max(task.blocks, 1)
    if task.core == "cube":
        return span * n, 0.0
    if task.core == "mix":
        return span * n, 2 * span * n
    return 0.0, span * n


# ---- pypto ---------------------------------------------------------------------------------------------
def cache_dir() -> Path:
    base = os.environ.get("DSPARK_CACHE_DIR")
    root = Path(base) if base else Path.home() / ".cache" / "dspark"
    return root / "perf-costs"


def _pypto_version() -> str:
    try:
        from importlib.metadata import version

        return version("pypto")
    except Exception:  # noqa: BLE001 - no pypto: the key still works, runs will fail
        return "none"


def kernel_source(task: Task, tg: TaskGraph | None = None) -> str | None:
    """The task's pypto module with its function named `kernel` (None without a template): the text the cache
    key hashes. `tg`: the task's graph, whose resolved templates are used (lowering.codegen.template_of)."""
    from kernels.pto import module_prelude
    from lowering.codegen import RUNTIME_SYMBOLS, find_template, generate, template_of

    template = find_template(task) if tg is None else template_of(task, tg)
    if template is None:
        return None
    return module_prelude() + "\n\n" + generate(task, template, RUNTIME_SYMBOLS, name="kernel")


def cost_key(task: Task, source: str) -> str:
    shapes = [(a.param, a.direction, a.dtype, list(a.shape)) for a in task.args]
    text = json.dumps({"source": source, "args": shapes, "pypto": _pypto_version(), "v": EXTRACTOR_VERSION},
                      sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def parse_swimlane(path: Path) -> dict:
    """first start, last end and busy cycles per core kind from `_simulate.swim.json`."""
    lanes = json.loads(Path(path).read_text())
    first, last, busy = None, 0.0, {"cube": 0.0, "vector": 0.0}
    for lane in lanes:
        kind = "cube" if str(lane.get("coreType", "")).upper().startswith("AIC") else "vector"
        for t in lane.get("tasks", []):
            s, e = float(t["execStart"]), float(t["execEnd"])
            first = s if first is None else min(first, s)
            last = max(last, e)
            busy[kind] += max(0.0, e - s)
    return {"first": first or 0.0, "last": last, "cube": busy["cube"], "vector": busy["vector"]}


def _zeros(shape, dtype: str) -> np.ndarray:
    from dspark_ir.semantics.dtypes import NP_DTYPES

    return np.zeros(shape, NP_DTYPES[dtype])


class PyptoCosts:
    """Cost-model costs for every templated kernel (sim mode, cached), roofline for the rest."""

    name = "pypto"

    def __init__(self, hw: Hardware = HARDWARE, *, workers: int = 2, timeout: float = 1800.0,
                 cache: str | os.PathLike | None = None, batch: int = 4, offline: bool = False):
        self.hw = hw
        self.workers = workers
        self.timeout = timeout
        self.cache = Path(cache) if cache is not None else cache_dir()
        self.batch = max(1, batch)
        self.offline = offline        # never run pypto: cache hits or roofline
        self.ran = 0                  # kernels simulated by this object (cache misses)
        self.hits = 0

    # ---- cache ---------------------------------------------------------------------------------------
    def _load(self, key: str) -> KernelCost | None:
        path = self.cache / f"{key}.json"
        try:
            return KernelCost.from_json(json.loads(path.read_text()))
        except (OSError, ValueError, TypeError, KeyError):
            return None

    def _store(self, key: str, cost: KernelCost, task: Task) -> None:
        self.cache.mkdir(parents=True, exist_ok=True)
        doc = dict(cost.to_json(), op=task.op, example=task.name)
        fd, tmp = tempfile.mkstemp(dir=self.cache, prefix=f".{key}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1)
        os.replace(tmp, self.cache / f"{key}.json")

    # ---- the source ----------------------------------------------------------------------------------
    def plan(self, tg: TaskGraph, tasks: Iterable[int] | None = None) -> tuple[dict, list]:
        """(costs known without running pypto, [(task id, key, source)] still to simulate)."""
        known: dict[int, KernelCost] = {}
        todo: list[tuple[int, str, str]] = []
        seen: dict[str, int] = {}
        for i in (list(tasks) if tasks is not None else range(len(tg.tasks))):
            t = tg.tasks[i]
            if t.is_dummy:
                known[i] = DUMMY
                continue
            if t.collective:
                known[i] = roofline_cost(t, self.hw, "collective (pypto cannot simulate it on one process)")
                continue
            src = kernel_source(t, tg)
            if src is None:
                known[i] = roofline_cost(t, self.hw, "no pypto template")
                continue
            key = cost_key(t, src)
            hit = self._load(key)
            if hit is not None:
                self.hits += 1
                known[i] = hit if hit.source == "pypto" else roofline_cost(t, self.hw, hit.note)
                continue
            if key not in seen:
                seen[key] = i
                todo.append((i, key, src))
        return known, todo

    def costs(self, tg, tasks=None, progress=None):
        chosen = list(tasks) if tasks is not None else list(range(len(tg.tasks)))
        known, todo = self.plan(tg, chosen)
        if todo and not self.offline:
            self._simulate(tg, todo, progress)
            known, todo = self.plan(tg, chosen)
        for i, _key, _src in todo:      # offline, or a run that did not store (timeouts)
            known[i] = roofline_cost(tg.tasks[i], self.hw, "no cached cost-model result" if self.offline
                                     else "pypto run did not finish")
        for i in chosen:                # tasks sharing a key with a simulated one
            if i not in known:
                known[i] = roofline_cost(tg.tasks[i], self.hw, "pypto run did not finish")
        return {i: known[i] for i in chosen}

    def _simulate(self, tg: TaskGraph, todo: list, progress) -> None:
        from kernels.pypto_rt import KernelJob, run_jobs

        done = 0
        for start in range(0, len(todo), self.batch):
            chunk = todo[start:start + self.batch]
            jobs = []
            for i, key, src in chunk:
                t = tg.tasks[i]
                inputs = {(a.param if a.direction == "in" else f"{a.param}_in"): _zeros(a.shape, a.dtype)
                          for a in t.args if a.reads}
                outputs = {a.param: _zeros(a.shape, a.dtype) for a in t.args if a.writes}
                jobs.append(KernelJob(src, "kernel", inputs, outputs, mode="sim", label=f"{t.op}-{key[:8]}"))
            art = Path(tempfile.mkdtemp(prefix="dspark-perf-"))
            try:
                results = run_jobs(jobs, self.timeout, workers=min(self.workers, len(jobs)), artifacts_dir=art)
                for (i, key, _src), res in zip(chunk, results):
                    self._record(tg.tasks[i], key, res)
            finally:
                shutil.rmtree(art, ignore_errors=True)
            done += len(chunk)
            self.ran += len(chunk)
            if progress is not None:
                progress(done, len(todo))

    def _record(self, task: Task, key: str, res) -> None:
        if not res.ok:
            error = (res.error or "failed").splitlines()[0][:300]
            if "timed out" in error or "timeout" in error.lower() or "crash" in error.lower():
                return                  # transient: retry next time
            self._store(key, KernelCost("roofline", 0.0, note=f"pypto failed: {error}"), task)
            return
        lanes = _swimlane(res.artifacts)
        if lanes is None:
            span = float(res.cycles or 0)
            cost = KernelCost("pypto", span, *_even_work(task, span), total=res.cycles, pypto_tasks=res.tasks,
                              note="no swimlane: span = Total Cycles")
        else:
            cost = KernelCost("pypto", lanes["last"] - lanes["first"], lanes["cube"], lanes["vector"],
                              total=res.cycles, pypto_tasks=res.tasks)
        self._store(key, cost, task)


def _swimlane(artifacts: Path | None) -> dict | None:
    if artifacts is None:
        return None
    found = sorted(Path(artifacts).glob("*/CostModelSimulationOutput/_simulate.swim.json"))
    if not found:
        return None
    parsed = [parse_swimlane(p) for p in found]
    if len(parsed) == 1:
        return parsed[0]
    # several pypto calls (never seen for one kernel): count them back to back
    return {"first": 0.0, "last": sum(p["last"] - p["first"] for p in parsed),
            "cube": sum(p["cube"] for p in parsed), "vector": sum(p["vector"] for p in parsed)}

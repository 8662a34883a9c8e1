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
A collective is costed from its local part (its template, or its cost form `kernels.registry.cost_template`:
one rank's share of the work), noted `LOCAL_PART_NOTE`. A task without either (or whose pypto run failed) gets
a roofline estimate instead, flagged
`source = "roofline"` with the reason in `note`: its span is `roofline.blocked_bound` (the task's
bytes and arithmetic on min(blocks, cores) cores), its work span × those cores.

The cache: `$DSPARK_CACHE_DIR/perf-costs/<key>.json` (default `~/.cache/dspark`), or any directory given as
`cache=` (`--cost-cache DIR`). It is content-addressed: the key hashes everything that changes the answer, namely
the kernel's source generated under the function name `kernel` (lowering.codegen.generate; tasks of different
names with the same body share an entry), the argument shapes and dtypes, pypto's version, a digest of pypto's
cost-model configuration files (the modelled chip's constants, `cost_model()`) and `EXTRACTOR_VERSION` (bump it
when what we run or how we read the result changes). So several machines can share one directory on shared
storage: an entry is written to a temporary file beside it and renamed into place (atomic on POSIX file systems,
NFS included), concurrent writers of one key write the same answer, and a reader never sees a partial file.
Failures are cached too (a template error stays an error until the source changes), except timeouts and crashed
workers.

Simulations run on an executor (perf/executors.py): this machine's pypto workers by default, or a Dask cluster.
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Callable, Iterable, Mapping, Protocol

import numpy as np

from dspark_ir.hardware import HARDWARE, Hardware
from lowering.taskgraph import Task, TaskGraph

from .executors import Executor, LocalExecutor, SimJob, SimOutcome
from .roofline import blocked_bound, task_work

EXTRACTOR_VERSION = 2     # 2: spans over the AIC/AIV lanes only (pypto's HUB control tasks left out)
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


def cost_model() -> dict[str, str]:
    """The cost model an answer comes from: pypto's version and a digest of its cost-model configuration files
    (`pypto/lib/configs`: the chip's cores, rates and latencies), read without importing pypto."""
    return dict(_installed_cost_model())


@functools.cache
def _installed_cost_model() -> dict[str, str]:
    try:
        from importlib.metadata import distribution

        dist = distribution("pypto")
        configs = Path(str(dist.locate_file("pypto"))) / "lib" / "configs"
        digest = hashlib.sha256()
        for path in sorted(p for p in configs.rglob("*") if p.is_file()):
            digest.update(path.relative_to(configs).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
        return {"pypto": dist.version, "model": digest.hexdigest()[:16]}
    except Exception:  # noqa: BLE001 - no pypto: the key still works, runs will fail
        return {"pypto": "none", "model": "none"}


def kernel_source(task: Task, tg: TaskGraph | None = None) -> str | None:
    """The task's pypto module with its function named `kernel` (None without a template): the text the cache
    key hashes. `tg`: the task's graph, whose resolved templates are used (lowering.codegen.template_of)."""
    from kernels.pto import module_prelude
    from lowering.codegen import RUNTIME_SYMBOLS, find_template, generate, template_of

    template = find_template(task) if tg is None else template_of(task, tg)
    if template is None:
        return None
    return module_prelude() + "\n\n" + generate(task, template, RUNTIME_SYMBOLS, name="kernel")


LOCAL_PART_NOTE = ("collective: its local part (pypto); the link transfer and its signal tasks are the schedule's "
                   "(rule 10, chip model), not simulated")


def local_part_source(task: Task) -> str | None:
    """A collective's cost form (kernels.registry.cost_template: its local part at one rank) as the module the
    cost model runs, its function named `kernel`; None without one. Never lowered: only its cost is used."""
    from kernels.pto import module_prelude
    from kernels.registry import cost_template_for
    from lowering.codegen import RUNTIME_SYMBOLS, generate, op_definition

    opdef = op_definition(task.op)
    form = cost_template_for(opdef) if opdef is not None else None
    if form is None:
        return None
    return module_prelude() + "\n\n" + generate(task, form, RUNTIME_SYMBOLS, name="kernel")


def cost_key(task: Task, source: str) -> str:
    """The cache key: a hash of everything that changes the task's cost-model answer."""
    shapes = [(a.param, a.direction, a.dtype, list(a.shape)) for a in task.args]
    text = json.dumps({"source": source, "args": shapes, **cost_model(), "v": EXTRACTOR_VERSION}, sort_keys=True)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


def sim_job(task: Task, key: str, source: str) -> SimJob:
    """The task's kernel through the cost model on zeros (an in-place argument is an output)."""
    from dspark_ir.semantics.dtypes import NP_DTYPES

    def spec(a) -> tuple[tuple[int, ...], str]:
        return tuple(int(d) for d in a.shape), np.dtype(NP_DTYPES[a.dtype]).name

    inputs = {(a.param if a.direction == "in" else f"{a.param}_in"): spec(a) for a in task.args if a.reads}
    outputs = {a.param: spec(a) for a in task.args if a.writes}
    return SimJob(key, source, inputs, outputs, label=f"{task.op}-{key[:8]}", model=cost_model())


class PyptoCosts:
    """Cost-model costs for every templated kernel (sim mode, cached), roofline for the rest."""

    name = "pypto"

    def __init__(self, hw: Hardware = HARDWARE, *, workers: int = 2, timeout: float = 1800.0,
                 cache: str | os.PathLike | None = None, batch: int = 4, offline: bool = False,
                 executor: Executor | None = None):
        self.hw = hw
        self.cache = Path(cache) if cache is not None else cache_dir()
        self.offline = offline        # never run pypto: cache hits or roofline
        self.executor = executor if executor is not None else LocalExecutor(workers, timeout, batch)
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
        try:
            os.fchmod(fd, 0o644)      # mkstemp makes 0600: other users of a shared cache read it too
            with os.fdopen(fd, "w") as f:
                json.dump(doc, f, indent=1)
            os.replace(tmp, self.cache / f"{key}.json")   # atomic: readers see the old state or the whole entry
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

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
            src = kernel_source(t, tg)
            if t.collective and src is None:
                src = local_part_source(t)
            if src is None:
                known[i] = roofline_cost(t, self.hw, "collective (pypto cannot simulate it on one process)"
                                         if t.collective else "no pypto template")
                continue
            key = cost_key(t, src)
            hit = self._load(key)
            if hit is not None:
                self.hits += 1
                if hit.source == "pypto":
                    known[i] = replace(hit, note=LOCAL_PART_NOTE) if t.collective else hit
                else:
                    known[i] = roofline_cost(t, self.hw, hit.note)
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
        missing = "no cached cost-model result" if self.offline else "pypto run did not finish"
        for i, _key, _src in todo:      # offline, or a run that did not store (timeouts)
            known[i] = roofline_cost(tg.tasks[i], self.hw, missing)
        for i in chosen:                # tasks sharing a key with one of those
            if i not in known:
                known[i] = roofline_cost(tg.tasks[i], self.hw, missing)
        return {i: known[i] for i in chosen}

    def _simulate(self, tg: TaskGraph, todo: list, progress) -> None:
        self.simulate([(tg.tasks[i], key, src) for i, key, src in todo], progress)

    def simulate(self, todo: Iterable[tuple[Task, str, str]], progress: Callable[[int, int], None] | None = None,
                 stored: Callable[[str], None] | None = None) -> None:
        """Run (task, key, source) items on the executor; each answer is cached as it arrives, then `stored(key)` is
        called (not for timeouts and crashes, which are not cached). `todo` may be a generator: the executor draws
        items as it has room for them (a sweep lowers its points meanwhile). `progress(done, drawn so far)`."""
        drawn: list[tuple[Task, str, str]] = []

        def jobs():
            for item in todo:
                drawn.append(item)
                yield sim_job(*item)

        done = 0
        for index, outcome in self.executor.run(jobs()):
            task, key, _src = drawn[index]
            if self._record(task, key, outcome) and stored is not None:
                stored(key)
            done += 1
            self.ran += 1
            if progress is not None:
                progress(done, len(drawn))

    def _record(self, task: Task, key: str, res: SimOutcome) -> bool:
        """Cache the outcome of the task's run; False for a transient failure (retried next time)."""
        if not res.ok:
            if res.transient:
                return False
            self._store(key, KernelCost("roofline", 0.0, note=f"pypto failed: {res.error}"), task)
            return True
        lanes = res.lanes
        if lanes is None:
            span = float(res.cycles or 0)
            cost = KernelCost("pypto", span, *_even_work(task, span), total=res.cycles, pypto_tasks=res.tasks,
                              note="no swimlane: span = Total Cycles")
        else:
            cost = KernelCost("pypto", lanes["last"] - lanes["first"], lanes["cube"], lanes["vector"],
                              total=res.cycles, pypto_tasks=res.tasks)
        self._store(key, cost, task)
        return True

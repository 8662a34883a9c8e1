"""Where kernel simulations run: this machine's pypto workers (`local`, the default) or a Dask cluster (`dask`).

    executor = make_executor("dask", scheduler="tcp://HOST:8786", timeout=1800)
    for index, outcome in executor.run(jobs):       # as they finish, in any order
        ...
    executor.close()

A `SimJob` is one kernel's cost-model run (pypto SIM mode on zero inputs). Its `key` is the kernel's cost-cache key
(perf/costs.py: the content hash of everything that changes the answer). A `SimOutcome` is what comes back:
pypto's Total Cycles and task count and the swimlane summary (first task start, last task end, busy cycles per core
kind), read on the machine where the run happened, or a one-line error. Outcomes do not depend on where, in which
order or in which company (batch) the jobs ran.

`jobs` may be any iterable, drawn lazily: a sweep generates a point's kernels only when the executor asks for more,
so the lowering and code generation of later points overlap the simulation of earlier ones. `index` counts the
jobs in the order they were drawn.

local  `kernels.pypto_rt.run_jobs` on this machine: `workers` processes, a fresh pool for every `batch` jobs.
dask   a Dask `distributed` scheduler (`tcp://HOST:PORT`). Each Dask worker runs its jobs in long-lived pypto
       processes that the worker plugin of `perf.dask_worker` keeps (pypto imported once per worker): start
       workers with `dask worker tcp://HOST:PORT --nthreads 1 --preload perf.dask_worker`, or let the client
       register the plugin on workers started without it. Needs the `sweep` extra (dask[distributed]).
       The client keeps `TASKS_PER_THREAD` tasks per worker thread in flight (one running, one queued behind it)
       and draws the next jobs while they run. A task runs one kernel, or several short ones back to back: once
       kernels are known to be short (the workers report each kernel's wall time) a task gets enough of them to
       last about `TASK_SECONDS`, at most `kernels_per_task`, so Dask's per-task cost (scheduling, messages; tens
       of ms on a loaded 2-core machine) is paid once per task rather than once per kernel; the last tasks,
       once every job is drawn, are split so that every worker thread gets a share. A task is named after its
       kernels' cost keys (`task_key`): the same kernel (or the same set of kernels) submitted twice, by two
       clients of one scheduler, runs once; within one run every job is submitted once.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import logging
import os
import re
import shutil
import tempfile
import time
from collections import deque
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Protocol, Sequence

from dspark_ir.errors import DsparkError

EXECUTORS = ("local", "dask")
SCHEDULER_ENV = "DSPARK_SCHEDULER"
TASK_PREFIX = "dspark-sim-"         # the Dask key of a one-kernel task: prefix + cost key
BATCH_PREFIX = "dspark-sims-"       # of a task of several kernels: prefix + hash of their cost keys
KERNELS_PER_TASK = 8                # at most this many (short) kernels in one Dask task
TASK_SECONDS = 2.0                  # a task of short kernels lasts about this long
TASKS_PER_THREAD = 2                # tasks in flight per Dask worker thread: one running, one queued
THREADS_EVERY = 5.0                 # seconds between two counts of the cluster's worker threads
CONNECT_TIMEOUT = 20.0              # seconds to reach the scheduler
_ADDRESS = re.compile(r"^(tcp|tls)://(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):(\d{1,5})$")


class ExecutorError(DsparkError):
    """The executor cannot run: no scheduler, a scheduler that does not answer, a worker that cannot run pypto."""


@dataclass(frozen=True)
class SimJob:
    """One kernel through pypto's cost model: its module (entry `kernel`), zero-filled arguments."""

    key: str                                                    # cost-cache key (perf/costs.py cost_key)
    source: str
    inputs: Mapping[str, tuple[tuple[int, ...], str]]           # name -> (shape, numpy dtype name)
    outputs: Mapping[str, tuple[tuple[int, ...], str]]
    label: str = ""
    model: Mapping[str, str] = field(default_factory=dict)     # the client's pypto + cost model (costs.cost_model)

    def kernel_job(self):
        from kernels.pypto_rt import KernelJob

        return KernelJob(self.source, "kernel", dict(self.inputs), dict(self.outputs), mode="sim", label=self.label)


@dataclass(frozen=True)
class SimOutcome:
    ok: bool
    error: str | None = None          # one line
    cycles: int | None = None         # pypto "Total Cycles"
    tasks: int | None = None          # pypto tasks
    lanes: Mapping[str, float] | None = None   # {first, last, cube, vector} (parse_swimlane), None without one

    @property
    def transient(self) -> bool:
        """A failure that may not happen again (timeout, a worker that died): not worth caching."""
        text = (self.error or "").lower()
        return not self.ok and ("timed out" in text or "timeout" in text or "crash" in text)


CORE_LANES = {"AIC": "cube", "AIV": "vector"}


def parse_swimlane(path: Path) -> dict:
    """first start, last end and busy cycles per core kind from `_simulate.swim.json`, over the AIC and AIV lanes.
    Other lanes are left out: pypto adds 1-cycle control tasks on a `HUB` lane to some kernels, a root before the
    first real task (in the program start-up) and sinks after the last one (its modelled dependency resolution),
    which would put the start-up and that wait into the kernel's span."""
    lanes = json.loads(Path(path).read_text())
    first, last, busy = None, 0.0, {"cube": 0.0, "vector": 0.0}
    for lane in lanes:
        kind = CORE_LANES.get(str(lane.get("coreType", "")).upper()[:3])
        if kind is None:
            continue
        for t in lane.get("tasks", []):
            s, e = float(t["execStart"]), float(t["execEnd"])
            first = s if first is None else min(first, s)
            last = max(last, e)
            busy[kind] += max(0.0, e - s)
    return {"first": first or 0.0, "last": last, "cube": busy["cube"], "vector": busy["vector"]}


def read_swimlanes(artifacts: Path | None) -> dict | None:
    """The swimlane summary of one job's kept pypto output (several pypto calls: back to back)."""
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


def outcome_of(result) -> SimOutcome:
    """A `kernels.pypto_rt.KernelResult` (with its artifacts kept) as a SimOutcome."""
    if not result.ok:
        return SimOutcome(False, (result.error or "failed").splitlines()[0][:300])
    return SimOutcome(True, None, result.cycles, result.tasks, read_swimlanes(result.artifacts))


class Executor(Protocol):
    name: str

    def run(self, jobs: Iterable[SimJob]) -> Iterator[tuple[int, SimOutcome]]:
        """(index of the job in the order drawn, outcome) for every job, as they finish."""

    def describe(self) -> str: ...

    def close(self) -> None: ...


class LocalExecutor:
    """pypto worker processes on this machine (kernels.pypto_rt), `batch` jobs per pool."""

    name = "local"

    def __init__(self, workers: int = 2, timeout: float = 1800.0, batch: int = 4):
        self.workers = max(1, int(workers))
        self.timeout = timeout
        self.batch = max(1, int(batch))

    def run(self, jobs):
        from kernels.pypto_rt import run_jobs

        stream = iter(jobs)
        start = 0
        while chunk := list(itertools.islice(stream, self.batch)):
            art = Path(tempfile.mkdtemp(prefix="dspark-perf-"))
            try:
                results = run_jobs([j.kernel_job() for j in chunk], self.timeout,
                                   workers=min(self.workers, len(chunk)), artifacts_dir=art)
                outcomes = [outcome_of(r) for r in results]
            finally:
                shutil.rmtree(art, ignore_errors=True)
            yield from ((start + k, o) for k, o in enumerate(outcomes))
            start += len(chunk)

    def describe(self) -> str:
        return f"local ({self.workers} pypto workers)"

    def close(self) -> None:
        pass


def task_key(keys: Sequence[str]) -> str:
    """The Dask key of a task that runs these kernels (cost keys): the same on every client, whatever the order."""
    if len(keys) == 1:
        return TASK_PREFIX + keys[0]
    return BATCH_PREFIX + hashlib.sha256("\n".join(sorted(keys)).encode()).hexdigest()[:24]


class TaskSizer:
    """How many kernels the next Dask task runs: one until the workers have reported kernel times, then enough to
    last about `seconds` at the mean time per kernel so far (at most `most`); once every job is drawn, at most an
    even share of what is left over `TASKS_PER_THREAD` tasks per worker thread (no thread idles at the end while
    another runs a long task)."""

    def __init__(self, most: int = KERNELS_PER_TASK, seconds: float | None = None):
        self.most = max(1, int(most))
        self.seconds = float(TASK_SECONDS if seconds is None else seconds)
        self.kernels = 0
        self.spent = 0.0

    def observe(self, seconds: float) -> None:
        self.kernels += 1
        self.spent += max(0.0, float(seconds))

    def size(self, left: int = 0, final: bool = False, threads: int = 1) -> int:
        if self.most == 1 or not self.kernels:
            return 1
        mean = self.spent / self.kernels
        size = self.most if mean <= 0 else max(1, min(self.most, int(self.seconds / mean)))
        if final:
            size = min(size, max(1, -(-left // (TASKS_PER_THREAD * max(1, threads)))))
        return size


class DaskExecutor:
    """Jobs as Dask tasks named after their cost keys, on the workers of a `distributed` scheduler."""

    name = "dask"

    def __init__(self, scheduler: str, timeout: float = 1800.0, *, connect_timeout: float | None = None,
                 calculator: bool = False, kernels_per_task: int = KERNELS_PER_TASK,
                 task_seconds: float | None = None):
        if not _ADDRESS.match(scheduler):
            raise ExecutorError(f"--scheduler '{scheduler}': expected tcp://HOST:PORT (a `dask scheduler` address)")
        if int(kernels_per_task) < 1:
            raise ExecutorError(f"--kernels-per-task: must be at least 1, got {kernels_per_task}")
        distributed = _distributed()
        from . import dask_worker

        connect_timeout = CONNECT_TIMEOUT if connect_timeout is None else connect_timeout
        self.scheduler = scheduler
        self.timeout = timeout
        self.sizer = TaskSizer(kernels_per_task, task_seconds)   # kernel times carry over from run to run
        self.tasks = 0                                           # Dask tasks submitted (all runs)
        with _quiet("distributed"):
            try:
                self.client = distributed.Client(scheduler, timeout=connect_timeout, set_as_default=False)
            except (OSError, TimeoutError, ValueError, TypeError) as exc:
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise ExecutorError(f"--scheduler {scheduler}: cannot reach the Dask scheduler ({reason})") from None
        dask_worker.ensure_plugin(self.client, timeout=timeout, calculator=calculator)

    def run(self, jobs):
        from distributed import as_completed

        from . import dask_worker

        stream = iter(jobs)
        drawn: list[SimJob] = []
        ready: deque[int] = deque()              # drawn, not submitted yet
        running: dict = {}                       # future -> the indices of its jobs
        first: dict[str, int] = {}               # cost key -> the index of the job that runs it
        twins: dict[int, list[int]] = {}         # that index -> later jobs with the same key (not run again)
        answered: dict[str, SimOutcome] = {}
        finished = as_completed(loop=self.client.loop)
        threads, counted = self.threads(), time.monotonic()
        exhausted = False

        def submit(indices: list[int]) -> None:
            chunk = tuple(drawn[i] for i in indices)
            fut = self.client.submit(dask_worker.simulate, chunk, self.timeout,
                                     key=task_key([job.key for job in chunk]), pure=False)
            running[fut] = indices
            finished.add(fut)
            self.tasks += 1

        def answer(fut) -> Iterator[tuple[int, SimOutcome]]:
            for index, outcome in self._answers(fut, running.pop(fut), drawn):
                answered[drawn[index].key] = outcome
                yield index, outcome
                yield from ((twin, outcome) for twin in twins.pop(index, ()))

        try:
            while True:
                if time.monotonic() - counted > THREADS_EVERY:    # workers join (and leave) while we run
                    threads, counted = self.threads(), time.monotonic()
                limit = TASKS_PER_THREAD * threads
                # draw the next job (the caller lowers and generates it) while the tasks in flight run, until
                # every place in flight is taken and the next task is ready to go
                drew = False
                if not exhausted and (len(running) < limit or len(ready) < self.sizer.size()):
                    job = next(stream, None)
                    drew = job is not None
                    exhausted = job is None
                    if drew:
                        index = len(drawn)
                        drawn.append(job)
                        if job.key in answered:
                            yield index, answered[job.key]
                        elif job.key in first:
                            twins.setdefault(first[job.key], []).append(index)
                        else:
                            first[job.key] = index
                            ready.append(index)
                while ready and len(running) < limit:
                    size = self.sizer.size(len(ready), exhausted, threads)
                    if len(ready) < size and not exhausted:
                        break
                    submit([ready.popleft() for _ in range(min(size, len(ready)))])
                if drew:
                    if finished.has_ready():
                        for fut in finished.next_batch(block=False):
                            yield from answer(fut)
                    continue
                if not running:
                    if exhausted and not ready:
                        break
                    continue
                yield from answer(next(finished))
        finally:
            for fut in running:
                fut.release()

    def _answers(self, fut, indices: list[int], drawn: list[SimJob]) -> Iterator[tuple[int, SimOutcome]]:
        """(index, outcome) for the jobs of a finished task (a task that died: a transient failure each)."""
        from distributed.scheduler import KilledWorker

        try:
            answers = fut.result()
        except KilledWorker as exc:       # Dask gave up after workers died on it: retry next run
            crash = SimOutcome(False, f"crash: Dask workers died running it ({exc})"[:300])
            answers = [(crash, 0.0)] * len(indices)
        except DsparkError:
            raise
        except Exception as exc:  # noqa: BLE001 - a harness failure on a worker: one line, the command stops
            labels = ", ".join(drawn[i].label for i in indices)
            raise ExecutorError(f"Dask worker failed on {labels}: {type(exc).__name__}: "
                                f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
        finally:
            fut.release()
        for index, (outcome, seconds) in zip(indices, answers):
            if outcome.ok:
                self.sizer.observe(seconds)
            yield index, outcome

    def workers(self) -> int:
        return len(self.client.scheduler_info().get("workers", {}))

    def threads(self) -> int:
        """Worker threads of the cluster (at least 1: workers may still be joining)."""
        info = self.client.scheduler_info().get("workers", {})
        return max(1, sum(int(w.get("nthreads", 1) or 1) for w in info.values()))

    def describe(self) -> str:
        return f"dask ({self.scheduler}, {self.workers()} workers)"

    def close(self) -> None:
        with _quiet("distributed"):
            self.client.close()


def make_executor(name: str | None = None, *, scheduler: str | None = None, workers: int = 2,
                  timeout: float = 1800.0, batch: int = 4, kernels_per_task: int = KERNELS_PER_TASK) -> Executor:
    """`local` or `dask`; no name: dask when a scheduler is given (or DSPARK_SCHEDULER is set), local otherwise."""
    scheduler = scheduler or None
    if name is None:
        name = "dask" if (scheduler or os.environ.get(SCHEDULER_ENV)) else "local"
    if name == "local":
        if scheduler:
            raise ExecutorError("--scheduler applies to --executor dask, not local")
        return LocalExecutor(workers, timeout, batch)
    if name == "dask":
        address = scheduler or os.environ.get(SCHEDULER_ENV)
        if not address:
            raise ExecutorError(f"--executor dask needs --scheduler tcp://HOST:PORT (or {SCHEDULER_ENV})")
        return DaskExecutor(address, timeout, kernels_per_task=kernels_per_task)
    raise ExecutorError(f"--executor: unknown executor '{name}' (choose {' or '.join(EXECUTORS)})")


def _distributed():
    try:
        import distributed
    except ImportError:
        raise ExecutorError("the dask executor needs dask[distributed]: pip install -e '.[sweep]'") from None
    return distributed


@contextmanager
def _quiet(logger: str):
    """Keep a library's log lines off stderr while it works (our errors are one line)."""
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)

"""Where kernel simulations run: this machine's pypto workers (`local`, the default) or a Dask cluster (`dask`).

    executor = make_executor("dask", scheduler="tcp://HOST:8786", timeout=1800)
    for index, outcome in executor.run(jobs):       # as they finish, in any order
        ...
    executor.close()

A `SimJob` is one kernel's cost-model run (pypto SIM mode on zero inputs). Its `key` is the kernel's cost-cache key
(perf/costs.py: the content hash of everything that changes the answer), and the Dask executor names its task after
it, so a kernel submitted twice (by two points, or by two clients of one scheduler) runs once. A `SimOutcome` is
what comes back: pypto's Total Cycles and task count and the swimlane summary (first task start, last task end,
busy cycles per core kind), read on the machine where the run happened, or a one-line error. Outcomes do not
depend on where or in which order the jobs ran.

local  `kernels.pypto_rt.run_jobs` on this machine: `workers` processes, a fresh pool for every `batch` jobs.
dask   a Dask `distributed` scheduler (`tcp://HOST:PORT`). Each Dask worker runs its jobs in long-lived pypto
       processes that the worker plugin of `perf.dask_worker` keeps (pypto imported once per worker): start
       workers with `dask worker tcp://HOST:PORT --nthreads 1 --preload perf.dask_worker`, or let the client
       register the plugin on workers started without it. Needs the `sweep` extra (dask[distributed]).
"""
from __future__ import annotations

import json
import logging
import os
import re
import shutil
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator, Mapping, Protocol, Sequence

from dspark_ir.errors import DsparkError

EXECUTORS = ("local", "dask")
SCHEDULER_ENV = "DSPARK_SCHEDULER"
TASK_PREFIX = "dspark-sim-"         # Dask task key = prefix + cost key
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

    def run(self, jobs: Sequence[SimJob]) -> Iterator[tuple[int, SimOutcome]]:
        """(index into jobs, outcome) for every job, as they finish."""

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

        jobs = list(jobs)
        for start in range(0, len(jobs), self.batch):
            chunk = jobs[start:start + self.batch]
            art = Path(tempfile.mkdtemp(prefix="dspark-perf-"))
            try:
                results = run_jobs([j.kernel_job() for j in chunk], self.timeout,
                                   workers=min(self.workers, len(chunk)), artifacts_dir=art)
                outcomes = [outcome_of(r) for r in results]
            finally:
                shutil.rmtree(art, ignore_errors=True)
            yield from ((start + k, o) for k, o in enumerate(outcomes))

    def describe(self) -> str:
        return f"local ({self.workers} pypto workers)"

    def close(self) -> None:
        pass


class DaskExecutor:
    """Jobs as Dask tasks keyed by their cost key, on the workers of a `distributed` scheduler."""

    name = "dask"

    def __init__(self, scheduler: str, timeout: float = 1800.0, *, connect_timeout: float | None = None,
                 calculator: bool = False):
        if not _ADDRESS.match(scheduler):
            raise ExecutorError(f"--scheduler '{scheduler}': expected tcp://HOST:PORT (a `dask scheduler` address)")
        distributed = _distributed()
        from . import dask_worker

        connect_timeout = CONNECT_TIMEOUT if connect_timeout is None else connect_timeout
        self.scheduler = scheduler
        self.timeout = timeout
        with _quiet("distributed"):
            try:
                self.client = distributed.Client(scheduler, timeout=connect_timeout, set_as_default=False)
            except (OSError, TimeoutError, ValueError, TypeError) as exc:
                reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
                raise ExecutorError(f"--scheduler {scheduler}: cannot reach the Dask scheduler ({reason})") from None
        dask_worker.ensure_plugin(self.client, timeout=timeout, calculator=calculator)

    def run(self, jobs):
        from distributed import as_completed
        from distributed.scheduler import KilledWorker

        from . import dask_worker

        jobs = list(jobs)
        futures = {self.client.submit(dask_worker.simulate, job, self.timeout, key=TASK_PREFIX + job.key,
                                      pure=False): i for i, job in enumerate(jobs)}
        try:
            for fut in as_completed(list(futures), loop=self.client.loop):
                index = futures[fut]
                try:
                    outcome = fut.result()
                except KilledWorker as exc:       # Dask gave up after workers died on it: retry next run
                    outcome = SimOutcome(False, f"crash: Dask workers died running it ({exc})"[:300])
                except DsparkError:
                    raise
                except Exception as exc:  # noqa: BLE001 - a harness failure on a worker: one line, the command stops
                    raise ExecutorError(f"Dask worker failed on {jobs[index].label}: {type(exc).__name__}: "
                                        f"{str(exc).splitlines()[0] if str(exc) else ''}") from None
                yield index, outcome
        finally:
            for fut in futures:
                fut.release()

    def workers(self) -> int:
        return len(self.client.scheduler_info().get("workers", {}))

    def describe(self) -> str:
        return f"dask ({self.scheduler}, {self.workers()} workers)"

    def close(self) -> None:
        with _quiet("distributed"):
            self.client.close()


def make_executor(name: str | None = None, *, scheduler: str | None = None, workers: int = 2,
                  timeout: float = 1800.0, batch: int = 4) -> Executor:
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
        return DaskExecutor(address, timeout)
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

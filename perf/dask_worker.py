"""The worker side of the `dask` executor: a Dask worker plugin that keeps pypto processes, and the task it runs.

Start the workers with Dask's own command line and this module as a preload (our project and the same pypto
installed on every machine):

    dask scheduler --port 8786
    dask worker tcp://HOST:8786 --nworkers 2 --nthreads 1 --preload perf.dask_worker

For each worker thread the plugin starts one long-lived pypto process (`kernels.pypto_rt.WorkerPool`): pypto is
imported once per worker, not once per kernel. With `calculator=True` that process also builds (once, in the
shared calculator cache) and loads pypto's host calculator, which `full`-mode jobs need; the cost model's `sim`
jobs do not, so the executor leaves it off. A client registers the plugin itself on workers started without
the preload. The task checks that the worker's pypto and cost model are the client's: the cost-cache key was
computed on the client, so a worker with another pypto would file its answer under a wrong key.
"""
from __future__ import annotations

import queue
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Sequence

from distributed import WorkerPlugin, get_worker

from .costs import cost_model
from .executors import ExecutorError, SimJob, SimOutcome, outcome_of

PLUGIN = "dspark-pypto"
RECYCLE_AFTER = 400          # jobs per pypto process before a fresh one (pypto keeps per-kernel state)


class PyptoWorkerPlugin(WorkerPlugin):
    """One long-lived pypto process per worker thread, started in the background when the worker starts."""

    idempotent = True        # a second registration leaves a worker's running processes alone

    def __init__(self, timeout: float = 1800.0, calculator: bool = False):
        self.timeout = float(timeout)
        self.calculator = calculator

    def setup(self, worker) -> None:
        self.idle: queue.Queue = queue.Queue()      # pools no task holds
        self.made: list = []                        # every pool of this worker (teardown closes them all)
        self.lent = 0                               # pools held by running tasks
        self.returned = threading.Condition()
        self.closing = False
        self.failed: BaseException | None = None
        self.ready = threading.Event()
        self.dir = Path(tempfile.mkdtemp(prefix="dspark-dask-"))
        threads = max(1, int(getattr(worker.state, "nthreads", 1) or 1))
        threading.Thread(target=self._start, args=(threads,), name="dspark-pypto-start", daemon=True).start()

    def _start(self, count: int) -> None:
        try:
            for _ in range(count):
                if self.closing:
                    break
                pool = self._pool(self.timeout)
                pool.start(need_calculator=self.calculator)
                self.idle.put(pool)
        except BaseException as exc:  # noqa: BLE001 - reported by every task on this worker
            self.failed = exc
        finally:
            self.ready.set()

    def _pool(self, timeout: float):
        """A pool whose process starts now (`start`) or with its first job."""
        from kernels.pypto_rt import WorkerPool

        pool = WorkerPool(1, timeout, artifacts_dir=tempfile.mkdtemp(dir=self.dir))
        self.made.append(pool)
        return pool

    def run(self, job: SimJob, timeout: float) -> SimOutcome:
        self.ready.wait()
        if self.failed is not None and not self.closing:
            raise ExecutorError(f"pypto cannot start on this worker: {self.failed}")
        if self.closing:
            raise ExecutorError("the Dask worker is closing")
        pool = self.idle.get()
        with self.returned:
            self.lent += 1
        try:
            if pool.settings.timeout != float(timeout) or pool.submitted >= RECYCLE_AFTER:
                old, pool = pool, self._pool(float(timeout))
                old.close(kill=True)
            [result] = pool.run([job.kernel_job()])
            try:
                return outcome_of(result)
            finally:
                if result.artifacts is not None:
                    shutil.rmtree(result.artifacts, ignore_errors=True)
        finally:
            self.idle.put(pool)
            with self.returned:
                self.lent -= 1
                self.returned.notify_all()

    def teardown(self, worker) -> None:
        """Kill the pypto processes (sim jobs leave nothing to collect at exit; one still starting or running a
        job too), wait for the tasks to hand their pools back, then delete what the processes left: all well
        within the 4 s a nanny gives a closing worker."""
        self.closing = True
        for pool in list(self.made):
            pool.kill()
        self.ready.wait(5.0)
        with self.returned:
            self.returned.wait_for(lambda: self.lent == 0, timeout=5.0)
        closing = [threading.Thread(target=pool.close, args=(True,), daemon=True) for pool in list(self.made)]
        for thread in closing:
            thread.start()
        for thread in closing:
            thread.join()
        shutil.rmtree(self.dir, ignore_errors=True)


_lock = threading.Lock()


def simulate(jobs: Sequence[SimJob], timeout: float) -> list[tuple[SimOutcome, float]]:
    """The Dask task: kernels through the cost model, one after the other on this worker's pypto process; for each,
    its outcome and the seconds it took (the client sizes its tasks by them; they are not part of the answer)."""
    worker = get_worker()
    mine = cost_model()
    for job in jobs:
        if job.model and dict(job.model) != mine:
            raise ExecutorError(f"worker {worker.address} has {_text(mine)}, the client {_text(job.model)}: "
                                "install the same pypto on every machine")
    with _lock:                        # a worker that joined without the plugin gets one here
        plugin = worker.plugins.get(PLUGIN)
        if plugin is None:
            plugin = PyptoWorkerPlugin(timeout)
            plugin.setup(worker)
            worker.plugins[PLUGIN] = plugin
    answers = []
    for job in jobs:
        start = time.monotonic()
        outcome = plugin.run(job, timeout)
        answers.append((outcome, time.monotonic() - start))
    return answers


def ensure_plugin(client, *, timeout: float, calculator: bool = False) -> None:
    """Register the plugin with the scheduler unless every worker has it already (from the preload)."""
    have = client.run(lambda dask_worker: PLUGIN in dask_worker.plugins)
    if have and all(have.values()):
        return
    client.register_plugin(PyptoWorkerPlugin(timeout, calculator), name=PLUGIN)


async def dask_setup(worker) -> None:
    """`dask worker ... --preload perf.dask_worker`: add the plugin as the worker starts."""
    await worker.plugin_add(PyptoWorkerPlugin(), name=PLUGIN)


def _text(model) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(dict(model).items()))

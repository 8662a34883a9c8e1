"""Run pypto kernels in persistent subprocess workers and collect numbers, cycles and verify rows.

A worker (:mod:`kernels.pypto_rt.worker`) is one process that imports torch and pypto once
(~2 s) and then runs the jobs it is sent, one after the other. A :class:`WorkerPool` keeps
its workers alive across :meth:`WorkerPool.run` calls (the lowering's executor sends one
batch per dependency wave). After any failure the worker stops, and the jobs it did not
reach go to a fresh worker: a failed pypto call leaves the process's global state broken.

Each worker gets a private temporary directory holding the kernel sources,
``TILE_FWK_OUTPUT_DIR``, ``ASCEND_PROCESS_LOG_PATH`` and its log. pypto writes a call's
verify CSV only when the next verify session starts or the process exits, so the verify
rows (and the ``artifacts_dir`` copies) of a worker's ``full`` results are filled in when that
worker has exited: when the pool closes, or when the worker is replaced after a failure. Outputs,
cycles, errors and the ``artifacts_dir`` copies of ``sim`` and ``compile`` results (nothing of
theirs is written at exit) are there as soon as ``run`` returns. The directory is then deleted; with
``DSPARK_KEEP_PYPTO_TMP=1`` it is kept when a job failed.

:func:`run_jobs` is a pool that lives for one batch: every field of its results is final.
"""

from __future__ import annotations

import os
import pickle
import re
import select
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from kernels.pypto_rt import cycles, diagnose, verify_csv
from kernels.pypto_rt.errors import PyptoError
from kernels.pypto_rt.job import KernelJob, KernelResult, spec_array

DEFAULT_TIMEOUT = 120.0  # seconds per kernel call
STARTUP_TIMEOUT = 900.0  # import + a cold calculator build (~30 s) on a loaded machine
EXIT_TIMEOUT = 60.0  # after the last job, for pypto's exit-time writes
KEEP_ENV = "DSPARK_KEEP_PYPTO_TMP"
_PROJECT_ROOT = Path(__file__).resolve().parents[2]
_LOG_TAIL = 200


@dataclass(frozen=True)
class _Settings:
    timeout: float
    startup_timeout: float
    python: str
    artifacts_dir: Path | None


def run_jobs(jobs: Iterable[KernelJob], timeout: float = DEFAULT_TIMEOUT, *, workers: int = 1,
             artifacts_dir: str | os.PathLike | None = None, python: str | None = None,
             startup_timeout: float = STARTUP_TIMEOUT) -> list[KernelResult]:
    """Run ``jobs`` and return one :class:`KernelResult` per job, in order.

    A kernel failure is a result with ``ok=False`` and a one-line ``error``; a harness
    failure (pypto not importable, calculator build failed, worker cannot start) raises
    :class:`PyptoError`. ``timeout`` bounds each kernel call; ``workers`` > 1 runs that
    many workers side by side. With ``artifacts_dir`` each job's pypto output directory
    is copied to ``artifacts_dir/<nnn>-<label>/`` (swimlanes, verify data).
    """
    jobs = list(jobs)
    with WorkerPool(max(1, min(workers, len(jobs))), timeout, artifacts_dir=artifacts_dir, python=python,
                    startup_timeout=startup_timeout) as pool:
        return pool.run(jobs)


def run_job(job: KernelJob, timeout: float = DEFAULT_TIMEOUT, **kwargs) -> KernelResult:
    """Run one job (see :func:`run_jobs`)."""
    return run_jobs([job], timeout, **kwargs)[0]


class WorkerPool:
    """Persistent pypto workers for several batches of jobs.

        with WorkerPool(workers=2, timeout=300) as pool:
            first = pool.run(jobs)        # outputs, cycles, errors: final now
            second = pool.run(more_jobs)  # same worker processes, no new `import pypto`
        # here: the workers have exited and every result's `verify` rows are filled in

    ``run`` splits a batch over the workers (job i goes to worker i mod n) and returns the
    results in order. A worker whose job failed is replaced by a fresh one. The ``verify``
    rows, ``artifacts`` and ``swimlane`` of a ``full`` result are filled in when its worker
    exits, those of other modes when ``run`` returns (see the module doc). ``start`` starts
    the workers ahead of the first batch. Artifact directories are numbered by the job's position over
    the pool's whole life.
    """

    def __init__(self, workers: int = 1, timeout: float = DEFAULT_TIMEOUT, *,
                 artifacts_dir: str | os.PathLike | None = None, python: str | None = None,
                 startup_timeout: float = STARTUP_TIMEOUT):
        self.settings = _Settings(float(timeout), float(startup_timeout), python or sys.executable,
                                  Path(artifacts_dir) if artifacts_dir is not None else None)
        self.slots: list[_Worker | None] = [None] * max(1, int(workers))
        self.submitted = 0  # jobs over the pool's life: artifact numbering
        self.started = 0  # worker processes started (one per slot, plus one per failure)
        self.closed = False
        self._lock = threading.Lock()

    def __enter__(self) -> WorkerPool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def run(self, jobs: Iterable[KernelJob]) -> list[KernelResult]:
        """Run a batch; one result per job, in order (see :func:`run_jobs` for failures)."""
        if self.closed:
            raise PyptoError("this WorkerPool is closed")
        jobs = list(jobs)
        indexed = [(self.submitted + i, job) for i, job in enumerate(jobs)]
        self.submitted += len(jobs)
        count = min(len(self.slots), len(jobs))
        shares = [indexed[k::count] for k in range(count)]
        results: dict[int, KernelResult] = {}
        if count == 1:
            results.update(self._run_share(0, shares[0]))
        elif count > 1:
            failures: list[BaseException] = []

            def chain(slot, share):
                try:
                    results.update(self._run_share(slot, share))
                except BaseException as exc:  # noqa: BLE001  (re-raised below)
                    failures.append(exc)

            threads = [threading.Thread(target=chain, args=(k, share)) for k, share in enumerate(shares)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
            if failures:
                raise failures[0]
        return [results[i] for i, _ in indexed]

    def start(self, need_calculator: bool = False) -> None:
        """Start every worker now (import pypto; with ``need_calculator`` also build or load the calculator)
        rather than at the first :meth:`run`: a long-lived pool pays its start-up before the first job."""
        if self.closed:
            raise PyptoError("this WorkerPool is closed")
        for slot, worker in enumerate(self.slots):
            if worker is None or not worker.alive:
                if worker is not None:
                    worker.close()
                worker = _Worker(self.settings, need_calculator)
                with self._lock:
                    self.started += 1
                self.slots[slot] = worker
                worker._start()

    def kill(self) -> None:
        """Kill every worker process now; safe from another thread while a worker starts or runs a job (that
        job gets a "worker died" result). Call :meth:`close` afterwards: it collects and deletes what they left."""
        for worker in list(self.slots):
            if worker is not None:
                worker._kill()

    def close(self, kill: bool = False) -> None:
        """Stop every worker and fill in the verify rows and artifacts of their results. With ``kill`` the workers
        are killed instead of asked to exit: quicker (pypto's exit takes seconds), but what pypto writes at exit,
        the verify rows of ``full`` results, is lost; sim and compile results lose nothing."""
        self.closed = True
        errors = []
        for k, worker in enumerate(self.slots):
            if worker is not None:
                try:
                    worker.close(kill)
                except BaseException as exc:  # noqa: BLE001  (re-raised below)
                    errors.append(exc)
            self.slots[k] = None
        if errors:
            raise errors[0]

    def _run_share(self, slot: int, share: list[tuple[int, KernelJob]]) -> dict[int, KernelResult]:
        """Run jobs on one slot's worker, replacing it after a failure, until every job has a result."""
        results: dict[int, KernelResult] = {}
        pending = list(share)
        while pending:
            worker = self.slots[slot]
            if worker is None or not worker.alive:
                if worker is not None:
                    worker.close()
                worker = _Worker(self.settings, any(job.mode == "full" for _, job in pending))
                with self._lock:
                    self.started += 1
                self.slots[slot] = worker
            results.update(worker.run(pending))
            pending = [(i, job) for i, job in pending if i not in results]
        return results


def _slug(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]+", "_", text).strip("_")[:40] or "kernel"


class _Channel:
    """Line reader over the worker's report pipe, with deadlines."""

    def __init__(self, fd: int):
        self.fd = fd
        self.buffer = b""

    def readline(self, deadline: float) -> str | None:
        """The next line; "" at end of file; None when the deadline passed."""
        while b"\n" not in self.buffer:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            ready, _, _ = select.select([self.fd], [], [], remaining)
            if not ready:
                return None
            chunk = os.read(self.fd, 4096)
            if not chunk:
                rest, self.buffer = self.buffer, b""
                return rest.decode()
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode() + "\n"


class _Worker:
    """One worker process, the jobs it ran, and the reading of what it left."""

    def __init__(self, settings: _Settings, need_calculator: bool):
        self.settings = settings
        self.dir = Path(tempfile.mkdtemp(prefix="dspark-pypto-"))
        self.src_dir = self.dir / "src"
        self.src_dir.mkdir()
        self.out_dir = self.dir / "output"
        self.log_dir = self.dir / "log"
        self.worker_log = self.dir / "worker.log"
        self.need_calculator = need_calculator
        self.proc: subprocess.Popen | None = None
        self.channel: _Channel | None = None
        self.commands = None  # write end of the command pipe
        self.alive = False  # running and able to take another job
        self.failed = False  # a job of this worker failed (keep its directory with KEEP_ENV)
        self.done: list[tuple[int, KernelJob, KernelResult, list[Path]]] = []  # finished, to complete at close
        self.returncode: int | None = None
        self.pid: int | None = None

    # ---- process ---------------------------------------------------------------------
    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        for name in ("ASCEND_HOME_PATH", "ASCEND_SLOG_PRINT_TO_STDOUT"):
            env.pop(name, None)  # no CANN: SIM only, logs to files
        env["TILE_FWK_OUTPUT_DIR"] = str(self.out_dir)
        env["ASCEND_PROCESS_LOG_PATH"] = str(self.log_dir)
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
        paths = [str(_PROJECT_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(paths)
        env["PATH"] = os.pathsep.join([str(self._script_python()), env.get("PATH", "")])
        return env

    def _script_python(self) -> Path:
        """A directory whose `python3` is this interpreter without site-packages. Every SIM call runs three of
        pypto's swimlane scripts as `python3 <script>`: the one that writes merged_swimlane.json needs only the
        standard library, the two that draw PNGs need matplotlib and stop at its import. Without site-packages
        they never draw (slow, unused), and a bare interpreter starts in a few ms where a `python3` found on PATH
        may be a version-manager shim that takes 0.2-0.3 s a call."""
        bin_dir = self.dir / "bin"
        bin_dir.mkdir(exist_ok=True)
        shim = bin_dir / "python3"
        shim.write_text(f"#!/bin/sh\nexec {shlex.quote(self.settings.python)} -S \"$@\"\n")
        shim.chmod(0o755)
        return bin_dir

    def _start(self) -> None:
        report_r, report_w = os.pipe()
        command_r, command_w = os.pipe()
        try:
            with open(self.worker_log, "wb") as log:
                self.proc = subprocess.Popen(
                    [self.settings.python, "-m", "kernels.pypto_rt.worker", str(self.dir), str(report_w),
                     str(command_r), "1" if self.need_calculator else "0", str(os.getpid())],
                    cwd=self.dir, env=self._env(), stdin=subprocess.DEVNULL, stdout=log,
                    stderr=subprocess.STDOUT, pass_fds=(report_w, command_r), start_new_session=True)
        except BaseException:
            for fd in (report_r, report_w, command_r, command_w):
                os.close(fd)
            raise
        os.close(report_w)
        os.close(command_r)
        self.pid = self.proc.pid
        self.channel = _Channel(report_r)
        self.commands = os.fdopen(command_w, "w", buffering=1)
        line = self.channel.readline(time.monotonic() + self.settings.startup_timeout)
        if line is None:
            self._kill()
            self._reap()
            raise PyptoError(f"pypto worker was not ready within {self.settings.startup_timeout:g} s "
                             "(import pypto, calculator build)", log=self._tail(self.worker_log))
        if line.strip() != "ready":
            self._reap()
            self._raise_fatal()
            raise PyptoError(
                f"pypto worker exited with code {self.returncode} before running a job: "
                f"{diagnose.one_line(self._tail(self.worker_log, lines=3), max_lines=1) or 'no output'}",
                log=self._tail(self.worker_log))
        self.alive = True

    def _raise_fatal(self) -> None:
        fatal = self.dir / "fatal.pkl"
        if fatal.is_file():
            with open(fatal, "rb") as handle:
                info = pickle.load(handle)
            raise PyptoError(f"pypto worker setup failed: {info['message']}",
                             log=info["log"] + "\n" + self._tail(self.worker_log))

    def _kill(self) -> None:
        if self.proc is None or self.proc.returncode is not None:  # not started, or reaped: its pid may be reused
            return
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the worker leads its own session
        except ProcessLookupError:
            pass

    def _reap(self) -> None:
        """Wait for the process to end (kill it after EXIT_TIMEOUT) and close our pipe ends."""
        self.alive = False
        if self.proc is not None:
            try:
                self.returncode = self.proc.wait(timeout=EXIT_TIMEOUT)
            except subprocess.TimeoutExpired:
                self._kill()
                self.returncode = self.proc.wait()
        if self.commands is not None:
            try:
                self.commands.close()
            except OSError:  # the worker is gone: the pipe is broken
                pass
            self.commands = None
        if self.channel is not None:
            os.close(self.channel.fd)
            self.channel = None

    def _send(self, line: str) -> bool:
        try:
            self.commands.write(line + "\n")
            self.commands.flush()
            return True
        except (BrokenPipeError, OSError):
            return False

    # ---- jobs --------------------------------------------------------------------------
    def run(self, jobs: list[tuple[int, KernelJob]]) -> dict[int, KernelResult]:
        """Run jobs in order until one fails or the worker dies; results of the jobs it got to."""
        if self.proc is None:
            self._start()
        results: dict[int, KernelResult] = {}
        for index, job in jobs:
            result = self._run_one(index, job)
            results[index] = result
            if not result.ok:
                self.failed = True
            if not self.alive:
                break
        return results

    def _write_job(self, index: int, job: KernelJob) -> Path:
        name = f"dspark_kernel_{index:04d}_{_slug(job.label)}"
        path = self.src_dir / f"{name}.py"
        path.write_text(job.source)
        spec = {"index": index, "source_path": str(path), "module_name": name,
                "entry": job.entry, "mode": job.mode, "inputs": dict(job.inputs),
                "outputs": dict(job.outputs), "params": dict(job.params),
                "goldens": dict(job.goldens),
                "options": {k: dict(v) for k, v in job.options.items()}}
        job_path = self.src_dir / f"job_{index:04d}.pkl"
        with open(job_path, "wb") as handle:
            pickle.dump(spec, handle, protocol=pickle.HIGHEST_PROTOCOL)
        return job_path

    def _run_one(self, index: int, job: KernelJob) -> KernelResult:
        job_path = self._write_job(index, job)
        if not self._send(f"job {job_path}"):
            self._reap()
            return self._lost(job, timed_out=False)
        deadline = time.monotonic() + self.settings.timeout
        status = None
        while status is None:
            line = self.channel.readline(deadline)
            if line is None:  # deadline passed: in the call, or loading the calculator
                self._kill()
                self._reap()
                return self._lost(job, timed_out=True)
            if line == "":  # the worker died
                self._reap()
                self._raise_fatal()  # a failed calculator load is a harness failure
                return self._lost(job, timed_out=False)
            word, _, rest = line.strip().partition(" ")
            if word == "setup":
                deadline = time.monotonic() + self.settings.startup_timeout
            elif word == "start":
                deadline = time.monotonic() + self.settings.timeout
            elif word == "done":
                status = rest.partition(" ")[2]
        result_path = self.dir / f"result_{index}.pkl"
        with open(result_path, "rb") as handle:
            report = pickle.load(handle)
        for done in (job_path, result_path):  # the arrays: not needed again (a long-lived worker piles them up)
            done.unlink(missing_ok=True)
        result, call_dirs = self._from_report(job, report)
        if job.mode != "full":  # pypto writes nothing of a sim or compile call at exit: keep its output now
            self._keep_artifacts(index, job, call_dirs, result)
        self.done.append((index, job, result, call_dirs))
        if status != "ok":
            self._reap()  # the worker exits after a failed job
        return result

    # ---- closing: pypto's exit-time writes ----------------------------------------------
    def close(self, kill: bool = False) -> None:
        """Let the worker exit (or kill it), then fill in verify rows and artifacts; delete the directory."""
        try:
            if self.alive and kill:
                self._kill()
            elif self.alive:
                self._send("exit")
            self._reap()
            for index, job, result, call_dirs in self.done:
                result.verify = []
                for call_dir in call_dirs:
                    if result.stats is None:
                        self._read_stats(result, call_dir)
                    result.verify.extend(verify_csv.read_verify_rows(call_dir))
                if job.mode == "full":
                    self._keep_artifacts(index, job, call_dirs, result)
        finally:
            if not (self.failed and os.environ.get(KEEP_ENV) == "1"):
                shutil.rmtree(self.dir, ignore_errors=True)

    # ---- reading what it left ----------------------------------------------------------
    def _tail(self, path: Path, offset: int = 0, lines: int = _LOG_TAIL) -> str:
        if not path.is_file():
            return ""
        with open(path, "rb") as handle:
            handle.seek(offset)
            text = handle.read().decode(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def _plog_since(self, marks: dict[str, int] | None) -> str:
        marks = marks or {}
        parts = []
        for path in sorted(p for p in self.log_dir.rglob("*") if p.is_file()):
            parts.append(self._tail(path, marks.get(str(path), 0), lines=10_000))
        return "\n".join(part for part in parts if part)

    def _keep_note(self) -> str:
        if os.environ.get(KEEP_ENV) == "1":
            return f"\n[kept worker directory: {self.dir}]"
        return f"\n[set {KEEP_ENV}=1 to keep the worker directory]"

    def _lost(self, job: KernelJob, timed_out: bool) -> KernelResult:
        """The job that was running when the worker was killed or died."""
        self.failed = True
        plog = self._plog_since(None)
        if timed_out:
            error = f"timed out after {self.settings.timeout:g} s (worker killed)"
        else:
            code = self.returncode
            how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            found = diagnose.plog_cause(plog)
            error = f"worker died ({how}) during the call" + (f": {found}" if found else "")
        log = (f"[worker log]\n{self._tail(self.worker_log)}\n[plog]\n{plog}" + self._keep_note())
        return KernelResult(label=job.label, mode=job.mode, ok=False, error=error, log=log,
                            worker_pid=self.pid)

    @staticmethod
    def _read_stats(result: KernelResult, call_dir: Path) -> None:
        stats = cycles.read_stats(call_dir)
        if stats is not None:
            result.stats, result.cycles, result.tasks = stats, stats.total_cycles, stats.tasks

    def _from_report(self, job: KernelJob, report: dict) -> tuple[KernelResult, list[Path]]:
        outputs = report["outputs"]
        if job.mode == "compile" and report["ok"]:  # the worker sends nothing back: pypto wrote nothing
            outputs = {name: spec_array(spec) for name, spec in job.outputs.items()}
        result = KernelResult(label=job.label, mode=job.mode, ok=report["ok"], outputs=outputs,
                              clobbered=report["clobbered"], wall_s=report["wall_s"],
                              worker_pid=self.pid)
        call_dirs = [self.out_dir / name for name in report["call_dirs"]]
        if not report["ok"]:
            plog = self._plog_since(report["marks"]["plog"])
            result.error = diagnose.cause(report["exc_type"], report["exc_text"], report["log_errors"], plog)
            result.log = "\n".join([
                f"[exception] {report['exc_type']}", report["traceback"],
                "[logging errors]", *report["log_errors"],
                "[worker output]", self._tail(self.worker_log, report["marks"]["stdout"]),
                "[plog]", plog]) + self._keep_note()
        for call_dir in call_dirs:
            self._read_stats(result, call_dir)
        return result, call_dirs

    def _keep_artifacts(self, index: int, job: KernelJob, call_dirs: list[Path], result: KernelResult) -> None:
        if self.settings.artifacts_dir is None or not call_dirs:
            return
        target = self.settings.artifacts_dir / f"{index:03d}-{_slug(job.label)}"
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        for call_dir in call_dirs:
            if call_dir.is_dir():
                shutil.copytree(call_dir, target / call_dir.name)
        (target / "kernel.py").write_text(job.source)
        result.artifacts = target
        for call_dir in call_dirs:
            trace = cycles.swimlane_paths(target / call_dir.name).get("trace")
            if trace is not None:
                result.swimlane = trace

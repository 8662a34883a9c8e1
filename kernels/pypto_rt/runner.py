"""Run pypto kernels in subprocess workers and collect numbers, cycles and verify rows.

A worker (:mod:`kernels.pypto_rt.worker`) runs jobs one after the other in one process
(process start with ``import pypto`` costs ~2 s). After any failure it stops, and the
jobs it did not reach go to a fresh worker: a failed pypto call leaves the process's
global state broken. Each worker gets a private temporary directory holding the kernel
sources, ``TILE_FWK_OUTPUT_DIR``, ``ASCEND_PROCESS_LOG_PATH`` and its log; the directory
is read after the worker has exited (pypto writes the verify CSV at exit) and then
deleted; with ``DSPARK_KEEP_PYPTO_TMP=1`` it is kept when a job failed.
"""

from __future__ import annotations

import os
import pickle
import re
import select
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
from kernels.pypto_rt.job import KernelJob, KernelResult

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
    many worker chains side by side. With ``artifacts_dir`` each job's pypto output
    directory is copied to ``artifacts_dir/<nnn>-<label>/`` (swimlanes, verify data).
    """
    jobs = list(jobs)
    settings = _Settings(float(timeout), float(startup_timeout), python or sys.executable,
                         Path(artifacts_dir) if artifacts_dir is not None else None)
    count = max(1, min(workers, len(jobs)))
    shares = [list(enumerate(jobs))[k::count] for k in range(count)]
    results = _run_chain(shares[0], settings) if count == 1 else _run_parallel(shares, settings)
    return [results[i] for i in range(len(jobs))]


def run_job(job: KernelJob, timeout: float = DEFAULT_TIMEOUT, **kwargs) -> KernelResult:
    """Run one job (see :func:`run_jobs`)."""
    return run_jobs([job], timeout, **kwargs)[0]


def _run_parallel(shares: list[list[tuple[int, KernelJob]]], settings: _Settings) -> dict[int, KernelResult]:
    """One worker chain per share, in threads (the work happens in the worker processes)."""
    results: dict[int, KernelResult] = {}
    failures: list[BaseException] = []

    def chain(share):
        try:
            results.update(_run_chain(share, settings))
        except BaseException as exc:  # noqa: BLE001  (re-raised below)
            failures.append(exc)

    threads = [threading.Thread(target=chain, args=(share,)) for share in shares]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    return results


def _run_chain(indexed: list[tuple[int, KernelJob]], settings: _Settings) -> dict[int, KernelResult]:
    """Run jobs through as many successive workers as failures require."""
    results: dict[int, KernelResult] = {}
    pending = list(indexed)
    while pending:
        results.update(_Worker(pending, settings).run())
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
    """One worker process over a list of jobs, and the reading of what it left."""

    def __init__(self, jobs: list[tuple[int, KernelJob]], settings: _Settings):
        self.jobs = jobs
        self.settings = settings
        self.dir = Path(tempfile.mkdtemp(prefix="dspark-pypto-"))
        self.out_dir = self.dir / "output"
        self.log_dir = self.dir / "log"
        self.worker_log = self.dir / "worker.log"
        self.current: int | None = None  # job started and not reported done
        self.ready = False
        self.timed_out = False  # killed during a kernel call
        self.startup_timed_out = False  # killed before it was ready (import, calculator build)
        self.returncode: int | None = None
        self.pid: int | None = None

    # ---- process ---------------------------------------------------------------------
    def _write_jobs(self) -> None:
        src = self.dir / "src"
        src.mkdir()
        specs = []
        for index, job in self.jobs:
            name = f"dspark_kernel_{index:03d}_{_slug(job.label)}"
            path = src / f"{name}.py"
            path.write_text(job.source)
            specs.append({"index": index, "source_path": str(path), "module_name": name,
                          "entry": job.entry, "mode": job.mode, "inputs": dict(job.inputs),
                          "outputs": dict(job.outputs), "params": dict(job.params),
                          "goldens": dict(job.goldens),
                          "options": {k: dict(v) for k, v in job.options.items()}})
        need_calculator = any(job.mode == "full" for _, job in self.jobs)
        with open(self.dir / "jobs.pkl", "wb") as handle:
            pickle.dump({"jobs": specs, "need_calculator": need_calculator}, handle,
                        protocol=pickle.HIGHEST_PROTOCOL)

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        for name in ("ASCEND_HOME_PATH", "ASCEND_SLOG_PRINT_TO_STDOUT"):
            env.pop(name, None)  # no CANN: SIM only, logs to files
        env["TILE_FWK_OUTPUT_DIR"] = str(self.out_dir)
        env["ASCEND_PROCESS_LOG_PATH"] = str(self.log_dir)
        env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
        paths = [str(_PROJECT_ROOT)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join(paths)
        return env

    def _kill(self, proc: subprocess.Popen) -> None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # the worker leads its own session
        except ProcessLookupError:
            pass

    def _supervise(self, proc: subprocess.Popen, channel: _Channel) -> None:
        """Follow the worker's reports until it closes the pipe; kill it when a deadline passes."""
        last = self.jobs[-1][0]
        deadline = time.monotonic() + self.settings.startup_timeout
        while True:
            line = channel.readline(deadline)
            if line is None:
                self.timed_out = self.current is not None
                self.startup_timed_out = not self.ready
                self._kill(proc)
                return
            if line == "":
                return
            word, _, rest = line.strip().partition(" ")
            now = time.monotonic()
            if word == "ready":
                self.ready = True
                deadline = now + self.settings.timeout
            elif word == "start":
                self.current = int(rest)
                deadline = now + self.settings.timeout
            elif word == "done":
                index, _, status = rest.partition(" ")
                self.current = None
                finished = status != "ok" or int(index) == last  # the worker exits next
                deadline = now + (EXIT_TIMEOUT if finished else self.settings.timeout)

    def _start_and_wait(self) -> None:
        read_fd, write_fd = os.pipe()
        with open(self.worker_log, "wb") as log:
            proc = subprocess.Popen(
                [self.settings.python, "-m", "kernels.pypto_rt.worker", str(self.dir), str(write_fd)],
                cwd=self.dir, env=self._env(), stdin=subprocess.DEVNULL, stdout=log,
                stderr=subprocess.STDOUT, pass_fds=(write_fd,), start_new_session=True)
        os.close(write_fd)
        self.pid = proc.pid
        try:
            self._supervise(proc, _Channel(read_fd))
            try:
                self.returncode = proc.wait(timeout=EXIT_TIMEOUT)
            except subprocess.TimeoutExpired:
                self._kill(proc)
                self.returncode = proc.wait()
        finally:
            os.close(read_fd)
            if proc.poll() is None:
                self._kill(proc)
                proc.wait()

    # ---- reading what it left --------------------------------------------------------
    def run(self) -> dict[int, KernelResult]:
        failed = True
        try:
            self._write_jobs()
            self._start_and_wait()
            results = self._collect()
            failed = not all(r.ok for r in results.values()) or len(results) < len(self.jobs)
            return results
        finally:
            self._cleanup(failed)

    def _cleanup(self, failed: bool) -> None:
        if failed and os.environ.get(KEEP_ENV) == "1":
            return
        shutil.rmtree(self.dir, ignore_errors=True)

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

    def _collect(self) -> dict[int, KernelResult]:
        fatal = self.dir / "fatal.pkl"
        if fatal.is_file():
            with open(fatal, "rb") as handle:
                info = pickle.load(handle)
            raise PyptoError(f"pypto worker setup failed: {info['message']}",
                             log=info["log"] + "\n" + self._tail(self.worker_log))
        results: dict[int, KernelResult] = {}
        for index, job in self.jobs:
            path = self.dir / f"result_{index}.pkl"
            if path.is_file():
                with open(path, "rb") as handle:
                    results[index] = self._from_report(index, job, pickle.load(handle))
            elif index == self.current:
                results[index] = self._lost(job)
        if self.startup_timed_out:
            raise PyptoError(f"pypto worker was not ready within {self.settings.startup_timeout:g} s "
                             "(import pypto, calculator build)", log=self._tail(self.worker_log))
        if not results:
            raise PyptoError(
                f"pypto worker exited with code {self.returncode} before running a job: "
                f"{diagnose.one_line(self._tail(self.worker_log, lines=3), max_lines=1) or 'no output'}",
                log=self._tail(self.worker_log))
        return results

    def _lost(self, job: KernelJob) -> KernelResult:
        """The job that was running when the worker was killed or died."""
        plog = self._plog_since(None)
        if self.timed_out:
            error = f"timed out after {self.settings.timeout:g} s (worker killed)"
        else:
            code = self.returncode
            how = f"signal {-code}" if code is not None and code < 0 else f"exit code {code}"
            found = diagnose.plog_cause(plog)
            error = f"worker died ({how}) during the call" + (f": {found}" if found else "")
        log = (f"[worker log]\n{self._tail(self.worker_log)}\n[plog]\n{plog}" + self._keep_note())
        return KernelResult(label=job.label, mode=job.mode, ok=False, error=error, log=log,
                            worker_pid=self.pid)

    def _from_report(self, index: int, job: KernelJob, report: dict) -> KernelResult:
        result = KernelResult(label=job.label, mode=job.mode, ok=report["ok"], outputs=report["outputs"],
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
            stats = cycles.read_stats(call_dir)
            if stats is not None:
                result.stats, result.cycles, result.tasks = stats, stats.total_cycles, stats.tasks
            result.verify.extend(verify_csv.read_verify_rows(call_dir))
        self._keep_artifacts(index, job, call_dirs, result)
        return result

    def _keep_artifacts(self, index: int, job: KernelJob, call_dirs: list[Path], result: KernelResult) -> None:
        if self.settings.artifacts_dir is None or not call_dirs:
            return
        target = self.settings.artifacts_dir / f"{index:03d}-{_slug(job.label)}"
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        for call_dir in call_dirs:
            shutil.copytree(call_dir, target / call_dir.name)
        (target / "kernel.py").write_text(job.source)
        result.artifacts = target
        for call_dir in call_dirs:
            trace = cycles.swimlane_paths(target / call_dir.name).get("trace")
            if trace is not None:
                result.swimlane = trace

"""The subprocess side of the runner: ``python -m kernels.pypto_rt.worker WORKDIR REPORT_FD COMMAND_FD CALC``.

A persistent worker: it imports torch and pypto once, applies :mod:`verify_fix`, loads the
cached calculator (at start when CALC is 1, else before the first ``full`` job), and then
runs jobs as the runner sends them. Commands arrive on COMMAND_FD, one per line:
``job <path of a pickled job>`` or ``exit``. It reports on REPORT_FD (``ready``,
``setup <i>`` while it loads the calculator for job i, ``start <i>``, ``done <i> ok|failed``)
and writes each job's outcome to ``WORKDIR/result_<i>.pkl``. It stops after the first failed
job: pypto's global state is not trustworthy after an error, so the runner starts a fresh
worker for the rest. A setup failure (import, calculator build) goes to ``WORKDIR/fatal.pkl``.

Only the runner starts this module; nothing else should import it.
"""

from __future__ import annotations

import importlib.util
import inspect
import logging
import os
import pickle
import sys
import threading
import time
import traceback
from pathlib import Path
from typing import Any

from kernels.pypto_rt.errors import PyptoError

EXIT_JOB_FAILED = 1
EXIT_FATAL = 3
EXIT_ORPHANED = 4


class JobError(Exception):
    """A job that cannot be called as given (names, dtypes, shapes)."""


class _ErrorLog(logging.Handler):
    """Keeps the ERROR records of the current job (pypto logs the real cause there)."""

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.lines.append(record.getMessage())
        except Exception:  # noqa: BLE001  (a logging handler must never raise)
            pass


def _dump(path: Path, obj: Any) -> None:
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as handle:
        pickle.dump(obj, handle, protocol=pickle.HIGHEST_PROTOCOL)
    os.replace(tmp, path)


def _file_sizes(root: Path) -> dict[str, int]:
    if not root.is_dir():
        return {}
    return {str(p): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def _stdout_offset() -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        return os.lseek(1, 0, os.SEEK_CUR)
    except OSError:
        return 0


class _Runtime:
    """The imported pypto world of this process."""

    def __init__(self, need_calculator: bool) -> None:
        os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
        import ml_dtypes  # noqa: PLC0415
        import numpy as np  # noqa: PLC0415
        import pypto  # noqa: PLC0415
        import torch  # noqa: PLC0415

        from kernels.pypto_rt import calculator, verify_fix  # noqa: F401, PLC0415  (applies the fix)

        self.np, self.torch, self.pypto, self.ml_dtypes = np, torch, pypto, ml_dtypes
        self.verify_fix = verify_fix
        self.errors = _ErrorLog()
        logging.getLogger().addHandler(self.errors)
        self.out_root = Path(os.environ["TILE_FWK_OUTPUT_DIR"])
        self.log_root = Path(os.environ["ASCEND_PROCESS_LOG_PATH"])
        self.calculator = calculator
        self.calculator_loaded = False
        if need_calculator:
            self.load_calculator()
        self._views = {  # numpy dtypes torch.from_numpy cannot take: go through raw bits
            "bfloat16": (np.int16, torch.int16, torch.bfloat16),
            "float8_e4m3fn": (np.uint8, torch.uint8, torch.float8_e4m3fn),
            "float8_e5m2": (np.uint8, torch.uint8, torch.float8_e5m2),
        }

    def load_calculator(self) -> None:
        self.calculator.ensure_loaded()
        self.calculator_loaded = True

    # ---- numpy <-> torch -------------------------------------------------------------
    def to_torch(self, array):
        array = self.np.ascontiguousarray(array)
        view = self._views.get(array.dtype.name)
        if view is None:
            return self.torch.from_numpy(array.copy())
        raw_np, _, torch_dtype = view
        return self.torch.from_numpy(array.view(raw_np).copy()).view(torch_dtype)

    def to_numpy(self, tensor):
        tensor = tensor.detach().contiguous()
        for name, (_, raw_torch, torch_dtype) in self._views.items():
            if tensor.dtype == torch_dtype:
                return tensor.view(raw_torch).numpy().copy().view(getattr(self.ml_dtypes, name))
        return tensor.numpy().copy()

    def pypto_dtype(self, tensor):
        from pypto.frontend.parser.entry import JitCallableWrapper  # noqa: PLC0415

        return JitCallableWrapper._dtype_dict.get(str(tensor.dtype))

    # ---- one job ---------------------------------------------------------------------
    def jit_options(self, module, job: dict) -> dict:
        pypto = self.pypto
        mode = job["mode"]
        merged: dict[str, dict] = {}
        for layer in (getattr(module, "JIT_OPTIONS", None) or {}, job["options"]):
            for group, values in layer.items():
                merged.setdefault(group, {}).update(values)
        merged.setdefault("runtime_options", {})["run_mode"] = pypto.RunMode.SIM
        stage = pypto.CompStage.EXECUTE_GRAPH if mode == "compile" else pypto.CompStage.ALL_COMPLETE
        merged.setdefault("host_options", {})["compile_stage"] = stage
        merged.setdefault("verify_options", {})["enable_pass_verify"] = mode == "full"
        return merged

    def tensor_params(self, fn) -> list[tuple[str, Any]]:
        params = []
        for name, param in inspect.signature(fn).parameters.items():
            annotation = param.annotation
            if annotation is not inspect.Parameter.empty and hasattr(annotation, "to_tensor"):
                params.append((name, annotation.to_tensor(name)))
        return params

    def check_arg(self, name: str, tensor, spec) -> None:
        declared = spec.dtype if spec.status_dtype is not None else None
        actual = self.pypto_dtype(tensor)
        if declared is not None and actual != declared:
            have = str(tensor.dtype).replace("torch.", "")
            raise JobError(f"tensor {name!r} is {have} but the kernel declares {declared.name}")
        shape = list(spec.shape)
        if shape and len(shape) != tensor.dim():
            raise JobError(f"tensor {name!r} has shape {list(tensor.shape)} but the kernel declares {shape}")
        for got, want in zip(tensor.shape, shape):
            if isinstance(want, int) and want != got:
                raise JobError(f"tensor {name!r} has shape {list(tensor.shape)} but the kernel declares {shape}")

    def fresh_tensor(self, shape, dtype, zero: bool):
        """A tensor for a (shape, dtype) spec: zeros, or uninitialised (compile mode: pypto reads no data,
        and untouched pages of a big allocation cost nothing)."""
        view = self._views.get(self.np.dtype(dtype).name)
        torch_dtype = view[2] if view else self.torch.from_numpy(self.np.empty(0, dtype)).dtype
        make = self.torch.zeros if zero else self.torch.empty
        return make(tuple(shape), dtype=torch_dtype)

    def arguments(self, fn, job: dict):
        tensors, goldens, names = [], [], []
        compile_only = job["mode"] == "compile"
        for name, spec in self.tensor_params(fn):
            if name in job["inputs"]:
                array = job["inputs"][name]
            elif name in job["outputs"]:
                array = job["outputs"][name]
            else:
                raise JobError(f"kernel parameter {name!r} is in neither inputs nor outputs")
            if isinstance(array, self.np.ndarray):
                tensor, dtype = self.to_torch(array), array.dtype
            else:
                tensor, dtype = self.fresh_tensor(*array, zero=not compile_only), self.np.dtype(array[1])
            self.check_arg(name, tensor, spec)
            tensors.append(tensor)
            names.append(name)
            golden = job["goldens"].get(name)
            goldens.append(None if golden is None else self.to_torch(golden.astype(dtype)))
        extra = (set(job["inputs"]) | set(job["outputs"])) - set(names)
        if extra:
            raise JobError(f"arrays given for names the kernel does not take: {sorted(extra)}")
        return names, tensors, goldens

    def run(self, job: dict) -> dict:
        marks = {"plog": _file_sizes(self.log_root), "stdout": _stdout_offset()}
        before = set(os.listdir(self.out_root)) if self.out_root.is_dir() else set()
        self.errors.lines.clear()
        result: dict[str, Any] = {"index": job["index"], "ok": False, "outputs": {}, "clobbered": [],
                                  "wall_s": 0.0, "marks": marks}
        start = time.perf_counter()
        try:
            self._call(job, result)
            result["ok"] = True
        except BaseException as exc:  # noqa: BLE001  (reported, then the worker exits)
            result["exc_type"] = type(exc).__name__
            result["exc_text"] = str(exc)
            result["traceback"] = traceback.format_exc()
        finally:
            result["wall_s"] = time.perf_counter() - start
            self.verify_fix.release()
        after = set(os.listdir(self.out_root)) if self.out_root.is_dir() else set()
        result["call_dirs"] = sorted(after - before)
        result["log_errors"] = list(self.errors.lines)
        return result

    def _call(self, job: dict, result: dict) -> None:
        module = _load_module(job["source_path"], job["module_name"])
        fn = getattr(module, job["entry"], None)
        if fn is None:
            raise JobError(f"the kernel source defines no {job['entry']!r}")
        if not inspect.isfunction(fn):
            raise JobError(f"{job['entry']!r} must be a plain function (the runner applies pypto.frontend.jit)")
        names, tensors, goldens = self.arguments(fn, job)
        kernel = _jit(fn, self.jit_options(module, job))
        if job["mode"] == "full":
            self.verify_fix.set_goldens(goldens)
        kernel(*tensors, **job["params"])
        if job["mode"] == "compile":  # nothing ran: the runner gives back the outputs as they were
            return
        by_name = dict(zip(names, tensors))
        result["outputs"] = {name: self.to_numpy(by_name[name]) for name in job["outputs"]}
        for name, original in job["inputs"].items():
            if not isinstance(original, self.np.ndarray):
                continue  # zeros made here: nothing of the caller's to clobber
            after = self.to_numpy(by_name[name])
            if after.tobytes() != self.np.ascontiguousarray(original).tobytes():
                result["clobbered"].append(name)


def _jit(_dspark_kernel, _dspark_options):
    # pypto.frontend.jit captures its caller's locals into the parse scope: keep them few and odd.
    import pypto  # noqa: PLC0415

    return pypto.frontend.jit(**_dspark_options)(_dspark_kernel)


def _load_module(path: str, name: str):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # inspect.getsource needs the module findable
    spec.loader.exec_module(module)
    return module


def _fatal(workdir: Path, exc: BaseException) -> int:
    message = str(exc) if isinstance(exc, PyptoError) else f"{type(exc).__name__}: {exc}"
    _dump(workdir / "fatal.pkl", {"message": message,
                                  "log": getattr(exc, "log", "") + "\n" + traceback.format_exc()})
    return EXIT_FATAL


def exit_with_parent(parent: int, poll_s: float = 2.0) -> None:
    """Exit (EXIT_ORPHANED) once `parent`, the process that started us, is gone. An idle worker sees the command
    pipe close, but one in the middle of a job would otherwise simulate on for nobody (a big kernel runs for an
    hour). The runner passes its pid: a runner that died before this watch started is noticed too."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        os._exit(EXIT_ORPHANED)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def main(argv: list[str]) -> int:
    workdir, report_fd, command_fd, need_calculator = Path(argv[0]), int(argv[1]), int(argv[2]), argv[3] == "1"
    exit_with_parent(int(argv[4]))
    for fd in (report_fd, command_fd):
        os.set_inheritable(fd, False)  # pypto's own child processes must not hold the pipes
    channel = os.fdopen(report_fd, "w", buffering=1)
    commands = os.fdopen(command_fd, "r")
    try:
        runtime = _Runtime(need_calculator)
    except BaseException as exc:  # noqa: BLE001
        return _fatal(workdir, exc)
    channel.write("ready\n")
    for line in commands:
        word, _, arg = line.strip().partition(" ")
        if word == "exit":
            break
        if word != "job":
            continue
        with open(arg, "rb") as handle:
            job = pickle.load(handle)
        if job["mode"] == "full" and not runtime.calculator_loaded:
            channel.write(f"setup {job['index']}\n")
            try:
                runtime.load_calculator()
            except BaseException as exc:  # noqa: BLE001
                return _fatal(workdir, exc)
        channel.write(f"start {job['index']}\n")
        result = runtime.run(job)
        _dump(workdir / f"result_{job['index']}.pkl", result)
        channel.write(f"done {job['index']} {'ok' if result['ok'] else 'failed'}\n")
        if not result["ok"]:
            return EXIT_JOB_FAILED
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

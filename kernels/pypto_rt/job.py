"""What the runner is asked to run (:class:`KernelJob`) and what it gives back (:class:`KernelResult`).

Only numpy and ml_dtypes here: this module must import fast and without pypto.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import ml_dtypes
import numpy as np

from kernels.pypto_rt.cycles import CostStats, cycles_to_us
from kernels.pypto_rt.errors import PyptoError
from kernels.pypto_rt.verify_csv import VerifyRow

MODES = ("compile", "sim", "full")
OPTION_GROUPS = ("host_options", "codegen_options", "pass_options", "runtime_options",
                 "verify_options", "debug_options")

_DTYPE_ALIASES = {
    "bf16": ml_dtypes.bfloat16, "bfloat16": ml_dtypes.bfloat16,
    "fp8_e4m3": ml_dtypes.float8_e4m3fn, "float8_e4m3fn": ml_dtypes.float8_e4m3fn,
    "fp8_e5m2": ml_dtypes.float8_e5m2, "float8_e5m2": ml_dtypes.float8_e5m2,
    "fp32": np.float32, "f32": np.float32, "fp16": np.float16, "f16": np.float16,
    "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
}


def as_dtype(dtype: Any) -> np.dtype:
    """numpy dtype from a numpy/ml_dtypes dtype or a name such as "bf16", "float32", "i32"."""
    if isinstance(dtype, str) and dtype.lower() in _DTYPE_ALIASES:
        return np.dtype(_DTYPE_ALIASES[dtype.lower()])
    try:
        return np.dtype(dtype)
    except TypeError as exc:
        raise PyptoError(f"unknown dtype {dtype!r}") from exc


def _array_spec(name: str, spec: Any, what: str = "output") -> np.ndarray | tuple[tuple[int, ...], np.dtype]:
    if isinstance(spec, np.ndarray):
        return np.ascontiguousarray(spec)
    if isinstance(spec, tuple) and len(spec) == 2:
        shape, dtype = spec
        return tuple(int(d) for d in shape), as_dtype(dtype)
    first = "an initial array" if what == "output" else "an array"
    raise PyptoError(f"{what} {name!r} must be {first} or a (shape, dtype) pair, not {type(spec).__name__}")


def spec_array(spec: np.ndarray | tuple[tuple[int, ...], np.dtype]) -> np.ndarray:
    """The array of an input/output spec: itself, or zeros (lazily allocated) for a (shape, dtype) pair."""
    return spec if isinstance(spec, np.ndarray) else np.zeros(*spec)


@dataclass
class KernelJob:
    """One call of one pypto kernel.

    ``source`` is the text of a Python module; ``entry`` names a *plain* function in it
    (no decorator) whose tensor parameters are annotated ``pypto.Tensor(...)`` and come
    first. The worker writes the source to a real ``.py`` file and wraps ``entry`` with
    ``pypto.frontend.jit(**options)`` for ``mode``.

    ``inputs`` and ``outputs`` map tensor parameter names to arrays. An output is either
    an initial array (copied; for in-place updates such as cache writes) or a
    ``(shape, dtype)`` pair (zero-filled). An input may be a ``(shape, dtype)`` pair too:
    zeros (in ``compile`` mode the worker leaves such tensors uninitialised, as pypto does
    not read them, so flash-sized weights cost no memory traffic). bf16 arrays are
    ``ml_dtypes.bfloat16``.
    ``params`` are the kernel's non-tensor arguments (part of pypto's compile key).
    ``goldens`` (full mode only) maps output names to reference arrays; pypto's
    tensor-graph check compares against them (cast to the output dtype) with
    ``verify_options["pass_verify_error_tol"]`` (default rtol = atol = 1e-3).
    ``options`` holds extra jit option groups (``pass_options``, ``verify_options``, ...),
    applied over the module's optional ``JIT_OPTIONS`` dict; the mode's own keys
    (run_mode, compile_stage, enable_pass_verify) always win.
    """

    source: str
    entry: str
    inputs: Mapping[str, Any]
    outputs: Mapping[str, Any]
    mode: str = "full"
    label: str = ""
    params: Mapping[str, Any] = field(default_factory=dict)
    goldens: Mapping[str, np.ndarray] = field(default_factory=dict)
    options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise PyptoError(f"mode must be one of {', '.join(MODES)}, not {self.mode!r}")
        self.label = self.label or self.entry
        both = set(self.inputs) & set(self.outputs)
        if both:
            raise PyptoError(f"{self.label}: {sorted(both)} given as both input and output; "
                             "pass an in-place buffer once, as an output with its initial array")
        unknown = set(self.goldens) - set(self.outputs)
        if unknown:
            raise PyptoError(f"{self.label}: goldens for unknown outputs {sorted(unknown)}")
        bad = set(self.options) - set(OPTION_GROUPS)
        if bad:
            raise PyptoError(f"{self.label}: unknown jit option groups {sorted(bad)}; "
                             f"use {', '.join(OPTION_GROUPS)}")
        self.inputs = {name: _array_spec(name, arr, "input") for name, arr in self.inputs.items()}
        self.outputs = {name: _array_spec(name, spec) for name, spec in self.outputs.items()}
        self.goldens = {name: np.asarray(arr) for name, arr in self.goldens.items()}


@dataclass
class KernelResult:
    """The outcome of one :class:`KernelJob`.

    ``outputs`` always holds every output array as it was after the call (in compile
    and sim modes pypto does not write them: they keep their initial contents; in compile
    mode they are the job's own arrays, or lazily allocated zeros for a ``(shape, dtype)``).
    ``cycles``/``tasks``/``stats`` come from the cost-model report (sim and full),
    ``verify`` from ``verify_result_brief.csv`` (full). ``clobbered`` lists inputs whose
    contents changed during the call (it must stay empty). ``error`` is a one-line cause;
    ``log`` the full story (traceback, worker output, plog lines).
    """

    label: str
    mode: str
    ok: bool
    outputs: dict[str, np.ndarray] = field(default_factory=dict)
    cycles: int | None = None
    tasks: int | None = None
    stats: CostStats | None = None
    verify: list[VerifyRow] = field(default_factory=list)
    clobbered: list[str] = field(default_factory=list)
    error: str | None = None
    log: str = ""
    wall_s: float = 0.0  # the kernel call inside the worker (compile + simulate + verify)
    worker_pid: int | None = None  # jobs that shared a worker process share this
    artifacts: Path | None = None  # kept copy of the call's pypto output directory, if any
    swimlane: Path | None = None  # merged_swimlane.json (Perfetto, µs) inside ``artifacts``

    @property
    def us(self) -> float | None:
        """Modelled time in µs (cycles at 1.8 GHz)."""
        return None if self.cycles is None else cycles_to_us(self.cycles)

    @property
    def verify_failed(self) -> list[VerifyRow]:
        return [row for row in self.verify if not row.passed]

    @property
    def verify_ok(self) -> bool:
        """At least one verify row, and all of them PASS."""
        return bool(self.verify) and not self.verify_failed

    def check(self) -> KernelResult:
        """Raise :class:`PyptoError` if the job failed; return self otherwise."""
        if not self.ok:
            raise PyptoError(f"{self.label}: {self.error}", log=self.log)
        return self

"""The pypto 0.2.0 harness: run generated pypto kernels on a CPU-only machine.

    from kernels.pypto_rt import KernelJob, run_jobs
    [res] = run_jobs([KernelJob(source, "mm", inputs={...}, outputs={"out": ((64, 192), "float32")})])

Importing this package does not import pypto or torch; only the worker process does.
See README.md beside this file.
"""

from kernels.pypto_rt.cycles import CostStats, cycles_to_us
from kernels.pypto_rt.errors import PyptoError
from kernels.pypto_rt.job import MODES, KernelJob, KernelResult
from kernels.pypto_rt.runner import DEFAULT_TIMEOUT, WorkerPool, run_job, run_jobs
from kernels.pypto_rt.verify_csv import VerifyRow

__all__ = [
    "DEFAULT_TIMEOUT", "MODES", "CostStats", "KernelJob", "KernelResult", "PyptoError",
    "VerifyRow", "WorkerPool", "cycles_to_us", "run_job", "run_jobs",
]

"""`dspark run --backend numpy|shuffled|pypto`: the task-graph executors in the run command's form.

Each backend is `fn(graph, inputs) -> result` with the interpreter's input/result form (a dict, or one
dict per rank). They lower the (verified) graph as it is, then execute the task graph:

* `numpy`    the kernels' numpy references in submission order (equal to the interpreter bit for bit);
* `shuffled` a random valid order of the explicit deps, atomic split reductions in a random split order
             (seed: $DSPARK_SHUFFLE_SEED, default 0);
* `pypto`    every kernel with a pypto form through pypto 0.2.0 on CPU, one job per rank; cross-rank
             collectives run their numpy reference (pypto's distributed ops cannot run on CPU). stderr
             lists every task that did not run on a plain template, with the reason.
* `interp`   the reference interpreter itself (`dspark_ir.interp.run`), kept reachable under its own name.
"""
from __future__ import annotations

import os
import sys

BACKENDS = {
    "numpy": "lowering.backends:numpy_backend",
    "shuffled": "lowering.backends:shuffled_backend",
    "pypto": "lowering.backends:pypto_backend",
    "interp": "dspark_ir.interp:run",
}


def numpy_backend(g, inputs):
    from . import run_numpy

    return run_numpy(_lowered(g), inputs)


def shuffled_backend(g, inputs):
    from . import run_shuffled

    return run_shuffled(_lowered(g), inputs, int(os.environ.get("DSPARK_SHUFFLE_SEED", "0")))


def pypto_backend(g, inputs, progress=None):
    from .pypto_exec import PyptoReport, run_pypto

    report = PyptoReport()
    try:
        return run_pypto(_lowered(g), inputs, report=report, progress=progress)
    finally:
        print("\n".join(report.describe()), file=sys.stderr)


def _lowered(g):
    """The task graph of `g` as it is (the run command verified it and ran its pipeline)."""
    from .driver import compile

    return compile(g, verify=False, sources=False).tg

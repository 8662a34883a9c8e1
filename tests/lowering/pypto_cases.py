"""Running single-op graphs' kernels through the pypto harness in one batch (shared by the template tests).

A case is a small .dsir graph whose *last* kernel task is the op under test; earlier tasks (producers of
its inputs) run on numpy. All kernels of a batch go to `kernels.pypto_rt.run_jobs` in `full` mode, with
the numpy reference's outputs as goldens.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from dspark_ir import parse_graph, verify
from lowering import build_task_graph
from lowering.executors import Memory, run_task
from lowering.pypto_exec import kernel_job


@dataclass(frozen=True)
class Case:
    text: str
    integers: bool = False      # small integer inputs: every sum is exact
    ulps: int | dict | None = 0  # allowed distance in units of the output dtype (per output name as a dict;
                                 # None: use rel)
    rel: float = 0.0            # allowed max |got - want| / max(|want|, 1) when ulps is None
    make_inputs: Callable | None = None


def case_inputs(g, case: Case, seed: int = 0) -> dict[str, np.ndarray]:
    if case.make_inputs is not None:
        return case.make_inputs(g, np.random.default_rng(seed))
    rng = np.random.default_rng(seed)
    out = {}
    for p in g.params:
        shape = p.type.concrete_shape(g.env)
        if case.integers or p.type.dtype.is_int:
            out[p.name] = rng.integers(-4, 5, shape).astype(np.float32)
        else:
            out[p.name] = (rng.standard_normal(shape) * 3).astype(np.float32)
    return out


def ulps(got, want) -> int:
    got, want = np.asarray(got), np.asarray(want)
    if got.dtype.kind in "iu":
        return int(np.max(np.abs(got.astype(np.int64) - want.astype(np.int64)), initial=0))
    bits = {2: np.int16, 4: np.int32}[got.dtype.itemsize]
    return int(np.max(np.abs(got.view(bits).astype(np.int64) - want.view(bits).astype(np.int64)), initial=0))


def rel_err(got, want) -> float:
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    return float(np.max(np.abs(got - want) / np.maximum(np.abs(want), 1.0), initial=0.0))


def run_cases(cases: dict[str, Case], workers: int = 2) -> dict:
    from kernels.pypto_rt import run_jobs

    jobs, meta = [], []
    for name, case in cases.items():
        g = parse_graph(case.text, f"<{name}>")
        verify(g)
        tg = build_task_graph(g)
        mem = Memory(tg, case_inputs(g, case))
        for t in tg.kernels[:-1]:
            run_task(t, [mem])
        task = tg.kernels[-1]
        jobs.append(kernel_job(task, tg, mem, "full", True, ("T",)))
        meta.append((name, task))
    results = run_jobs(jobs, 300, workers=workers)
    return {name: (task, job, res) for (name, task), job, res in zip(meta, jobs, results)}


def check_case(case: Case, job, res) -> None:
    assert res.ok, f"{res.error}\n{res.log[-3000:]}"
    assert not res.clobbered
    for name, want in job.goldens.items():
        got = res.outputs[name]
        assert got.dtype == want.dtype and got.shape == want.shape, (name, got.dtype, got.shape)
        if case.ulps is not None:
            allowed = case.ulps.get(name, 0) if isinstance(case.ulps, dict) else case.ulps
            assert ulps(got, want) <= allowed, f"{name}: {ulps(got, want)} ulps"
        else:
            assert rel_err(got, want) <= case.rel, f"{name}: rel err {rel_err(got, want):.3g}"

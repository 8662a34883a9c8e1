"""The cost form of tp_o_dequant_reduce_scatter (dequant-into-owner-windows, pypto-lib #980 / #998) through pypto
0.2.0 on CPU: its local part (the tp·T dequantised rows into a window-shaped f32 tensor, then this rank's T rows
summed over the tp lanes in ascending order and rounded once) equals numpy's o_proj_b_dequant followed by the same
ascending lane sum, bitwise, at a tiny TP2 shape with a ragged row count and at TP4; and it compiles at the flash
TP4 shape the cost model simulates."""
from __future__ import annotations

import numpy as np
import pytest
from ml_dtypes import bfloat16

from dspark_ir import parse_graph
from dspark_ir.semantics.oproj import o_proj_b_dequant
from kernels.pypto_rt import KernelJob, run_jobs
from lowering import build_task_graph
from perf.costs import local_part_source

pytestmark = pytest.mark.pypto


def _graph(tp: int, t: int, hidden: int, groups: int) -> str:
    parts = ", ".join(f"%acc{g}: i32[{tp}*T,{hidden}], %s{g}: f32[{tp}*T]" for g in range(groups))
    args = ", ".join(f"%acc{g}, %s{g}" for g in range(groups))
    return (f"graph @k<T = {t}>(%sw: f32[{hidden}], {parts}) attributes {{ranks = {tp}, tp = {tp}}} {{\n"
            f"  %y = tp_o_dequant_reduce_scatter(%sw, {args}) {{tp = {tp}, workers = {2 * tp}, blocks = {2 * tp}}}"
            f" : bf16[T,{hidden}]\n  return %y\n}}\n")


def _job(tp: int, t: int, hidden: int, groups: int, mode: str, seed: int = 0):
    tg = build_task_graph(parse_graph(_graph(tp, t, hidden, groups)))
    [task] = tg.kernels
    rng = np.random.default_rng(seed)
    values = {"wo_b_scale": rng.uniform(0.5, 2.0, hidden).astype(np.float32) / 64}
    operands = [values["wo_b_scale"]]
    for a in task.args:
        if a.direction != "in" or a.param == "wo_b_scale":
            continue
        if a.dtype == "i32":
            values[a.param] = rng.integers(-4000, 4000, a.shape).astype(np.int32)
        else:
            values[a.param] = rng.uniform(0.01, 0.05, a.shape).astype(np.float32)
        operands.append(values[a.param])
    [out] = [a for a in task.args if a.direction == "out"]
    partial = o_proj_b_dequant(*operands, out="f32")
    lanes = partial.reshape(tp, t, hidden)
    acc = lanes[0].copy()
    for lane in lanes[1:]:
        acc = acc + lane
    golden = {out.param: acc.astype(bfloat16)}
    job = KernelJob(local_part_source(task), "kernel", values, {out.param: (tuple(out.shape), "bf16")},
                    mode=mode, label=f"tp{tp}.T{t}", goldens=golden if mode == "full" else {})
    return job, out.param, golden[out.param]


@pytest.fixture(scope="module")
def results():
    shapes = {"tp2_ragged": (2, 5, 64, 2, "full"), "tp4": (4, 4, 128, 1, "full"),
              "flash_tp4": (4, 128, 4096, 2, "compile")}
    jobs = {name: _job(*shape) for name, shape in shapes.items()}
    done = run_jobs([job for job, _, _ in jobs.values()], 600, workers=2)
    return {name: (jobs[name], res) for name, res in zip(jobs, done)}


@pytest.mark.parametrize("name", ["tp2_ragged", "tp4"])
def test_local_part_matches_numpy_bitwise(results, name):
    (job, param, want), res = results[name]
    assert res.ok, f"{res.error}\n{res.log[-3000:]}"
    assert np.count_nonzero(want.astype(np.float32)) > want.size // 2          # real values, not zeros
    np.testing.assert_array_equal(res.outputs[param].astype(np.float32), want.astype(np.float32))


def test_compiles_at_flash_tp4(results):
    _, res = results["flash_tp4"]
    assert res.ok, f"{res.error}\n{res.log[-3000:]}"

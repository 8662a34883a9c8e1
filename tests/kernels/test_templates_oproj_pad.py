"""pypto 0.2.0 templates of the O path's padded TP1 form (the seed's decode_o_proj_tp1 before pypto-lib #1226, the
before of the `o-proj-valid-rows` pass), through the harness against the numpy references: quant_rows zeroing the
int8 rows past x (`pad_rows`), and o_proj_b_dequant reading only the first (scale) rows of padded accumulators,
in one block and in a loop of row blocks whose last block is partial. Integer products and the q8 quant are exact,
the dequant sums in the reference's order: bitwise."""
from __future__ import annotations

import numpy as np
import pytest

from dspark_ir import parse_graph, verify
from lowering import build_task_graph
from lowering.executors import Memory
from lowering.pypto_exec import kernel_job
from tests.lowering.pypto_cases import Case, case_inputs, check_case

pytestmark = pytest.mark.pypto


def _dequant_inputs(g, rng):
    out = {}
    for p in g.params:
        shape = p.type.concrete_shape(g.env)
        if p.type.dtype.is_int:
            out[p.name] = rng.integers(-3000, 3000, shape).astype(np.int32)
        else:
            out[p.name] = rng.uniform(0.001, 0.02, shape).astype(np.float32)
    return out


CASES = {
    # one block of 20 rows, zero rows 20 … 47
    "quant_rows_pad": Case("graph @k<T = 20>(%x: f32[T,64]) {\n"
                           "  %q, %s = quant_rows(%x) {pad_rows = 48} : i8[48,64], f32[T]\n"
                           "  return %q, %s\n}\n"),
    # row blocks of 8 (the last partial), then 108 zero rows of 1024 columns in 16-row blocks (the last partial)
    "quant_rows_pad_wide_blocks": Case("graph @k<T = 20>(%x: f32[T,1024]) {\n"
                                       "  %q, %s = quant_rows(%x) {tile = [8], pad_rows = 128, tail = clamp}"
                                       " : i8[128,1024], f32[T]\n  return %q, %s\n}\n"),
    # the padded accumulators' first T rows, one block
    "o_proj_b_dequant_padded": Case(
        "graph @k<T = 12>(%sw: f32[256], %a0: i32[32,256], %s0: f32[T], %a1: i32[32,256], %s1: f32[T]) {\n"
        "  %y = o_proj_b_dequant(%sw, %a0, %s0, %a1, %s1) {out = bf16, tile = [8, 256]} : bf16[T,256]\n"
        "  return %y\n}\n", make_inputs=_dequant_inputs),
    # N = 2048: 8-row blocks over the 20 scale rows (the last partial) of 64-row accumulators
    "o_proj_b_dequant_padded_blocks": Case(
        "graph @k<T = 20>(%sw: f32[2048], %a0: i32[64,2048], %s0: f32[T], %a1: i32[64,2048], %s1: f32[T]) {\n"
        "  %y = o_proj_b_dequant(%sw, %a0, %s0, %a1, %s1) {out = f32, tile = [8, 256], tail = clamp} : f32[T,2048]\n"
        "  return %y\n}\n", make_inputs=_dequant_inputs),
}


SENTINEL = 7   # every output starts filled with it: a row the kernel does not write keeps it and fails the check


@pytest.fixture(scope="module")
def batch():
    from kernels.pypto_rt import run_jobs

    jobs, meta = [], []
    for name, case in CASES.items():
        g = parse_graph(case.text, f"<{name}>")
        verify(g)
        tg = build_task_graph(g)
        task = tg.kernels[-1]
        job = kernel_job(task, tg, Memory(tg, case_inputs(g, case)), "full", True, ("T",))
        job.outputs = {k: np.full(v[0], SENTINEL, v[1]) if isinstance(v, tuple) else np.full_like(v, SENTINEL)
                       for k, v in job.outputs.items()}
        jobs.append(job)
        meta.append((name, task))
    results = run_jobs(jobs, 300, workers=2)
    return {name: (task, job, res) for (name, task), job, res in zip(meta, jobs, results)}


@pytest.mark.parametrize("case", sorted(CASES))
def test_padded_o_path_template_matches_numpy_reference(batch, case):
    task, job, res = batch[case]
    check_case(CASES[case], job, res)

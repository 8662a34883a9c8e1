"""The template option hca-attn-dual-aiv sets on hca_cmp_qk_pv (`aiv_split`), run through pypto 0.2.0 on CPU:
the split kernel is a different source (more, smaller softmax subgraphs), passes the harness's checks against the
numpy reference, and its outputs are bitwise those of the unsplit kernel (the softmax columns are independent).
Cases: requests of 2 tokens (groups of 1 after the split) and of 4 tokens with a last, partial request."""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.pypto

GRAPH = ("graph @k<T = 6>(%q: bf16[T,4,64], %rows: bf16[3,32,64], %phys: i32[3,32], %pos: i32[T], %kvl: i32[3]) {\n"
         "  %m, %l, %o = hca_cmp_qk_pv(%q, %rows, %phys, %pos, %kvl) {scale = 0.125, ratio = 4, seq = SEQ,"
         " work_rows = 16, max_rows = 24SPLIT} : f32[T,2,4], f32[T,2,4], f32[T,2,4,64]\n  return %m, %l, %o\n}\n")


def _inputs(g, rng):
    phys = rng.integers(0, 200, (3, 32)).astype(np.int32)
    phys[0, 8:16] = -1                                  # an unmapped page inside the visible rows
    return {"q": rng.standard_normal((6, 4, 64)), "rows": rng.standard_normal((3, 32, 64)), "phys": phys,
            "pos": np.array([130, 131, 40, 41, 2, 3], np.int32), "kvl": np.array([132, 41, 4], np.int32)}


def _job(seq: int, split: int):
    from dspark_ir import parse_graph, verify
    from lowering import build_task_graph
    from lowering.executors import Memory
    from lowering.pypto_exec import kernel_job

    text = GRAPH.replace("SEQ", str(seq)).replace("SPLIT", f", aiv_split = {split}" if split > 1 else "")
    g = parse_graph(text, f"<cmp_qk_pv seq {seq} split {split}>")
    verify(g)
    tg = build_task_graph(g)
    mem = Memory(tg, _inputs(g, np.random.default_rng(0)))
    task = tg.kernels[-1]
    assert task.op == "hca_cmp_qk_pv"
    return kernel_job(task, tg, mem, "full", True, ("T",))


@pytest.fixture(scope="module")
def batch():
    from kernels.pypto_rt import run_jobs

    keys = [(seq, split) for seq in (2, 4) for split in (1, 2)]
    jobs = [_job(*k) for k in keys]
    return dict(zip(keys, zip(jobs, run_jobs(jobs, 600, workers=2))))


@pytest.mark.parametrize("seq", (2, 4))
def test_split_is_another_kernel_with_the_same_outputs(batch, seq):
    (plain_job, plain), (split_job, split) = batch[(seq, 1)], batch[(seq, 2)]
    assert plain_job.source != split_job.source
    for res in (plain, split):
        assert res.ok, f"{res.error}\n{res.log[-3000:]}"
        assert res.verify and not res.verify_failed, [str(r) for r in res.verify_failed]
    for name, got in split.outputs.items():
        want = plain.outputs[name]
        assert got.dtype == want.dtype and np.array_equal(got.view(np.uint8), want.view(np.uint8)), name

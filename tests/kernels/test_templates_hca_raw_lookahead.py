"""The QK look-ahead hca-attn-dual-aiv sets on the HCA raw attention (`lookahead`, pypto-lib #1187), run through
pypto 0.2.0 on CPU: the pipelined kernel is another source (the q·Kᵀ of later queries issued before the softmax and
P·V of earlier ones), passes the harness's checks against the numpy reference, and its outputs are bitwise those
of the in-order kernel (the same operations on the same values, only their program order differs).
Cases: hca_raw_attn_direct over T = 6 tokens (one 4-token loop iteration and a 2-token tail) with 8 heads (the
pair units: two tokens per q·Kᵀ) and 4 heads (one token per unit); hca_raw_attn_request with S = 3 (a pair and a
last single token per request)."""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.pypto

DIRECT = ("graph @k<T = 6>(%q: bf16[T,H,64], %rows: bf16[T,16,64], %idx: i32[T,16]) {\n"
          "  %m, %l, %o = hca_raw_attn_direct(%q, %rows, %idx) {scale = 0.125LA} : f32[T,H], f32[T,H], f32[T,H,64]\n"
          "  return %m, %l, %o\n}\n")
REQUEST = ("graph @k<T = 6>(%q: bf16[T,H,64], %rows: bf16[T//3,18,64], %idx: i32[T,16]) {\n"
           "  %m, %l, %o = hca_raw_attn_request(%q, %rows, %idx) {scale = 0.125, seq = 3LA} : f32[T,H], f32[T,H], "
           "f32[T,H,64]\n  return %m, %l, %o\n}\n")


def _inputs(form: str, heads: int, rng):
    idx = np.tile(np.arange(16, dtype=np.int32), (6, 1))
    idx[1, 12:] = -1                                    # a short window (its last keys masked)
    idx[4, :] = -1                                      # a token with no raw key at all
    rows = (6, 16, 64) if form == "direct" else (2, 18, 64)
    return {"q": rng.standard_normal((6, heads, 64)), "rows": rng.standard_normal(rows), "idx": idx}


def _job(form: str, heads: int, lookahead: int):
    from dspark_ir import parse_graph, verify
    from lowering import build_task_graph
    from lowering.executors import Memory
    from lowering.pypto_exec import kernel_job

    text = (DIRECT if form == "direct" else REQUEST).replace("H,", f"{heads},").replace("H]", f"{heads}]")
    text = text.replace("LA", f", lookahead = {lookahead}" if lookahead else "")
    g = parse_graph(text, f"<{form} heads {heads} lookahead {lookahead}>")
    verify(g)
    tg = build_task_graph(g)
    mem = Memory(tg, _inputs(form, heads, np.random.default_rng(0)))
    task = tg.kernels[-1]
    return kernel_job(task, tg, mem, "full", True, ("T",))


KEYS = [("direct", 8), ("direct", 4), ("request", 8)]


@pytest.fixture(scope="module")
def batch():
    from kernels.pypto_rt import run_jobs

    keys = [(form, heads, la) for form, heads in KEYS for la in (0, 2)]
    jobs = [_job(*k) for k in keys]
    return dict(zip(keys, zip(jobs, run_jobs(jobs, 900, workers=2))))


@pytest.mark.parametrize(("form", "heads"), KEYS)
def test_lookahead_is_another_kernel_with_the_same_outputs(batch, form, heads):
    (plain_job, plain), (ahead_job, ahead) = batch[(form, heads, 0)], batch[(form, heads, 2)]
    assert plain_job.source != ahead_job.source
    for res in (plain, ahead):
        assert res.ok, f"{res.error}\n{res.log[-3000:]}"
        assert res.verify and not res.verify_failed, [str(r) for r in res.verify_failed]
    for name, got in ahead.outputs.items():
        want = plain.outputs[name]
        assert got.dtype == want.dtype and np.array_equal(got.view(np.uint8), want.view(np.uint8)), name

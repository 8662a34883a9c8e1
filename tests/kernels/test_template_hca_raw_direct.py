"""The pypto 0.2.0 template of `hca_raw_attn_direct` (kernels/sparse.py, the hca-raw-kv-no-transpose pass's form),
run in pypto on CPU beside hca_raw_attn's on the same data.

Two one-op graphs per case (T = 10 with a fully masked token and −1 holes; the tiny decode-hca shape T = 16, 8 heads,
window 16), one batch in full mode (SIM + pass-verify). The direct kernel must be BITWISE equal to hca_raw_attn's
kernel (whose Kᵀ operand it no longer has: the same cube matmuls on the same rows), and both within f32 rounding
of the numpy reference: the cube sums q·K in f32 where the reference rounds an f64 sum once
(tests/kernels/test_templates_sparse.py has the per-point bound for hca_raw_attn; here a plain relative bound of
2⁻¹⁰ of the row's largest magnitude, which a wrong key, mask or head fails by orders of magnitude).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

pytestmark = pytest.mark.pypto

SHAPES = {"partial_masked": (10, 4, 16), "tiny_hca": (16, 8, 16)}   # (T, heads, window); head_dim 64


def _texts(t: int, h: int, w: int) -> dict[str, str]:
    head = f"graph @k<T = {t}>(%q: bf16[T,{h},64], %rows: bf16[T,{w},64], %rt: bf16[T,64,{w}], %idx: i32[T,{w}]) {{\n"
    res = f": f32[T,{h}], f32[T,{h}], f32[T,{h},64]\n  return %m, %l, %h\n}}\n"
    return {"hca_raw_attn": head + "  %m, %l, %h = hca_raw_attn(%q, %rows, %rt, %idx) {scale = 0.125} " + res,
            "hca_raw_attn_direct": head + "  %m, %l, %h = hca_raw_attn_direct(%q, %rows, %idx) {scale = 0.125} "
                                          + res}


def _inputs(t: int, h: int, w: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, 500, (t, w)).astype(np.int32)
    idx[rng.random((t, w)) < 0.25] = -1
    idx[3] = -1                                                    # a token that sees no row
    bf = ml_dtypes.bfloat16
    rows = np.where(idx[..., None] >= 0, rng.standard_normal((t, w, 64)).astype(bf).astype(np.float32), 0.0)
    return {"q": rng.standard_normal((t, h, 64)).astype(bf).astype(np.float32), "rows": rows,
            "rt": np.swapaxes(rows, 1, 2).copy(), "idx": idx}


def _job(text: str, inputs: dict):
    from dspark_ir import parse_graph, verify
    from lowering import build_task_graph
    from lowering.executors import Memory
    from lowering.pypto_exec import kernel_job

    g = parse_graph(text, "<hca_raw_direct>")
    verify(g)
    tg = build_task_graph(g)
    task, = tg.kernels
    given = {p.name: inputs[p.name] for p in g.params}
    return task, kernel_job(task, tg, Memory(tg, given), "full", True, ("T",))


@pytest.fixture(scope="module")
def batch():
    from kernels.pypto_rt import run_jobs

    jobs = {}
    for case, shape in SHAPES.items():
        inputs = _inputs(*shape, seed=len(jobs))
        for op, text in _texts(*shape).items():
            jobs[(case, op)] = _job(text, inputs)
    results = run_jobs([job for _, job in jobs.values()], 600, workers=2)
    return {key: (task, job, res) for (key, (task, job)), res in zip(jobs.items(), results)}


@pytest.mark.parametrize("case", sorted(SHAPES))
def test_direct_kernel_is_the_transposed_form_bitwise(batch, case):
    _, direct_job, direct = batch[(case, "hca_raw_attn_direct")]
    _, _, old = batch[(case, "hca_raw_attn")]
    for res in (direct, old):
        assert res.ok, f"{res.error}\n{res.log[-3000:]}"
        assert res.verify and not res.verify_failed, [str(r) for r in res.verify_failed]
    assert "rt" not in direct_job.inputs                           # the direct kernel has no Kᵀ operand
    for name in direct_job.goldens:
        got, want = direct.outputs[name], old.outputs[name]
        assert got.shape == want.shape and np.array_equal(got.view(np.uint32), want.view(np.uint32)), name


@pytest.mark.parametrize("case", sorted(SHAPES))
def test_direct_kernel_matches_the_reference(batch, case):
    _, job, res = batch[(case, "hca_raw_attn_direct")]
    for name, want in job.goldens.items():
        got = res.outputs[name].astype(np.float64)
        want = want.astype(np.float64)
        scale = np.max(np.abs(want), axis=-1, keepdims=True) + 1e-30
        assert np.all(np.abs(got - want) <= 2.0 ** -10 * scale), name
    m = job.goldens["m"]
    assert m[3].max() == np.float32(-1e20) and not job.goldens["heads"][3].any()   # the fully masked token

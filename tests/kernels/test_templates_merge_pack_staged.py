"""The hca_stream_merge_pack template's `stage_heads` option (the seed's fused kernel before pypto-lib #1229: each
item's normalised f32 heads through a GM scratch, read back in a second subgraph for the inverse RoPE and pack;
fuse-merge-rope-pack{heads_on_chip=false}), through the harness: bitwise equal to the on-chip form run through
pypto on the same inputs (the scratch holds the same f32 values), and within the merge kernels' documented
tolerance of the numpy reference (pypto's CPU exp is torch's: bf16 outputs ≤ 1 ulp on ≤ 0.1 % of points, see
tests/kernels/test_templates_sparse.py). Tiny shapes: T = 10 (a partial last block), 4 heads in 2 O groups, a
token with nothing visible and a neutral work item."""
from __future__ import annotations

import numpy as np
import pytest

pytestmark = pytest.mark.pypto

TEXT = ("graph @k<T = 10>(%m: f32[T,4], %l: f32[T,4], %h: f32[T,4,64], %cm: f32[T,2,4], %cl: f32[T,2,4],"
        " %co: f32[T,2,4,64], %sink: f32[4], %c: bf16[T,16], %s: bf16[T,16], %sw: i32[16]) {{\n"
        "  %y = hca_stream_merge_pack(%m, %l, %h, %cm, %cl, %co, %sink, %c, %s, %sw) {{o_groups = 2{extra}}}"
        " : bf16[2,T,128]\n  return %y\n}}\n")


def _inputs(g, rng):
    t = g.symbols["T"]
    m, l = rng.normal(1, 1, (t, 4)), rng.uniform(0.5, 8, (t, 4))
    h = rng.standard_normal((t, 4, 64))
    cm, cl = rng.normal(1, 1, (t, 2, 4)), rng.uniform(0.5, 8, (t, 2, 4))
    co = rng.standard_normal((t, 2, 4, 64))
    m[4], l[4], h[4], cm[4], cl[4], co[4] = -1e20, 0.0, 0.0, -1e20, 0.0, 0.0    # nothing visible: out = 0
    cm[6, 1], cl[6, 1], co[6, 1] = -1e20, 0.0, 0.0                               # a neutral work item
    return {"m": m, "l": l, "h": h, "cm": cm, "cl": cl, "co": co, "sink": rng.standard_normal(4),
            "c": rng.uniform(-1, 1, (t, 16)), "s": rng.uniform(-1, 1, (t, 16)),
            "sw": rng.permutation(16).astype(np.int32)}


def _job(staged: bool):
    from dspark_ir import parse_graph, verify
    from lowering import build_task_graph
    from lowering.executors import Memory
    from lowering.pypto_exec import kernel_job
    from tests.lowering.pypto_cases import Case, case_inputs

    text = TEXT.format(extra=", stage_heads = true" if staged else "")
    g = parse_graph(text, "<merge_pack>")
    verify(g)
    tg = build_task_graph(g)
    task = tg.kernels[-1]
    return task, kernel_job(task, tg, Memory(tg, case_inputs(g, Case(text, make_inputs=_inputs))), "full", True,
                            ("T",))


@pytest.fixture(scope="module")
def batch():
    from kernels.pypto_rt import run_jobs

    jobs = {"staged": _job(True), "on_chip": _job(False)}
    results = run_jobs([job for _, job in jobs.values()], 600, workers=2)
    return {name: (task, job, res) for (name, (task, job)), res in zip(jobs.items(), results)}


def test_staged_source_goes_through_a_scratch_in_a_second_subgraph(batch):
    _, staged, _ = batch["staged"]
    _, on_chip, _ = batch["on_chip"]
    assert 'pypto.tensor([' in staged.source and "sg_set_scope=2" in staged.source
    assert "sg_set_scope=2" not in on_chip.source


def test_staged_equals_on_chip_bitwise_and_the_reference_within_tolerance(batch):
    for name in ("staged", "on_chip"):
        _, _, res = batch[name]
        assert res.ok, f"{name}: {res.error}\n{res.log[-3000:]}"
        assert not res.clobbered
    _, job, staged = batch["staged"]
    _, _, on_chip = batch["on_chip"]
    [name] = job.goldens
    got, chip, want = staged.outputs[name], on_chip.outputs[name], job.goldens[name]
    assert got.view(np.uint16).tobytes() == chip.view(np.uint16).tobytes()
    diff = np.abs(got.view(np.int16).astype(np.int64) - want.view(np.int16).astype(np.int64))
    assert diff.max(initial=0) <= 1 and (diff > 0).mean() <= 1e-3
    assert not want[:, 4].astype(np.float32).any() and want.astype(np.float32).any()

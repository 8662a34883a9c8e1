"""The local part of hca_stream_merge_pack_publish (hca-merge-pack-publish, pypto-lib #1170 (b)): its cost form
(kernels/sparse.py) is the merge-pack on `publish_tokens`-token tiles whose packed heads are assembled from the UB
straight into a window-shaped tensor (group g at [g mod LG, (g div LG)·T + t, ·]: this rank standing in for
every source), no packed tensor. Run through pypto 0.2.0 on CPU next to the plain merge-pack template on the same
inputs: the window's data rows are bitwise the plain kernel's packed heads laid out as the exchange lays them
(the same per-element operations), the pad rows are left as the host filled them (zero), and both are within the
merge kernels' documented tolerance of the numpy reference (pypto's CPU exp is torch's: bf16 outputs ≤ 1 ulp on
≤ 0.1 % of points, tests/kernels/test_templates_sparse.py). Tiny shapes: T = 6 (the last 4-token tile partial),
4 heads in 2 O groups at TP2 (one group per rank) with t_pad = 4 (rows 12..15 pad), a token with nothing visible
and a neutral work item."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

pytestmark = pytest.mark.pypto

OPS = ("%m: f32[T,4], %l: f32[T,4], %h: f32[T,4,64], %cm: f32[T,2,4], %cl: f32[T,2,4], %co: f32[T,2,4,64], "
       "%sink: f32[4], %c: bf16[T,16], %s: bf16[T,16], %sw: i32[16]")
ARGS = "%m, %l, %h, %cm, %cl, %co, %sink, %c, %s, %sw"
PLAIN = (f"graph @k<T = 6>({OPS}) {{\n  %y = hca_stream_merge_pack({ARGS}) {{o_groups = 2}} : bf16[2,T,128]\n"
         "  return %y\n}\n")
PUBLISH = (f"graph @k<T = 6>({OPS}) attributes {{ranks = 2, tp = 2}} {{\n"
           f"  %y = hca_stream_merge_pack_publish({ARGS}) {{o_groups = 2, tp = 2, t_pad = 4, blocks = 48, "
           "workers = 48} : bf16[1,8*ceil(T/4),128]\n  return %y\n}\n")
T, TP, LG, ROWS = 6, 2, 1, 16
NP = {"f32": np.float32, "bf16": ml_dtypes.bfloat16, "i32": np.int32}


def _inputs(rng):
    m, l = rng.normal(1, 1, (T, 4)), rng.uniform(0.5, 8, (T, 4))
    h = rng.standard_normal((T, 4, 64))
    cm, cl = rng.normal(1, 1, (T, 2, 4)), rng.uniform(0.5, 8, (T, 2, 4))
    co = rng.standard_normal((T, 2, 4, 64))
    m[4], l[4], h[4], cm[4], cl[4], co[4] = -1e20, 0.0, 0.0, -1e20, 0.0, 0.0    # nothing visible: out = 0
    cm[1, 1], cl[1, 1], co[1, 1] = -1e20, 0.0, 0.0                               # a neutral work item
    return {"m": m, "l": l, "h": h, "cm": cm, "cl": cl, "co": co, "sink": rng.standard_normal(4),
            "c": rng.uniform(-1, 1, (T, 16)), "s": rng.uniform(-1, 1, (T, 16)),
            "sw": rng.permutation(16).astype(np.int32)}


def _graph(text: str):
    from dspark_ir import parse_graph, verify
    from lowering import build_task_graph

    g = parse_graph(text, "<merge_pack_publish>")
    verify(g)
    return g, build_task_graph(g)


def _window_of(packed: np.ndarray) -> np.ndarray:
    """The local part's window: for every source slot s, the groups [s·LG, (s+1)·LG) of packed at rows s·T + t."""
    out = np.zeros((LG, ROWS, packed.shape[2]), packed.dtype)
    for s in range(TP):
        out[:, s * T:(s + 1) * T] = packed[s * LG:(s + 1) * LG]
    return out


@pytest.fixture(scope="module")
def batch():
    from dspark_ir.semantics.sparse import hca_stream_merge_pack
    from kernels.pypto_rt import KernelJob, run_jobs
    from lowering.executors import Memory
    from lowering.pypto_exec import kernel_job
    from perf.costs import local_part_source
    from tests.lowering.pypto_cases import Case, case_inputs

    g, tg = _graph(PLAIN)
    raw = case_inputs(g, Case(PLAIN, make_inputs=lambda _g, rng: _inputs(rng)))
    inputs = {p.name: np.asarray(raw[p.name]).astype(NP[str(p.type.dtype)]) for p in g.params}
    plain = kernel_job(tg.kernels[-1], tg, Memory(tg, inputs), "full", True, ("T",))
    want = hca_stream_merge_pack(*(inputs[p.name] for p in g.params), o_groups=2)

    _, ptg = _graph(PUBLISH)
    [task] = [t for t in ptg.tasks if t.op == "hca_stream_merge_pack_publish"]
    source = local_part_source(task)
    ins = {a.param: np.ascontiguousarray(inputs[p.name])
           for a, p in zip([a for a in task.args if a.direction == "in"], g.params)}
    [out] = [a for a in task.args if a.direction == "out"]
    publish = KernelJob(source, "kernel", ins, {out.param: (tuple(out.shape), out.dtype)}, mode="full",
                        label="publish", goldens={out.param: _window_of(want)})
    plain_res, publish_res = run_jobs([plain, publish], 600, workers=2)
    return {"plain": (plain, plain_res), "publish": (publish, publish_res), "want": want, "out": out.param}


def test_the_local_part_assembles_into_the_window_in_4_token_tiles():
    from perf.costs import local_part_source

    _, ptg = _graph(PUBLISH)
    [task] = [t for t in ptg.tasks if t.op == "hca_stream_merge_pack_publish"]
    source = local_part_source(task)
    assert "gg % 1, gg // 1 * 6 + t0" in source                     # group g's row block in owner g div LG
    assert "pypto.loop(0, 4, 1" in source                           # ceil(6 / 4) tiles x 2 groups
    assert "t0 = pypto.min(blk // 2 * 4, 2)" in source              # the partial last tile moved back to end at T


def test_window_rows_are_the_plain_packed_heads_bitwise(batch):
    for name in ("plain", "publish"):
        _, res = batch[name]
        assert res.ok, f"{name}: {res.error}\n{res.log[-3000:]}"
        assert not res.clobbered
    (pjob, plain), (_, publish) = batch["plain"], batch["publish"]
    [packed_name] = pjob.goldens
    window = publish.outputs[batch["out"]]
    relaid = _window_of(plain.outputs[packed_name])
    assert window.view(np.uint16).tobytes() == relaid.view(np.uint16).tobytes()
    assert not window[:, TP * T:].astype(np.float32).any()         # pad rows: not written (host zeros)


def test_within_the_reference_tolerance(batch):
    _, publish = batch["publish"]
    got, want = publish.outputs[batch["out"]], _window_of(batch["want"])
    diff = np.abs(got.view(np.int16).astype(np.int64) - want.view(np.int16).astype(np.int64))
    assert diff.max(initial=0) <= 1 and (diff > 0).mean() <= 1e-3
    assert want.astype(np.float32).any()

"""pypto 0.2.0 templates of rope, matmul_partials, split_reduce and window_copy_out, through the harness.

One module-level batch (one `run_jobs` call, so one pypto process start per worker) holds:
* `full` jobs (SIM + pass-verify with our CPU-numerics fix) at the tiny config's shapes, checked against the
  numpy references: synthetic single-op graphs, plus the tiny decode-swa layer's own matmul_partials /
  split_reduce tasks (`deterministic-split-k{targets=all}`) on the layer's seeded inputs;
* `compile` jobs (to the execute graph) at the flash TP4 shapes: the flash decode-swa layer's split-K tasks
  and its window_copy_out (before form), and rope at the flash q / kv / o-derotation / indexer-q shapes.

Tolerances:
* rope, split_reduce, window_copy_out: bitwise (same f32 expressions in the same order / ascending adds /
  pure data movement).
* matmul_partials: bitwise on small-integer inputs (every sum exact); on real float inputs each partial is
  an f32 dot product of n = |K slice| terms summed in the cube's order (torch's on CPU), not numpy's (BLAS).
  Each order is within (n − 1)·u·(|a|·|b|) of the exact sum (u = 2⁻²⁴); rounding errors behave like a random
  walk, so the allowance is 2·√n·u·(|a|·|b|) element-wise (both orders). Observed: ≤ 1.6·u·(|a|·|b|) at
  n = 33 on normal inputs; the tiny layer's own qr/kv partials came out bitwise.
"""
from __future__ import annotations

import numpy as np
import pytest

import runner
from dspark_ir import parse_graph, verify
from lowering import build_task_graph
from lowering.codegen import kernel_module
from lowering.executors import Memory, operand_arrays, reference_of, run_task
from lowering.pypto_exec import kernel_job
from tests.lowering.pypto_cases import Case, case_inputs, check_case, ulps

pytestmark = pytest.mark.pypto

RUNTIME = ("T",)


def _g(params: str, body: str, sig: str = "T = 32") -> str:
    return f"graph @k<{sig}>({params}) {{\n  %y = {body}\n  return %y\n}}\n"


# ---- full mode: tiny shapes (TINY: T = 32, heads 8, head_dim 64, rope_dim 16, hidden 256) ----------------
CASES = {
    # rope at the tiny q / kv / o-derotation shapes; partial row blocks, rank 4, rope_dim 8 (the fuzzer's),
    # flash's rope_dim 64 with uneven head groups (8 + 4), rope only
    "rope_q": Case(_g("%x: bf16[T,8,64], %c: bf16[T,8], %s: bf16[T,8]",
                      "rope(%x, %c, %s) {rope_dim = 16} : bf16[T,8,64]")),
    "rope_kv_partial": Case(_g("%x: bf16[T,64], %c: bf16[T,8], %s: bf16[T,8]",
                               "rope(%x, %c, %s) {rope_dim = 16} : bf16[T,64]", "T = 20")),
    "rope_inverse_f32_in": Case(_g("%x: f32[T,8,64], %c: bf16[T,8], %s: bf16[T,8]",
                                   "rope(%x, %c, %s) {rope_dim = 16, inverse = true} : bf16[T,8,64]")),
    "rope_rank4_f32_out": Case(_g("%x: f32[T,2,2,64], %c: f32[T,16], %s: f32[T,16]",
                                  "rope(%x, %c, %s) {rope_dim = 32, out = f32} : f32[T,2,2,64]", "T = 6")),
    "rope_rd8_nope24": Case(_g("%x: bf16[T,32], %c: bf16[T,4], %s: bf16[T,4]",
                               "rope(%x, %c, %s) {rope_dim = 8} : bf16[T,32]", "T = 20")),
    "rope_rd64_head_groups": Case(_g("%x: bf16[T,12,128], %c: bf16[T,32], %s: bf16[T,32]",
                                     "rope(%x, %c, %s) {rope_dim = 64} : bf16[T,12,128]", "T = 3")),
    "rope_only": Case(_g("%x: bf16[T,16], %c: bf16[T,8], %s: bf16[T,8]",
                         "rope(%x, %c, %s) {rope_dim = 16, inverse = true} : bf16[T,16]", "T = 40")),
    # matmul_partials at the tiny qr_proj / kv_proj shapes, exact integer inputs; trans_b + uneven cut on floats
    "partials_qr_int": Case(_g("%a: bf16[T,256], %b: bf16[256,64]",
                               "matmul_partials(%a, %b) {k_split = 2, tile = [8, 32, 64]} : f32[2*T,64]"),
                            integers=True),
    "partials_kv_int": Case(_g("%a: bf16[T,256], %b: bf16[256,64]",
                               "matmul_partials(%a, %b) {k_split = 4, m_split = 4, tile = [8, 32, 64], tail = clamp}"
                               " : f32[4*T,64]", "T = 20"), integers=True),
    "partials_trans_uneven": Case(_g("%a: bf16[T,100], %b: bf16[48,100]",
                                     "matmul_partials(%a, %b) {k_split = 3, trans_b = true} : f32[3*T,48]", "T = 20"),
                                  ulps=None),
    # split_reduce (floats: ascending adds are bitwise); the tiny layer's own two reduces run below
    "split_reduce_4_partial": Case(_g("%p: f32[4*T,64]", "split_reduce(%p) {k_split = 4, tile = [8], tail = clamp}"
                                      " : f32[T,64]", "T = 20")),
    # window_copy_out: the tiny TP2 exchange window [o_groups/tp, tp·T_PAD, o_group_width] with pad rows (T = 12)
    "window_copy_out_pad": Case(_g("%w: bf16[2,32,128]",
                                   "window_copy_out(%w) {axis = 1, rows = 2*T} : bf16[2,2*T,128]", "T = 12")),
    "window_copy_out_axis0": Case(_g("%w: f32[48,64]", "window_copy_out(%w) {axis = 0, rows = 2*T} : f32[2*T,64]",
                                     "T = 20")),
}
FLOAT_MATMUL = {"partials_trans_uneven"}


def _golden(task, mem) -> dict[str, np.ndarray]:
    """The numpy reference on the task's inputs (collectives: the one-rank form), by output parameter."""
    fn = reference_of(task)
    attrs = {k: (list(v) if isinstance(v, tuple) else v) for k, v in task.attrs.items()}
    ops = operand_arrays(task, mem)
    value = fn([ops], ranks=1, **attrs)[0] if task.collective else fn(*ops, **attrs)
    [arg] = [a for a in task.args if a.direction == "out"]
    return {arg.param: np.asarray(value)}


def _full_job(task, tg, mem):
    job = kernel_job(task, tg, mem, "full", False, RUNTIME)
    job.inputs = {k: np.array(v, copy=True) for k, v in job.inputs.items()}  # later numpy tasks write mem
    job.goldens = _golden(task, mem)
    return job


def _synthetic_jobs():
    out = {}
    for name, case in CASES.items():
        g = parse_graph(case.text, f"<{name}>")
        verify(g)
        tg = build_task_graph(g)
        mem = Memory(tg, case_inputs(g, case))
        task = tg.kernels[-1]
        out[name] = (case, task, mem, _full_job(task, tg, mem))
    return out


def _pipeline_all() -> str:
    from passes.infra.defaults import DEFAULT_PIPELINE

    return ",".join(e.spec.replace("deterministic-split-k", "deterministic-split-k{targets=all}")
                    for e in DEFAULT_PIPELINE if e.enabled)


def _layer_tg(config: str, tp: int, optimize: bool = True):
    import passes
    from dspark_ir import layers

    g = layers.build("decode-swa", config=config, tp=tp)
    if optimize:
        g = passes.run_pipeline(g, _pipeline_all()).graph
    return g, build_task_graph(g)


SPLIT_OPS = ("matmul_partials", "split_reduce")


def _layer_jobs():
    """The tiny decode-swa (TP1) split-K tasks on the layer's seeded inputs: producers run on numpy."""
    g, tg = _layer_tg("tiny", 1)
    mem = Memory(tg, runner.layer_inputs(g, 0))
    out = {}
    for t in tg.tasks:
        if t.op in SPLIT_OPS:
            out[f"layer_{t.kernel}"] = (t, mem, _full_job(t, tg, mem))
        run_task(t, [mem])
    return out


def _rope_flash_jobs():
    """rope at flash TP4 shapes (T = 128 tokens per rank, 64 heads × 512, rope_dim 64; indexer 64 × 128)."""
    from kernels.pypto_rt import KernelJob

    texts = {
        "rope_flash_q": _g("%x: bf16[T,64,512], %c: bf16[T,32], %s: bf16[T,32]",
                           "rope(%x, %c, %s) {rope_dim = 64} : bf16[T,64,512]", "T = 128"),
        "rope_flash_kv": _g("%x: bf16[T,512], %c: bf16[T,32], %s: bf16[T,32]",
                            "rope(%x, %c, %s) {rope_dim = 64} : bf16[T,512]", "T = 128"),
        "rope_flash_o_inverse": _g("%x: f32[T,64,512], %c: bf16[T,32], %s: bf16[T,32]",
                                   "rope(%x, %c, %s) {rope_dim = 64, inverse = true} : bf16[T,64,512]", "T = 128"),
        "rope_flash_idx_q": _g("%x: bf16[T,64,128], %c: bf16[T,32], %s: bf16[T,32]",
                               "rope(%x, %c, %s) {rope_dim = 64} : bf16[T,64,128]", "T = 128"),
    }
    jobs = {}
    for name, text in texts.items():
        g = parse_graph(text, f"<{name}>")
        verify(g)
        tg = build_task_graph(g)
        jobs[name] = _compile_job(tg, tg.kernels[-1], KernelJob)
    return jobs


def _compile_job(tg, task, job_cls):
    from lowering.codegen import inout_input_name
    from lowering.pypto_exec import np_dtype

    inputs = {a.param if a.direction == "in" else inout_input_name(a.param): np.zeros(a.shape, np_dtype(a.dtype))
              for a in task.args if a.reads}
    outputs = {a.param: np.zeros(a.shape, np_dtype(a.dtype)) for a in task.args if a.writes}
    return job_cls(kernel_module(task, tg, runtime_symbols=RUNTIME), task.kernel, inputs, outputs, mode="compile",
                   label=task.name)


def _flash_layer_jobs():
    """The flash TP4 decode-swa split-K tasks (targets = all) and the before form's window_copy_out."""
    from kernels.pypto_rt import KernelJob

    jobs = {}
    _, tg = _layer_tg("flash", 4)
    for t in tg.kernels:
        if t.op in SPLIT_OPS:
            jobs[f"flash_{t.kernel}"] = _compile_job(tg, t, KernelJob)
    _, tg = _layer_tg("flash", 4, optimize=False)
    [copy] = [t for t in tg.kernels if t.name == "o.o_group_a2a.copy_out"]    # the O path's (the CP gathers
    jobs[f"flash_{copy.kernel}"] = _compile_job(tg, copy, KernelJob)            # read back with the same op)
    return jobs


@pytest.fixture(scope="module")
def batch():
    from kernels.pypto_rt import run_jobs

    synthetic = _synthetic_jobs()
    layer = _layer_jobs()
    compile_jobs = {**_rope_flash_jobs(), **_flash_layer_jobs()}
    names = list(synthetic) + list(layer) + list(compile_jobs)
    jobs = [v[-1] for v in synthetic.values()] + [v[-1] for v in layer.values()] + list(compile_jobs.values())
    results = dict(zip(names, run_jobs(jobs, 300, workers=2)))
    return synthetic, layer, compile_jobs, results


def _verify_ok(res) -> bool:
    """pypto's own checks all PASS: the tensor graph against the golden and the default passes' re-runs."""
    return bool(res.verify) and all(r.passed for r in res.verify)


def _matmul_bound(task, job) -> np.ndarray:
    """2·√n·2⁻²⁴·(|a|·|b|) per partial element (n: its K slice's length): the summation-order allowance."""
    a, b = (np.abs(np.asarray(job.inputs[name], np.float64)) for name in ("a", "b"))
    if task.attrs.get("trans_b"):
        b = b.T
    splits = int(task.attrs.get("k_split", 1))
    bounds = np.linspace(0, a.shape[1], splits + 1).astype(int)
    mag = np.concatenate([2 * np.sqrt(hi - lo) * (a[:, lo:hi] @ b[lo:hi])
                          for lo, hi in zip(bounds[:-1], bounds[1:])], axis=0)
    return 2.0 ** -24 * mag


@pytest.mark.parametrize("name", sorted(CASES))
def test_template_matches_reference_tiny(batch, name):
    synthetic, _, _, results = batch
    case, task, mem, job = synthetic[name]
    res = results[name]
    if name in FLOAT_MATMUL:
        assert res.ok, f"{res.error}\n{res.log[-3000:]}"
        got, want = res.outputs["out"], job.goldens["out"]
        assert np.all(np.abs(got.astype(np.float64) - want) <= _matmul_bound(task, job))
    else:
        check_case(case, job, res)
    assert _verify_ok(res), [(r.pass_name, r.passed) for r in res.verify]


def test_layer_split_k_tasks_tiny(batch):
    """decode-swa tiny TP1 with deterministic-split-k{targets=all}: qr/kv partials within the f32
    reassociation bound on the layer's real inputs, their ascending reductions bitwise."""
    _, layer, _, results = batch
    assert {t.op for t, _, _ in layer.values()} == set(SPLIT_OPS) and len(layer) == 4
    for name, (task, mem, job) in layer.items():
        res = results[name]
        assert res.ok, f"{name}: {res.error}\n{res.log[-3000:]}"
        assert not res.clobbered and _verify_ok(res), name
        got, want = res.outputs["out"], job.goldens["out"]
        if task.op == "split_reduce":
            assert ulps(got, want) == 0, name
        else:
            assert np.all(np.abs(got.astype(np.float64) - want) <= _matmul_bound(task, job)), name


def test_flash_tp4_shapes_compile(batch):
    _, _, compile_jobs, results = batch
    failed = {n: results[n].error for n in compile_jobs if not results[n].ok}
    assert not failed, failed
    assert len(compile_jobs) == 4 + 4 + 1


def test_templates_registered():
    from lowering import template_coverage

    cov = template_coverage()
    assert all(cov[op] for op in ("rope", "matmul_partials", "split_reduce", "window_copy_out"))


def test_collective_copy_out_runs_its_local_copy_in_pypto():
    """window_copy_out is a collective task whose data part is a local copy (its barriers move no data): the
    pypto executor places it on pypto, rendered from its template, and check_kernels compiles it."""
    from lowering.pypto_exec import PYPTO, placement, zeros_job

    _, tg = _layer_tg("tiny", 2, optimize=False)
    [copy] = [t for t in tg.kernels if t.name == "o.o_group_a2a.copy_out"]
    backend, why, _ = placement(copy, tg)
    assert copy.collective and backend == PYPTO and "barriers move no data" in why
    assert f"def {copy.kernel}(" in zeros_job(copy, tg).source

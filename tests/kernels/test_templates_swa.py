"""pypto 0.2.0 templates of the decode-swa (TP1) op kinds, run through the harness against the numpy references.

Two batches, each one `run_jobs` call (full mode: SIM + pass-verify with our CPU-numerics fix):

* **layer**: every task of the tiny TP1 decode-swa layer whose op kind is templated in kernels/qkv.py or
  kernels/attention.py, on its actual shapes and its actual data (the layer's seeded inputs, the earlier
  tasks run by the numpy executor);
* **edges**: single-op graphs (tests/lowering/pypto_cases.py) for what the layer data does not reach: partial
  row blocks (T not a multiple of the block), the flash widths (1024, 512: the 128-block pairwise sums),
  −1 and duplicate cache slots, −1 window indices anywhere, fully masked tokens, k_tile < window (the merge).

That every task of the flash TP4 layer compiles to the execute graph is tests/lowering/test_pypto_flash_compile.py's.

Comparisons (res.ok, inputs untouched, and pypto's own tensor-graph + 6 default pass-verify rows all PASS):

* rope_tables, swa_cache_insert_valid_bias, swa_gather_kv: bitwise equal to the numpy reference.
* qr_rms_norm_quant, qproj_dequant_rms_nope_rope, kv_rms_norm_rope, merge_norm: every op and the summation
  order are the reference's, but pypto's CPU calculator evaluates SQRT and EXP with torch, whose f32 sqrt is
  1 ulp off the correctly rounded value on ~0.6 % of arguments and whose exp differs from numpy's by 1 ulp on
  many. So: bitwise equal to the reference evaluated with torch's sqrt/exp (`calculator_libm`), and against
  the plain reference within 1 bf16 ulp / 1 int8 LSB on ≤ 0.1 % of points, the f32 q8 scale within 4 ulps
  (measured: 1 bf16 point in 16384; 1 scale row of 37 at 2 ulps).
* qk_pv: the cube accumulates q·Kᵀ and rb(p)·K in f32 where the reference rounds an f64 sum once. Bounds per
  point from the reference's own intermediates, with a factor 2: |Δs| ≤ D·u·scale·Σ_d|q_d k_d| (+ rounding
  of s), |Δm| ≤ max |Δs| of its tile, |Δp| ≤ p·(|Δs| + 2|Δm| + 4u), |Δl| ≤ Σ|Δp| + W·u·l, |Δo| ≤
  Σ|Δp||K| + W·u·Σp|K| (u = 2⁻²⁴). When an f32 difference of p straddles a bf16 rounding boundary rb(p)
  moves by one bf16 ulp (≤ 2⁻⁷ relative) in that term of o, so o may exceed its f32 bound by 2⁻⁷·max_l p_l|K_l|
  on ≤ 0.1 % of points.
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest

from tests.lowering.pypto_cases import Case, check_case, run_cases

pytestmark = pytest.mark.pypto

SWA_OPS = ("rope_tables", "qr_rms_norm_quant", "qproj_dequant_rms_nope_rope", "kv_rms_norm_rope",
           "swa_cache_insert_valid_bias", "swa_gather_kv", "qk_pv", "merge_norm")
F32_U = 2.0 ** -24


# ---- comparisons ---------------------------------------------------------------------------------------------
LIBM_OPS = {"qr_rms_norm_quant": "sqrt", "qproj_dequant_rms_nope_rope": "sqrt", "kv_rms_norm_rope": "sqrt",
            "merge_norm": "exp"}


@contextmanager
def calculator_libm():
    """numpy's f32 sqrt and exp replaced by torch's: what pypto's CPU calculator evaluates SQRT and EXP with.
    torch 2.13's f32 sqrt is not correctly rounded (1 ulp off on ~0.6 % of arguments) and its exp differs from
    numpy's by 1 ulp on many arguments; both are deterministic per value (independent of the tensor shape)."""
    import torch

    saved = np.sqrt, np.exp

    def through(orig, fn):
        def call(x, *args, **kw):
            arr = np.asarray(x)
            if arr.dtype == np.float32 and not args and not kw:
                return fn(torch.from_numpy(np.array(arr))).numpy()
            return orig(x, *args, **kw)
        return call

    np.sqrt, np.exp = through(np.sqrt, torch.sqrt), through(np.exp, torch.exp)
    try:
        yield
    finally:
        np.sqrt, np.exp = saved


def _calculator_golden(task, job) -> dict[str, np.ndarray]:
    """The numpy reference on the job's inputs, evaluated with the calculator's sqrt/exp, by output param."""
    from lowering.codegen import inout_input_name
    from lowering.executors import kernel_attrs, reference_of

    args: list = [None] * task.operands
    for a in task.args:
        if a.reads:
            args[a.index] = job.inputs[a.param if a.direction == "in" else inout_input_name(a.param)]
    with calculator_libm():
        out = reference_of(task)(*args, **kernel_attrs(task))
    outs = out if isinstance(out, tuple) else (out,)
    by_operand = {a.index: a.param for a in task.args if a.direction == "inout"}
    by_result = {a.index: a.param for a in task.args if a.direction == "out"}
    golden = {}
    for r, (spec, value) in enumerate(zip(task.results, outs)):
        if not spec.get("token"):
            golden[by_operand[spec["alias"]] if spec.get("alias") is not None else by_result[r]] = np.asarray(value)
    return golden


def ulp_units(got, want) -> np.ndarray:
    """Per-point distance in units of the output dtype (LSBs for integers, ulps for floats)."""
    if got.dtype.kind in "iu":
        return np.abs(got.astype(np.int64) - want.astype(np.int64))
    bits = {2: np.int16, 4: np.int32}[got.dtype.itemsize]
    return np.abs(got.view(bits).astype(np.int64) - want.view(bits).astype(np.int64))


def _check_libm(task, job, res) -> None:
    """Bitwise equal to the reference evaluated with the calculator's sqrt/exp (so every other op, and the
    summation order, is the reference's); vs the plain reference: int8 and bf16 within 1 unit on ≤ 0.1 % of
    points, f32 (the q8 scale: 1/k of an amax moved by one ulp of inv_rms) within 4 ulps."""
    calc = _calculator_golden(task, job)
    for name, want in job.goldens.items():
        got = res.outputs[name]
        assert got.dtype == want.dtype and got.shape == want.shape, name
        exact = calc[name].astype(want.dtype)
        assert np.array_equal(got.view(np.uint8), exact.view(np.uint8)), \
            f"{name}: {(ulp_units(got, exact) > 0).sum()} points differ from the reference under the calculator's " \
            f"{LIBM_OPS[task.op]}"
        u = ulp_units(got, want)
        if got.dtype == np.float32:
            assert u.max(initial=0) <= 4, f"{name}: {u.max()} ulps"
        else:
            assert u.max(initial=0) <= 1 and (u > 0).mean() <= 1e-3, f"{name}: {(u > 0).sum()} points, {u.max()} units"


def _check_qk_pv(job, res, attrs) -> None:
    """Per-point bounds derived from the reference's own intermediates (module docstring), ×2 for safety."""
    q = job.inputs["q"].astype(np.float64)
    keys = job.inputs["kv_rows"].astype(np.float64)
    valid = (job.inputs["bias"] >= 0) & (job.inputs["indices"] >= 0)
    scale, k_tile = float(attrs["scale"]), int(attrs["k_tile"])
    m, l, o = (job.goldens[k].astype(np.float64) for k in ("m", "l", "o"))
    gm, gl, go = (res.outputs[k].astype(np.float64) for k in ("m", "l", "o"))
    d, w = q.shape[-1], keys.shape[1]
    s = np.einsum("thd,tld->thl", q, keys) * scale
    ds = 2 * d * F32_U * np.einsum("thd,tld->thl", np.abs(q), np.abs(keys)) * scale + 2 * F32_U * np.abs(s)
    ds = np.where(valid[:, None, :], ds, 0.0)
    tiles = [slice(a, a + k_tile) for a in range(0, w, k_tile)]
    dm = np.max([ds[..., t].max(-1) for t in tiles], axis=0)            # |Δ m_i| ≤ max |Δs| of the tile
    assert np.all(np.abs(gm - m) <= dm), f"m: {np.max(np.abs(gm - m) - dm)} beyond the bound"
    p = np.zeros_like(s)
    with np.errstate(over="ignore"):                                     # masked tokens: s − (−1e20)
        for t in tiles:                                                  # p relative to the final m
            p[..., t] = np.where(valid[:, None, t], np.exp(s[..., t] - m[..., None]), 0.0)
    dp = p * (ds + 2 * dm[..., None] + 8 * F32_U)                       # exp(s − m) and the merge factors
    dl = dp.sum(-1) + 2 * w * F32_U * l
    assert np.all(np.abs(gl - l) <= dl), f"l: {np.max(np.abs(gl - l) - dl)} beyond the bound"
    ak = np.abs(keys)
    do = np.einsum("thl,tld->thd", dp, ak) + 2 * w * F32_U * np.einsum("thl,tld->thd", p, ak)
    flip = 2.0 ** -7 * np.max(p[..., None] * ak[:, None], axis=2)      # one bf16 ulp of one rb(p_l) term
    diff = np.abs(go - o)
    assert np.all(diff <= do + flip), f"o: {np.max(diff - do - flip)} beyond one bf16(p) flip"
    assert (diff > do).mean() <= 1e-3, f"o: {(diff > do).sum()} points beyond f32 rounding"


def _check(task, job, res) -> None:
    assert res.ok, f"{res.error}\n{res.log[-3000:]}"
    assert not res.clobbered
    assert res.verify and not res.verify_failed, [str(r) for r in res.verify_failed]
    if task.op == "qk_pv":
        _check_qk_pv(job, res, task.attrs)
    elif task.op in LIBM_OPS:
        _check_libm(task, job, res)
    else:
        check_case(Case(""), job, res)   # bitwise vs the reference (no libm call on the path)


def test_calculator_libm_is_torchs():
    """The libm swap is live: inside it numpy's f32 sqrt and exp are torch's, bit for bit, on whole arrays (where
    the two differ depends on the CPU's vector kernels; exp differs on many points on every machine seen), and
    numpy's own come back after it."""
    import torch

    x = np.random.default_rng(0).random(1 << 16, dtype=np.float32) * 100
    y = x / np.float32(10) - np.float32(5)
    saved = np.sqrt, np.exp
    with calculator_libm():
        inside_sqrt, inside_exp = np.sqrt(x), np.exp(y)
    assert (np.sqrt, np.exp) == saved
    assert np.array_equal(inside_sqrt, torch.sqrt(torch.from_numpy(x)).numpy())
    assert np.array_equal(inside_exp, torch.exp(torch.from_numpy(y)).numpy())
    assert not np.array_equal(inside_exp, np.exp(y))


# ---- batch 1: the tiny TP1 decode-swa layer's own tasks ------------------------------------------------------
@pytest.fixture(scope="module")
def layer_batch():
    import runner
    from dspark_ir import layers
    from kernels.pypto_rt import run_jobs
    from lowering import build_task_graph
    from lowering.executors import Memory, run_task
    from lowering.pypto_exec import kernel_job

    g = layers.build("decode-swa", config="tiny", tp=1)
    tg = build_task_graph(g)
    mem = Memory(tg, runner.layer_inputs(g, 0, "default"))
    jobs, meta = [], []
    for t in tg.tasks:
        if t.op in SWA_OPS:
            jobs.append(kernel_job(t, tg, mem, "full", True, ("T",)))
            meta.append((t.name, t))
        if not t.is_dummy:
            run_task(t, [mem])
    results = run_jobs(jobs, 600, workers=2)
    return {name: (task, job, res) for (name, task), job, res in zip(meta, jobs, results)}


LAYER_TASKS = ["qkv.q_rope_prepare", "qkv.qr_rms_norm_quant", "qkv.qproj_dequant_rms_nope_rope",
               "qkv.kv_rms_norm_rope", "swa.swa_cache_insert_valid_bias", "swa.swa_gather_kv", "swa.qk_pv",
               "swa.rope_cs", "swa.merge_norm"]


def test_layer_covers_every_swa_op_kind(layer_batch):
    assert sorted({task.op for task, _, _ in layer_batch.values()}) == sorted(SWA_OPS)
    assert sorted(layer_batch) == sorted(LAYER_TASKS)


@pytest.mark.parametrize("name", LAYER_TASKS)
def test_layer_task_matches_reference(layer_batch, name):
    task, job, res = layer_batch[name]
    _check(task, job, res)


# ---- batch 2: single-op edge cases ---------------------------------------------------------------------------
def _rope_inputs(g, rng):
    t = g.symbols["T"]
    shape = g.params[0].type.concrete_shape(g.env)
    return {"cos": rng.uniform(-1, 1, shape).astype(np.float32), "sin": rng.uniform(-1, 1, shape).astype(np.float32),
            "pos": rng.integers(0, shape[0], t).astype(np.int32)}


def _cache_inputs(g, rng):
    t = g.symbols["T"]
    slots = rng.permutation(64)[:t].astype(np.int32)
    slots[[1, 7, t - 1]] = -1           # padding tokens: skipped
    slots[5] = slots[3]                 # a duplicate: the later token wins
    slots[9] = slots[8] = 63            # the last row, written twice
    return {"kv": rng.standard_normal((t, 64)).astype(np.float32),
            "cache": rng.standard_normal((64, 64)).astype(np.float32),
            "slots": slots, "lens": rng.integers(0, 17, t).astype(np.int32)}


def _gather_inputs(g, rng):
    t = g.symbols["T"]
    idx = rng.integers(0, 100, (t, 16)).astype(np.int32)
    idx[rng.random((t, 16)) < 0.25] = -1   # −1 anywhere, not only in the tail
    idx[2] = -1
    return {"cache": rng.standard_normal((100, 64)).astype(np.float32), "idx": idx}


def _gather_flash_inputs(g, rng):
    t = g.symbols["T"]
    idx = rng.integers(0, 200, (t, 128)).astype(np.int32)
    idx[rng.random((t, 128)) < 0.25] = -1
    idx[1] = -1
    cache = rng.standard_normal((200, 512)).astype(np.float32)
    cache[::7] = -0.0                      # −0 rows read back as −0, a −1 (clamped to row 0) as +0
    return {"cache": cache, "idx": idx}


def _attn_inputs(g, rng):
    t = g.symbols["T"]
    idx = rng.integers(0, 100, (t, 32)).astype(np.int32)
    lens = rng.integers(1, 33, t)
    lens[3] = 0                                       # a token with no valid row: m = −1e20, l = 0, o = 0
    idx[rng.random((t, 32)) < 0.1] = -1
    bias = np.where(np.arange(32)[None, :] < lens[:, None], 0.0, -1e20).astype(np.float32)
    heads = g.params[0].type.concrete_shape(g.env)[1]
    return {"q": rng.standard_normal((t, heads, 64)).astype(np.float32),
            "rows": rng.standard_normal((t, 32, 64)).astype(np.float32), "bias": bias, "idx": idx}


def _merge_inputs(g, rng):
    t = g.symbols["T"]
    m = rng.normal(2, 1, (t, 8)).astype(np.float32)
    l = rng.uniform(0.5, 8, (t, 8)).astype(np.float32)
    o = rng.standard_normal((t, 8, 64)).astype(np.float32)
    m[4], l[4], o[4] = -1e20, 0.0, 0.0                # the fully masked token: exp(sink + 1e20) = inf → 0
    return {"m": m, "l": l, "o": o, "sink": rng.standard_normal(8).astype(np.float32),
            "c": rng.uniform(-1, 1, (t, 16)).astype(np.float32), "s": rng.uniform(-1, 1, (t, 16)).astype(np.float32)}


EDGES = {
    # rope tables: partial block (T = 37 > 32), full-width [P, rd] and half-width [P, rd/2] tables
    "rope_tables_partial": ("rope_tables", Case(
        "graph @k<T = 37>(%cos: bf16[64,16], %sin: bf16[64,16], %pos: i32[T]) {\n"
        "  %c, %s = rope_tables(%cos, %sin, %pos) {rope_dim = 16} : bf16[T,16], bf16[T,16]\n  return %c, %s\n}\n",
        make_inputs=_rope_inputs)),
    "rope_tables_half_width": ("rope_tables", Case(
        "graph @k<T = 12>(%cos: bf16[64,32], %sin: bf16[64,32], %pos: i32[T]) {\n"
        "  %c, %s = rope_tables(%cos, %sin, %pos) {rope_dim = 64} : bf16[T,64], bf16[T,64]\n  return %c, %s\n}\n",
        make_inputs=_rope_inputs)),
    # flash q_lora width 1024 (a fused block: the 8 pairwise 128-blocks side by side), partial block
    "qr_rms_norm_quant_1024": ("qr_rms_norm_quant", Case(
        "graph @k<T = 37>(%qa: f32[T,1024], %g: bf16[1024]) {\n"
        "  %q, %s = qr_rms_norm_quant(%qa, %g) : i8[T,1024], f32[T]\n  return %q, %s\n}\n")),
    # the flash rank's shape per token: 64 heads × 512, rope_dim 64 (the 128-blocks side by side); T = 9: one
    # group of 8 tokens and one tail token
    "qproj_flash_heads": ("qproj_dequant_rms_nope_rope", Case(
        "graph @k<T = 9>(%acc: i32[T,32768], %sa: f32[T], %sw: f32[32768], %c: bf16[T,64], %s: bf16[T,64]) {\n"
        "  %q = qproj_dequant_rms_nope_rope(%acc, %sa, %sw, %c, %s) {heads = 64} : bf16[T,64,512]\n"
        "  return %q\n}\n")),
    # the flash rank's heads on cyclic workers (dequant-workers): T = 17, two groups of 8 tokens whose 16 head chains
    # split into ceil(7 / 2) = 4 forced subgraphs each (4 + 4 + 4 + 4 chains), one tail token
    "qproj_flash_workers": ("qproj_dequant_rms_nope_rope", Case(
        "graph @k<T = 17>(%acc: i32[T,32768], %sa: f32[T], %sw: f32[32768], %c: bf16[T,64], %s: bf16[T,64]) {\n"
        "  %q = qproj_dequant_rms_nope_rope(%acc, %sa, %sw, %c, %s) {heads = 64, workers = 7, blocks = 7}"
        " : bf16[T,64,512]\n  return %q\n}\n")),
    # two 128-blocks per head (the chained body's block tree), T = 10: one group of 8 tokens and two tail tokens
    "qproj_two_blocks": ("qproj_dequant_rms_nope_rope", Case(
        "graph @k<T = 10>(%acc: i32[T,2048], %sa: f32[T], %sw: f32[2048], %c: bf16[T,32], %s: bf16[T,32]) {\n"
        "  %q = qproj_dequant_rms_nope_rope(%acc, %sa, %sw, %c, %s) {heads = 8} : bf16[T,8,256]\n"
        "  return %q\n}\n")),
    # a width numpy splits unevenly (200 → 96 + 104: the generic pairwise recursion)
    "qproj_uneven_width": ("qproj_dequant_rms_nope_rope", Case(
        "graph @k<T = 11>(%acc: i32[T,600], %sa: f32[T], %sw: f32[600], %c: bf16[T,16], %s: bf16[T,16]) {\n"
        "  %q = qproj_dequant_rms_nope_rope(%acc, %sa, %sw, %c, %s) {heads = 3} : bf16[T,3,200]\n"
        "  return %q\n}\n")),
    "kv_rms_norm_rope_512": ("kv_rms_norm_rope", Case(
        "graph @k<T = 37>(%ka: f32[T,512], %g: bf16[512], %c: bf16[T,64], %s: bf16[T,64]) {\n"
        "  %kv = kv_rms_norm_rope(%ka, %g, %c, %s) : bf16[T,512]\n  return %kv\n}\n")),
    "swa_cache_insert_skip_and_duplicates": ("swa_cache_insert_valid_bias", Case(
        "graph @k<T = 20>(%kv: bf16[T,64], %cache: bf16[64,64] inout, %slots: i32[T], %lens: i32[T]) {\n"
        "  %c, %b = swa_cache_insert_valid_bias(%kv, %cache, %slots, %lens) {window = 16} : bf16[64,64], f32[T,16]\n"
        "  return %c, %b\n}\n", make_inputs=_cache_inputs)),
    "swa_gather_kv_holes": ("swa_gather_kv", Case(
        "graph @k<T = 19>(%cache: bf16[100,64], %idx: i32[T,16]) {\n"
        "  %r = swa_gather_kv(%cache, %idx) : bf16[T,16,64]\n  return %r\n}\n", make_inputs=_gather_inputs)),
    # fewer tokens than a gather group (8 here): the one group is partial
    "swa_gather_kv_few_tokens": ("swa_gather_kv", Case(
        "graph @k<T = 3>(%cache: bf16[100,64], %idx: i32[T,16]) {\n"
        "  %r = swa_gather_kv(%cache, %idx) : bf16[T,16,64]\n  return %r\n}\n", make_inputs=_gather_inputs)),
    # the flash row shape (groups of 4 tokens): T = 6, the groups past row 2 moved back to rows 2..5
    "swa_gather_kv_flash_rows": ("swa_gather_kv", Case(
        "graph @k<T = 6>(%cache: bf16[200,512], %idx: i32[T,128]) {\n"
        "  %r = swa_gather_kv(%cache, %idx) : bf16[T,128,512]\n  return %r\n}\n", make_inputs=_gather_flash_inputs)),
    "qk_pv_two_tiles_masked": ("qk_pv", Case(
        "graph @k<T = 10>(%q: bf16[T,4,64], %rows: bf16[T,32,64], %bias: f32[T,32], %idx: i32[T,32]) {\n"
        "  %m, %l, %o = qk_pv(%q, %rows, %bias, %idx) {scale = 0.125, k_tile = 16}"
        " : f32[T,4], f32[T,4], f32[T,4,64]\n  return %m, %l, %o\n}\n", make_inputs=_attn_inputs)),
    # a single-tile window (the flash form): token pairs share one q·Kᵀ task; T = 11: one block of 8, a tail of 3
    "qk_pv_one_tile_pairs": ("qk_pv", Case(
        "graph @k<T = 11>(%q: bf16[T,8,64], %rows: bf16[T,32,64], %bias: f32[T,32], %idx: i32[T,32]) {\n"
        "  %m, %l, %o = qk_pv(%q, %rows, %bias, %idx) {scale = 0.125, k_tile = 32}"
        " : f32[T,8], f32[T,8], f32[T,8,64]\n  return %m, %l, %o\n}\n", make_inputs=_attn_inputs)),
    # 40 tokens: a 32-token block, then the last block moved back to end at T (rows 8..31 written twice, the same)
    "merge_norm_moved_back_block": ("merge_norm", Case(
        "graph @k<T = 40>(%m: f32[T,8], %l: f32[T,8], %o: f32[T,8,64], %sink: f32[8], %c: bf16[T,16],"
        " %s: bf16[T,16]) {\n"
        "  %y = merge_norm(%m, %l, %o, %sink, %c, %s) {o_groups = 2} : bf16[2,T,256]\n  return %y\n}\n",
        make_inputs=_merge_inputs)),
    "merge_norm_masked_token": ("merge_norm", Case(
        "graph @k<T = 11>(%m: f32[T,8], %l: f32[T,8], %o: f32[T,8,64], %sink: f32[8], %c: bf16[T,16],"
        " %s: bf16[T,16]) {\n"
        "  %y = merge_norm(%m, %l, %o, %sink, %c, %s) {o_groups = 2} : bf16[2,T,256]\n  return %y\n}\n",
        make_inputs=_merge_inputs)),
}


@pytest.fixture(scope="module")
def edge_batch():
    return run_cases({name: case for name, (_, case) in EDGES.items()})


@pytest.mark.parametrize("name", sorted(EDGES))
def test_edge_case_matches_reference(edge_batch, name):
    task, job, res = edge_batch[name]
    assert task.op == EDGES[name][0]
    _check(task, job, res)


def test_edge_cases_reach_what_they_claim(edge_batch):
    """Non-vacuity: the cache case really skips −1 and resolves duplicates; the masked rows really are masked."""
    _, job, _ = edge_batch["swa_cache_insert_skip_and_duplicates"]
    slots = job.inputs["slot_mapping"]
    assert (slots < 0).sum() == 3 and len(set(slots[slots >= 0])) < (slots >= 0).sum()
    _, job, _ = edge_batch["swa_gather_kv_flash_rows"]
    idx, rows = job.inputs["indices"], job.goldens["out"].view(np.uint16)
    assert (rows[(idx >= 0) & (idx % 7 == 0)] == 0x8000).all() and (rows[idx < 0] == 0).all()
    _, job, _ = edge_batch["qk_pv_two_tiles_masked"]
    assert job.goldens["m"][3].max() == np.float32(-1e20) and not job.goldens["o"][3].any()
    _, job, _ = edge_batch["qk_pv_one_tile_pairs"]
    assert job.goldens["m"][3].max() == np.float32(-1e20) and (job.inputs["indices"] < 0).any()
    _, job, res = edge_batch["merge_norm_masked_token"]
    assert not job.goldens["out"][:, 4].astype(np.float32).any()

"""pypto 0.2.0 templates of the sparse-attention op kinds (kernels/sparse.py: decode-csa and decode-hca), run
through the harness against the numpy references.

One `run_jobs` batch in full mode (SIM + pass-verify with our CPU-numerics fix) holds:

* **layer**: one task per op kind from the tiny TP1 decode-csa and decode-hca layers (decode-hca after the default
  pipeline for hca_stream_merge_pack), on its actual shapes and data (the layer's seeded inputs, the earlier
  tasks run by the numpy executor);
* **edges**: single-op graphs for what the layer data does not reach: −1 and duplicate cache slots, partial row
  blocks (T not a multiple of the block), a k_tile block straddling the window / top-k lists, live_blocks below
  the block count (the top-k list read only as far as the live blocks reach), fully masked tokens
  and items, several work items with max_rows below the row count, a last request with fewer than seq tokens
  (hca_cmp_qk_pv), pages past the block table, a non-power-of-two block size, and a swap permutation other
  than j ^ 1.

Every full-mode job must also pass pypto's tensor-graph check and the post-pass verification of the 6 default
passes. That every task of the flash TP4 layers compiles to the execute graph is
tests/lowering/test_pypto_flash_compile.py's.

Tolerances (bitwise unless listed):

* csa_qk_pv, hca_raw_attn, hca_cmp_qk_pv (tile partials): the cube accumulates q·K and rb(p)·K in f32 where the
  reference rounds an f64 sum once, so s, m, l, o differ by f32 rounding. Per point and tile: |Δs| ≤ 2(d·u·Σ|q||k|
  + u|s|)·scale (u = 2⁻²⁴), |Δm| ≤ max |Δs| over the tile, |Δl| ≤ Σ p(|Δs| + 2|Δm| + 8u) + 2w·u·l, and |Δo| the
  same through |K|; when an f32 difference of p straddles a bf16 rounding boundary, rb(p) moves by one bf16 ulp in
  one term of o, so o may exceed its f32 bound by 2⁻⁷·max_l p|K_l| on ≤ 0.5 % of points.
* csa_merge_norm, hca_stream_merge, hca_stream_merge_pack: pypto's CPU calculator evaluates exp with torch, which
  differs from numpy's f32 exp by 1 ulp on a few % of arguments. The outputs are bitwise equal to the reference
  evaluated with torch's exp; against the plain reference, bf16 outputs move by ≤ 1 bf16 ulp on ≤ 0.1 % of
  points and the f32 stream heads by ≤ 16 f32 ulps of their (token, head) row's largest magnitude.
"""
from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest

pytestmark = pytest.mark.pypto

SPARSE_OPS = ("kv_cache_writeback", "csa_slots_build_valid_qk_plan", "csa_qk_pv", "csa_merge_norm",
              "hca_raw_transpose", "hca_raw_attn", "hca_cmp_work_gather", "hca_cmp_qk_pv", "hca_stream_merge",
              "hca_stream_pack", "hca_stream_merge_pack")
PARTIALS = ("csa_qk_pv", "hca_raw_attn", "hca_cmp_qk_pv")
LIBM_EXP = ("csa_merge_norm", "hca_stream_merge", "hca_stream_merge_pack")
U = 2.0 ** -24


# ---- comparisons ---------------------------------------------------------------------------------------------
def _units(got, want) -> np.ndarray:
    """Per-point distance in units of the output dtype (LSBs for integers, ulps for floats of one sign)."""
    if got.dtype.kind in "iu":
        return np.abs(got.astype(np.int64) - want.astype(np.int64))
    bits = {2: np.int16, 4: np.int32}[got.dtype.itemsize]
    return np.abs(got.view(bits).astype(np.int64) - want.view(bits).astype(np.int64))


def _bitwise(got, want) -> bool:
    return got.dtype == want.dtype and got.shape == want.shape and \
        np.array_equal(np.ascontiguousarray(got).view(np.uint8), np.ascontiguousarray(want).view(np.uint8))


def _reference_args(task, job) -> list:
    from lowering.codegen import inout_input_name

    args: list = [None] * task.operands
    for a in task.args:
        if a.reads:
            args[a.index] = job.inputs[a.param if a.direction == "in" else inout_input_name(a.param)]
    return args


@contextmanager
def _torch_exp():
    """numpy's f32 exp replaced by torch's (what pypto's CPU calculator evaluates EXP with)."""
    import torch

    saved = np.exp

    def exp(x, *args, **kw):
        arr = np.asarray(x)
        if arr.dtype == np.float32 and not args and not kw:
            return torch.exp(torch.from_numpy(np.array(arr))).numpy()
        return saved(x, *args, **kw)

    np.exp = exp
    try:
        yield
    finally:
        np.exp = saved


def _golden_under_torch_exp(task, job) -> dict[str, np.ndarray]:
    from lowering.executors import kernel_attrs, reference_of

    with _torch_exp():
        out = reference_of(task)(*_reference_args(task, job), **kernel_attrs(task))
    outs = out if isinstance(out, tuple) else (out,)
    by_result = {a.index: a.param for a in task.args if a.direction == "out"}
    by_operand = {a.index: a.param for a in task.args if a.direction == "inout"}
    return {(by_operand[r["alias"]] if r.get("alias") is not None else by_result[i]): np.asarray(v)
            for i, (r, v) in enumerate(zip(task.results, outs)) if not r.get("token")}


def _check_libm(task, job, res) -> None:
    calc = _golden_under_torch_exp(task, job)
    for name, want in job.goldens.items():
        got = res.outputs[name]
        assert _bitwise(got, calc[name].astype(want.dtype)), \
            f"{name}: {(_units(got, calc[name].astype(want.dtype)) > 0).sum()} points differ from the reference " \
            "under torch's exp"
        if got.dtype == np.float32:
            scale = np.max(np.abs(want.astype(np.float64)), axis=-1, keepdims=True)
            assert np.all(np.abs(got.astype(np.float64) - want) <= 16 * U * scale), f"{name}: beyond 16 ulps"
        else:
            u = _units(got, want)
            assert u.max(initial=0) <= 1 and (u > 0).mean() <= 1e-3, f"{name}: {(u > 0).sum()} points, {u.max()} ulps"


def _tile_problem(task, inputs):
    """(q, keys [T, L, HD], valid [T, L], tile width) of a tile-partial task: the reference's own key rows."""
    from dspark_ir.semantics import sparse as S

    a = task.attrs
    q = inputs["q"].astype(np.float64)
    if task.op == "csa_qk_pv":
        keys = np.concatenate([S._gather(inputs["kv_cache"], inputs["swa_indices"]),
                               S._gather(inputs["cmp_kv"], inputs["cmp_sparse_indices"])], axis=1)
        index = np.concatenate([inputs["swa_indices"], inputs["cmp_sparse_indices"]], axis=1)
        valid = (inputs["sparse_bias"] >= 0) & (index >= 0)
        width = int(a["k_tile"])
    elif task.op == "hca_raw_attn":
        keys, valid, width = inputs["rows"], inputs["indices"] >= 0, inputs["rows"].shape[1]
    else:
        n = S.hca_visible(inputs["positions"], inputs["kv_seq_len"], ratio=a["ratio"], seq=a["seq"],
                          max_rows=a["max_rows"])
        req = np.arange(len(n)) // a["seq"]
        keys = inputs["cmp_rows"][req]
        valid = (np.arange(keys.shape[1])[None, :] < n[:, None]) & (inputs["cmp_phys"][req] >= 0)
        width = int(a["work_rows"])
    return q, np.asarray(keys).astype(np.float32).astype(np.float64), np.asarray(valid), width


def _check_partials(task, job, res) -> None:
    """The per-point f32 bounds of the module docstring, tile by tile (×2 safety)."""
    q, keys, valid, width = _tile_problem(task, job.inputs)
    scale = float(task.attrs["scale"])
    names = ["m", "l", "heads" if task.op == "hca_raw_attn" else "o"]
    want = [job.goldens[n].astype(np.float64) for n in names]
    got = [res.outputs[n].astype(np.float64) for n in names]
    if want[0].ndim == 2:                                      # the raw stream: one tile
        want = [w[:, None] for w in want]
        got = [g[:, None] for g in got]
    d = q.shape[-1]
    beyond = points = 0
    for j in range(want[0].shape[1]):      # the blocks computed (csa_qk_pv's live_blocks may leave later ones out)
        cols = slice(j * width, (j + 1) * width)
        k, ok = keys[:, cols], valid[:, None, cols]
        s = np.einsum("thd,tld->thl", q, k) * scale
        ds = np.where(ok, 2 * (d * U * np.einsum("thd,tld->thl", np.abs(q), np.abs(k)) * scale + U * np.abs(s)), 0.0)
        m, l, o = (w[:, j] for w in want)
        gm, gl, go = (g[:, j] for g in got)
        dm = ds.max(-1)
        assert np.all(np.abs(gm - m) <= dm), f"m (tile {j}): {np.max(np.abs(gm - m) - dm)} beyond the bound"
        p = np.where(ok, np.exp(np.minimum(s - m[..., None], 0.0)), 0.0)
        dp = p * (ds + 2 * dm[..., None] + 8 * U)
        dl = dp.sum(-1) + 2 * width * U * l
        assert np.all(np.abs(gl - l) <= dl), f"l (tile {j}): {np.max(np.abs(gl - l) - dl)} beyond the bound"
        ak = np.abs(k)
        do = np.einsum("thl,tld->thd", dp, ak) + 2 * width * U * np.einsum("thl,tld->thd", p, ak)
        flip = 2.0 ** -7 * np.max(p[..., None] * ak[:, None], axis=2)
        diff = np.abs(go - o)
        assert np.all(diff <= do + flip), f"o (tile {j}): {np.max(diff - do - flip)} beyond one bf16(p) flip"
        beyond += int((diff > do).sum())
        points += diff.size
    assert beyond <= 5e-3 * points, f"o: {beyond} of {points} points beyond f32 rounding"


def _check(task, job, res) -> None:
    assert res.ok, f"{res.error}\n{res.log[-3000:]}"
    assert not res.clobbered
    assert res.verify and not res.verify_failed, [str(r) for r in res.verify_failed]
    if task.op in PARTIALS:
        _check_partials(task, job, res)
    elif task.op in LIBM_EXP:
        _check_libm(task, job, res)
    else:
        for name, want in job.goldens.items():
            got = res.outputs[name]
            assert _bitwise(got, want), f"{name}: {(_units(got, want) > 0).sum()} points differ"


# ---- the layer tasks -------------------------------------------------------------------------------------------
LAYER_TASKS = {  # task name → (layer, after the default pipeline)
    "csa.csa_cache_writeback": ("decode-csa", False),
    "csa.csa_slots_build_valid_qk_plan": ("decode-csa", False),
    "csa.qk_pv": ("decode-csa", False),
    "csa.merge_norm": ("decode-csa", False),
    "hca.hca_raw_transpose": ("decode-hca", False),
    "hca.hca_raw_attn": ("decode-hca", False),
    "hca.hca_cmp_work_gather": ("decode-hca", False),
    "hca.hca_cmp_qk_pv": ("decode-hca", False),
    "hca.hca_stream_merge": ("decode-hca", False),
    "hca.hca_stream_pack": ("decode-hca", False),
    "hca.hca_stream_merge_pack": ("decode-hca", True),
}


def _layer_jobs() -> dict:
    import passes
    import runner
    from dspark_ir import layers
    from lowering import build_task_graph
    from lowering.executors import Memory, run_task
    from lowering.pypto_exec import kernel_job

    out = {}
    for layer, piped in sorted(set(LAYER_TASKS.values())):
        g = layers.build(layer, config="tiny", tp=1)
        if piped:
            g = passes.run_pipeline(g).graph
        tg = build_task_graph(g)
        mem = Memory(tg, runner.layer_inputs(g, 0))
        for t in tg.tasks:
            if LAYER_TASKS.get(t.name) == (layer, piped):
                out[t.name] = (t, kernel_job(t, tg, mem, "full", True, ("T",)))
            if not t.is_dummy:
                run_task(t, [mem])
    return out


# ---- the edge cases ----------------------------------------------------------------------------------------------
def _bf16(x) -> np.ndarray:
    from dspark_ir.semantics.dtypes import BF16

    return np.asarray(x, np.float32).astype(BF16).astype(np.float32)


def _writeback_inputs(g, rng):
    t = g.symbols["T"]
    slots = rng.permutation(64)[:t].astype(np.int32)
    slots[[1, 7, t - 1]] = -1           # padding tokens: skipped
    slots[5] = slots[3]                 # a duplicate: the later token wins
    slots[9] = slots[8] = 63            # the last row, written twice (and −1 must not reach it)
    return {"kv": rng.standard_normal((t, 64)), "cache": rng.standard_normal((64, 64)), "slots": slots}


def _csa_qk_pv_inputs(g, rng):
    t = g.symbols["T"]
    swa = rng.integers(0, 100, (t, 8)).astype(np.int32)
    ci = rng.integers(0, 80, (t, 24)).astype(np.int32)
    swa[rng.random((t, 8)) < 0.2] = -1
    ci[rng.random((t, 24)) < 0.3] = -1
    bias = np.where(rng.random((t, 32)) < 0.1, -1e20, 0.0).astype(np.float32)   # masked despite a valid index
    swa[3], ci[3] = -1, -1                                                       # a token with no valid row
    return {"q": rng.standard_normal((t, 4, 64)), "kv": rng.standard_normal((100, 64)), "swa": swa,
            "cmp": rng.standard_normal((80, 64)), "ci": ci, "bias": bias,
            "order": np.arange(2 * t, dtype=np.int32)}


def _csa_qk_pv_live_inputs(g, rng):
    """Three blocks of 16 over 8 window + 40 top-k rows; the top-k list valid only in its first 20 columns (the
    context bound behind live_blocks = 2: block 2 could hold no valid row)."""
    t = g.symbols["T"]
    swa = rng.integers(0, 100, (t, 8)).astype(np.int32)
    ci = rng.integers(0, 80, (t, 40)).astype(np.int32)
    ci[rng.random((t, 40)) < 0.2] = -1
    ci[:, 20:] = -1
    return {"q": rng.standard_normal((t, 4, 64)), "kv": rng.standard_normal((100, 64)), "swa": swa,
            "cmp": rng.standard_normal((80, 64)), "ci": ci, "bias": np.zeros((t, 48), np.float32),
            "order": np.arange(3 * t, dtype=np.int32)}


def _raw_attn_inputs(g, rng):
    t = g.symbols["T"]
    idx = rng.integers(0, 500, (t, 16)).astype(np.int32)
    idx[rng.random((t, 16)) < 0.25] = -1
    idx[3] = -1
    rows = np.where(idx[..., None] >= 0, _bf16(rng.standard_normal((t, 16, 64))), 0.0)
    return {"q": rng.standard_normal((t, 4, 64)), "rows": rows, "rt": np.swapaxes(rows, 1, 2).copy(), "idx": idx}


def _transpose_inputs(g, rng):
    rows = rng.standard_normal((g.symbols["T"], 16, 64)) * 3
    rows[:, ::5] = -0.0                                 # negative zeros keep their sign
    return {"r": rows}


def _cmp_qk_pv_inputs(g, rng):
    phys = rng.integers(0, 200, (3, 32)).astype(np.int32)
    phys[0, 8:16] = -1                                  # an unmapped page inside the visible rows
    return {"q": rng.standard_normal((6, 4, 64)), "rows": rng.standard_normal((3, 32, 64)), "phys": phys,
            # request 0: n = min(32, 33, max_rows 24); request 1: n = 10 (item 1 neutral); request 2: n = 0, 1
            "pos": np.array([130, 131, 40, 41, 2, 3], np.int32), "kvl": np.array([132, 41, 4], np.int32)}


def _work_gather_inputs(g, rng):
    return {"cmp": rng.standard_normal((40, 64)),
            "tab": np.array([[3, -1, 7], [0, 9, -1], [-1, -1, 2]], np.int32)}


def _plan_inputs(g, rng):
    t = g.symbols["T"]
    topk = rng.integers(-1, 20, (t, 12)).astype(np.int32)   # pages up to 6 of a 4-page table (block_size 3)
    pos = np.array([30, 31, 5, 6, 70, 71], np.int32)
    swa = rng.integers(0, 300, (t, 8)).astype(np.int32)
    swa[rng.random((t, 8)) < 0.3] = -1
    swa[2], topk[2] = -1, -1                                 # a token whose blocks are both empty
    return {"topk": topk, "pos": pos, "tab": np.array([[5, -1, 2, 8], [1, 4, -1, -1], [7, 0, 3, 6]], np.int32),
            "swa": swa}


def _stream_inputs(g, rng):
    t = g.symbols["T"]
    m, l = rng.normal(1, 1, (t, 4)), rng.uniform(0.5, 8, (t, 4))
    h = rng.standard_normal((t, 4, 64))
    cm, cl = rng.normal(1, 1, (t, 2, 4)), rng.uniform(0.5, 8, (t, 2, 4))
    co = rng.standard_normal((t, 2, 4, 64))
    m[4], l[4], h[4], cm[4], cl[4], co[4] = -1e20, 0.0, 0.0, -1e20, 0.0, 0.0    # nothing visible: out = 0
    cm[6, 1], cl[6, 1], co[6, 1] = -1e20, 0.0, 0.0                               # a neutral work item
    return {"m": m, "l": l, "h": h, "cm": cm, "cl": cl, "co": co, "sink": rng.standard_normal(4),
            "c": rng.uniform(-1, 1, (t, 16)), "s": rng.uniform(-1, 1, (t, 16)),
            "sw": rng.permutation(16).astype(np.int32)}          # any lane permutation, not only j ^ 1


def _merge_norm_inputs(g, rng):
    t = g.symbols["T"]
    m, l = rng.normal(1, 1, (t, 3, 4)), rng.uniform(0.5, 8, (t, 3, 4))
    o = rng.standard_normal((t, 3, 4, 64))
    m[4], l[4], o[4] = -1e20, 0.0, 0.0
    m[7, 0], l[7, 0], o[7, 0] = -1e20, 0.0, 0.0                  # the first block empty
    return {"m": m, "l": l, "o": o, "sink": rng.standard_normal(4), "c": rng.uniform(-1, 1, (t, 16)),
            "s": rng.uniform(-1, 1, (t, 16))}


EDGES = {
    "writeback_skip_and_duplicates": ("kv_cache_writeback", _writeback_inputs,
        "graph @k<T = 20>(%kv: bf16[T,64], %cache: bf16[64,64] inout, %slots: i32[T]) {\n"
        "  %c = kv_cache_writeback(%kv, %cache, %slots) : bf16[64,64]\n  return %c\n}\n"),
    "csa_qk_pv_straddle_partial": ("csa_qk_pv", _csa_qk_pv_inputs,
        "graph @k<T = 10>(%q: bf16[T,4,64], %kv: bf16[100,64], %swa: i32[T,8], %cmp: bf16[80,64], %ci: i32[T,24],"
        " %bias: f32[T,32], %order: i32[T*2]) {\n"
        "  %m, %l, %o = csa_qk_pv(%q, %kv, %swa, %cmp, %ci, %bias, %order) {scale = 0.125, k_tile = 16}"
        " : f32[T,2,4], f32[T,2,4], f32[T,2,4,64]\n  return %m, %l, %o\n}\n"),
    "csa_qk_pv_live_blocks": ("csa_qk_pv", _csa_qk_pv_live_inputs,
        "graph @k<T = 8>(%q: bf16[T,4,64], %kv: bf16[100,64], %swa: i32[T,8], %cmp: bf16[80,64], %ci: i32[T,40],"
        " %bias: f32[T,48], %order: i32[T*3]) {\n"
        "  %m, %l, %o = csa_qk_pv(%q, %kv, %swa, %cmp, %ci, %bias, %order) {scale = 0.125, k_tile = 16,"
        " live_blocks = 2} : f32[T,2,4], f32[T,2,4], f32[T,2,4,64]\n  return %m, %l, %o\n}\n"),
    "raw_attn_partial_masked": ("hca_raw_attn", _raw_attn_inputs,
        "graph @k<T = 10>(%q: bf16[T,4,64], %rows: bf16[T,16,64], %rt: bf16[T,64,16], %idx: i32[T,16]) {\n"
        "  %m, %l, %h = hca_raw_attn(%q, %rows, %rt, %idx) {scale = 0.125} : f32[T,4], f32[T,4], f32[T,4,64]\n"
        "  return %m, %l, %h\n}\n"),
    "cmp_qk_pv_two_items_max_rows": ("hca_cmp_qk_pv", _cmp_qk_pv_inputs,
        "graph @k<T = 6>(%q: bf16[T,4,64], %rows: bf16[3,32,64], %phys: i32[3,32], %pos: i32[T], %kvl: i32[3]) {\n"
        "  %m, %l, %o = hca_cmp_qk_pv(%q, %rows, %phys, %pos, %kvl) {scale = 0.125, ratio = 4, seq = 2,"
        " work_rows = 16, max_rows = 24} : f32[T,2,4], f32[T,2,4], f32[T,2,4,64]\n  return %m, %l, %o\n}\n"),
    "cmp_qk_pv_last_request_partial": ("hca_cmp_qk_pv", _cmp_qk_pv_inputs,
        "graph @k<T = 6>(%q: bf16[T,4,64], %rows: bf16[3,32,64], %phys: i32[3,32], %pos: i32[T], %kvl: i32[3]) {\n"
        "  %m, %l, %o = hca_cmp_qk_pv(%q, %rows, %phys, %pos, %kvl) {scale = 0.125, ratio = 4, seq = 4,"
        " work_rows = 16, max_rows = 24} : f32[T,2,4], f32[T,2,4], f32[T,2,4,64]\n  return %m, %l, %o\n}\n"),
    "work_gather_past_table": ("hca_cmp_work_gather", _work_gather_inputs,
        "graph @k(%cmp: bf16[40,64], %tab: i32[3,3]) {\n"
        "  %r, %p = hca_cmp_work_gather(%cmp, %tab) {block_size = 4, work_rows = 8, works = 2}"
        " : bf16[3,16,64], i32[3,16]\n  return %r, %p\n}\n"),
    "plan_block_size_3": ("csa_slots_build_valid_qk_plan", _plan_inputs,
        "graph @k<T = 6>(%topk: i32[T,12], %pos: i32[T], %tab: i32[3,4], %swa: i32[T,8]) {\n"
        "  %ci, %vm, %b, %o = csa_slots_build_valid_qk_plan(%topk, %pos, %tab, %swa) {ratio = 4, seq = 2,"
        " block_size = 3, idx_topk = 8, k_tile = 8} : i32[T,8], i32[T,2], f32[T,16], i32[T*2]\n"
        "  return %ci, %vm, %b, %o\n}\n"),
    "stream_merge_pack_partial_any_swap": ("hca_stream_merge_pack", _stream_inputs,
        "graph @k<T = 10>(%m: f32[T,4], %l: f32[T,4], %h: f32[T,4,64], %cm: f32[T,2,4], %cl: f32[T,2,4],"
        " %co: f32[T,2,4,64], %sink: f32[4], %c: bf16[T,16], %s: bf16[T,16], %sw: i32[16]) {\n"
        "  %y = hca_stream_merge_pack(%m, %l, %h, %cm, %cl, %co, %sink, %c, %s, %sw) {o_groups = 2}"
        " : bf16[2,T,128]\n  return %y\n}\n"),
    "merge_norm_partial_masked": ("csa_merge_norm", _merge_norm_inputs,
        "graph @k<T = 10>(%m: f32[T,3,4], %l: f32[T,3,4], %o: f32[T,3,4,64], %sink: f32[4], %c: bf16[T,16],"
        " %s: bf16[T,16]) {\n"
        "  %y = csa_merge_norm(%m, %l, %o, %sink, %c, %s) {o_groups = 2} : bf16[2,T,128]\n  return %y\n}\n"),
    "raw_transpose_partial": ("hca_raw_transpose", _transpose_inputs,
        "graph @k<T = 10>(%r: bf16[T,16,64]) {\n  %t = hca_raw_transpose(%r) : bf16[T,64,16]\n  return %t\n}\n"),
}


def _edge_jobs() -> dict:
    from dspark_ir import parse_graph, verify
    from lowering import build_task_graph
    from lowering.executors import Memory, run_task
    from lowering.pypto_exec import kernel_job
    from tests.lowering.pypto_cases import Case, case_inputs

    out = {}
    for name, (op, make, text) in EDGES.items():
        g = parse_graph(text, f"<{name}>")
        verify(g)
        tg = build_task_graph(g)
        mem = Memory(tg, case_inputs(g, Case(text, make_inputs=make)))
        for t in tg.kernels[:-1]:
            run_task(t, [mem])
        task = tg.kernels[-1]
        assert task.op == op
        out[name] = (task, kernel_job(task, tg, mem, "full", True, ("T",)))
    return out


# ---- the batch ---------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def batch():
    from kernels.pypto_rt import run_jobs

    jobs = {**_layer_jobs(), **_edge_jobs()}
    results = run_jobs([job for _, job in jobs.values()], 600, workers=2)
    return {name: (task, job, res) for (name, (task, job)), res in zip(jobs.items(), results)}


def test_layer_covers_every_sparse_op_kind(batch):
    layer = [task.op for name, (task, _, _) in batch.items() if name in LAYER_TASKS]
    assert sorted(layer) == sorted(SPARSE_OPS) and len(layer) == len(LAYER_TASKS)


@pytest.mark.parametrize("name", sorted(LAYER_TASKS) + sorted(EDGES))
def test_task_matches_reference(batch, name):
    task, job, res = batch[name]
    _check(task, job, res)


def test_edge_cases_reach_what_they_claim(batch):
    """Non-vacuity: the special cases really are in the data the kernels saw."""
    _, job, _ = batch["writeback_skip_and_duplicates"]
    slots = job.inputs["slot_mapping"]
    assert (slots < 0).sum() == 3 and len(set(slots[slots >= 0])) < (slots >= 0).sum()
    task, job, _ = batch["csa_qk_pv_live_blocks"]
    ci = job.inputs["cmp_sparse_indices"]
    assert task.attrs["live_blocks"] == 2 and job.goldens["m"].shape[1] == 2
    assert (ci[:, 8:20] >= 0).any() and (ci[:, 24:] < 0).all()    # block 1 straddles, block 2 could hold nothing
    _, job, _ = batch["csa_qk_pv_straddle_partial"]
    assert job.goldens["m"][3].max() == np.float32(-1e20) and not job.goldens["o"][3].any()
    _, job, _ = batch["cmp_qk_pv_two_items_max_rows"]
    assert job.goldens["m"][4].max() == np.float32(-1e20)        # request 2's first token sees no row
    assert job.goldens["m"][2:4, 1].max() == np.float32(-1e20)   # request 1's second item is neutral
    task, job, _ = batch["cmp_qk_pv_last_request_partial"]
    assert len(job.inputs["positions"]) % task.attrs["seq"]      # the last request has fewer than seq tokens
    _, job, _ = batch["work_gather_past_table"]
    assert (job.goldens["phys"][:, 12:] == -1).all() and (job.goldens["phys"][:, :12] >= 0).any()
    _, job, _ = batch["plan_block_size_3"]
    vm = job.goldens["valid_block_mask"]
    assert not vm[2].any() and vm.any() and (job.goldens["cmp_sparse_indices"] >= 0).any()
    assert (job.inputs["topk"] >= 12).any()                      # pages past the 4-page table (block_size 3)
    for name in ("stream_merge_pack_partial_any_swap", "merge_norm_partial_masked"):
        _, job, _ = batch[name]
        assert not job.goldens["out"][:, 4].astype(np.float32).any()
    _, job, _ = batch["stream_merge_pack_partial_any_swap"]
    assert (job.inputs["swap"] != np.arange(16) ^ 1).any()
    _, job, _ = batch["raw_transpose_partial"]
    rows = job.inputs["rows"].astype(np.float32)
    assert (np.signbit(rows) & (rows == 0)).any()
    for name in ("csa.qk_pv", "hca.hca_cmp_qk_pv", "hca.hca_raw_attn"):  # the layer's attention has masked rows
        task, job, _ = batch[name]
        q, keys, valid, width = _tile_problem(task, job.inputs)
        assert 0 < valid.sum() < valid.size

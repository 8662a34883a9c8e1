"""The pypto 0.2.0 templates of the raw-kv-gather-per-request pass's ops (kernels/sparse.py): `hca_request_kv_gather`
(row-run and `contiguous` forms: the latter copies a request's rows as one cache run when its index scalars say
they are one, else takes the row-run path) and `hca_raw_attn_request`, run in pypto on CPU (full mode: SIM +
pass-verify) against the numpy reference.

Cases (head_dim 64): the layer's index contract (each token's window oldest first with a −1 tail, a request's tokens
at consecutive positions, rows through a paged table) with a request whose window starts before position 0, one at
the window boundary, full windows across page edges, full windows in page order (one cache run each); S = 1; and
free-form indices with −1 holes and a token that sees nothing (the references define those too). Tolerances: the
gather is data movement, BITWISE; the attention's cube sums q·K in f32 where the reference rounds an f64 sum once,
so m, l, heads within 2⁻¹⁰ of the row's largest magnitude (a wrong key, mask or window offset fails by orders of
magnitude), and exact where the reference is exact (the −1e20 max and the zero heads of a token that sees no row).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from dspark_ir.semantics.sparse import hca_request_kv_gather

pytestmark = pytest.mark.pypto

HEAD_DIM, HEADS, CACHE_ROWS, PAGE = 64, 8, 96, 8


def _contract_indices(starts: list[int], seq: int, width: int, rng, in_order: int = 0) -> np.ndarray:
    """i32 [B·S, W]: token k of request b at position starts[b] + k sees positions max(0, p − W + 1) … p, oldest
    first, −1 tail; position → cache row through a random page table (the identity for the first `in_order`
    requests: their full windows are one cache run)."""
    pages = rng.permutation(CACHE_ROWS // PAGE)
    rows = []
    for b, p0 in enumerate(starts):
        table = np.arange(len(pages)) if b < in_order else np.roll(pages, 3 * b)
        for k in range(seq):
            p = p0 + k
            pos = np.arange(max(0, p - width + 1), p + 1)
            slot = table[pos // PAGE] * PAGE + pos % PAGE
            rows.append(np.concatenate([slot, np.full(width - len(pos), -1)]))
    return np.asarray(rows, dtype=np.int32)


def _free_indices(tokens: int, width: int, rng) -> np.ndarray:
    idx = rng.integers(0, CACHE_ROWS, (tokens, width)).astype(np.int32)
    idx[rng.random((tokens, width)) < 0.3] = -1
    idx[1] = -1                                                    # a token that sees no row
    return idx


# name → (S, W, index maker)
CASES = {
    "contract_s4": (4, 16, lambda rng: _contract_indices([0, 13, 40, 5], 4, 16, rng)),   # before 0, boundary, full
    "contract_s1": (1, 16, lambda rng: _contract_indices([0, 3, 30], 1, 16, rng)),
    # runs (full windows in page order), a window before 0 in page order (no run), a full window across pages
    "contract_runs_s4": (4, 16, lambda rng: _contract_indices([40, 0, 17, 44], 4, 16, rng, in_order=3)),
    "free_s2": (2, 16, lambda rng: _free_indices(6, 16, rng)),
}
FORMS = {"rows": "false", "contiguous": "true"}


def _bf16(x):
    return x.astype(ml_dtypes.bfloat16).astype(np.float32)


def _graphs(seq: int, width: int, tokens: int) -> dict[str, str]:
    n = width + seq - 1
    out = {}
    for form, flag in FORMS.items():
        out[f"gather_{form}"] = (
            f"graph @k<T = {tokens}>(%cache: bf16[{CACHE_ROWS},{HEAD_DIM}], %idx: i32[T,{width}]) {{\n"
            f"  %rows = hca_request_kv_gather(%cache, %idx) {{seq = {seq}, contiguous = {flag}}} "
            f": bf16[T//{seq},{n},{HEAD_DIM}]\n  return %rows\n}}\n")
    out["attn"] = (
        f"graph @k<T = {tokens}>(%q: bf16[T,{HEADS},{HEAD_DIM}], %rows: bf16[T//{seq},{n},{HEAD_DIM}], "
        f"%idx: i32[T,{width}]) {{\n"
        f"  %m, %l, %h = hca_raw_attn_request(%q, %rows, %idx) {{scale = 0.125, seq = {seq}}} "
        f": f32[T,{HEADS}], f32[T,{HEADS}], f32[T,{HEADS},{HEAD_DIM}]\n  return %m, %l, %h\n}}\n")
    return out


def _job(text: str, inputs: dict):
    from dspark_ir import parse_graph, verify
    from lowering import build_task_graph
    from lowering.executors import Memory
    from lowering.pypto_exec import kernel_job

    g = parse_graph(text, "<hca_request>")
    verify(g)
    tg = build_task_graph(g)
    task, = tg.kernels
    return kernel_job(task, tg, Memory(tg, {p.name: inputs[p.name] for p in g.params}), "full", True, ("T",))


@pytest.fixture(scope="module")
def batch():
    from kernels.pypto_rt import run_jobs

    jobs = {}
    for i, (case, (seq, width, make)) in enumerate(CASES.items()):
        rng = np.random.default_rng(i)
        idx = make(rng)
        cache = _bf16(rng.standard_normal((CACHE_ROWS, HEAD_DIM)))
        inputs = {"cache": cache, "idx": idx, "q": _bf16(rng.standard_normal((len(idx), HEADS, HEAD_DIM))),
                  "rows": hca_request_kv_gather(cache, idx, seq=seq)}
        for kind, text in _graphs(seq, width, len(idx)).items():
            jobs[(case, kind)] = _job(text, inputs)
    results = run_jobs(list(jobs.values()), 900, workers=2)
    return {key: (job, res) for (key, job), res in zip(jobs.items(), results)}


def _is_run(idx: np.ndarray, seq: int) -> list[bool]:
    """Per request: its row list is one cache run (the contiguous kernel's one-copy branch)."""
    from dspark_ir.semantics.sparse import request_window_rows

    ridx = request_window_rows(idx, seq)
    return [bool(r[0] >= 0 and np.array_equal(r, r[0] + np.arange(len(r)))) for r in ridx]


def test_the_run_case_exercises_both_branches():
    seq, width, make = CASES["contract_runs_s4"]
    assert _is_run(make(np.random.default_rng(list(CASES).index("contract_runs_s4"))), seq) == [True, False, True,
                                                                                                  False]


def _ok(res):
    assert res.ok, f"{res.error}\n{res.log[-3000:]}"
    assert res.verify and not res.verify_failed, [str(r) for r in res.verify_failed]


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("case", sorted(CASES))
def test_request_gather_is_the_reference_bitwise(batch, case, form):
    job, res = batch[(case, f"gather_{form}")]
    _ok(res)
    want = job.goldens["rows"]
    got = res.outputs["rows"]
    assert got.shape == want.shape and np.array_equal(got, want)


@pytest.mark.parametrize("case", sorted(CASES))
def test_request_attention_matches_the_reference(batch, case):
    job, res = batch[(case, "attn")]
    _ok(res)
    for name, want in job.goldens.items():
        got = res.outputs[name].astype(np.float64)
        want = want.astype(np.float64)
        scale = np.max(np.abs(want), axis=-1, keepdims=True) + 1e-30
        assert np.all(np.abs(got - want) <= 2.0 ** -10 * scale), name
    if case == "free_s2":
        assert job.goldens["m"][1].max() == np.float32(-1e20) and not job.goldens["heads"][1].any()
        assert np.array_equal(res.outputs["m"][1], job.goldens["m"][1]) and not res.outputs["heads"][1].any()

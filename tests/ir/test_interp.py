"""The reference interpreter: single rank, lockstep ranks with collectives, in-place buffers, errors."""
from __future__ import annotations

import numpy as np
import pytest

from dspark_ir import parse_graph, verify
from dspark_ir.interp import InterpError, rank_count, run
from dspark_ir.semantics.dtypes import BF16

SIMPLE = """graph @g<T = 4>(%x: bf16[T,8], %w: bf16[8], %wm: bf16[8,6]) attributes {layer = "t"} {
  %a.n = rmsnorm(%x, %w) : bf16[T,8]
  %a.seed = zeros() {shape = [T, 6]} : f32[T,6]
  %a.mm = matmul(%a.n, %wm, %a.seed) {accumulate = atomic, k_split = 2} : f32[T,6]
  return %a.mm
}
"""


def _inputs(seed=0, t=4):
    rng = np.random.default_rng(seed)
    return {"x": rng.standard_normal((t, 8)).astype(BF16), "w": rng.standard_normal(8).astype(BF16),
            "wm": rng.standard_normal((8, 6)).astype(BF16)}


def test_single_rank_run_matches_numpy():
    g = parse_graph(SIMPLE)
    verify(g)
    inputs = _inputs()
    out = run(g, inputs)
    assert list(out) == ["a.mm"]
    x = inputs["x"].astype(np.float32)
    n = (x / np.sqrt(np.mean(x * x, -1, keepdims=True) + np.float32(1e-6)) * inputs["w"].astype(np.float32))
    n = n.astype(BF16).astype(np.float32)
    w = inputs["wm"].astype(np.float32)
    want = (np.zeros((4, 6), np.float32) + n[:, :4] @ w[:4]) + n[:, 4:] @ w[4:]  # ascending k splits
    np.testing.assert_array_equal(out["a.mm"], want)


def test_keep_returns_every_value_and_order_is_respected():
    g = parse_graph(SIMPLE)
    env = run(g, _inputs(), keep=True)
    assert {"x", "w", "wm", "a.n", "a.seed", "a.mm"} <= set(env)
    order = g.topo_order()
    assert run(g, _inputs(), order=order)["a.mm"].tobytes() == env["a.mm"].tobytes()


def test_missing_input_and_bad_shape():
    g = parse_graph(SIMPLE)
    inputs = _inputs()
    del inputs["w"]
    with pytest.raises(InterpError, match=r"missing input %w"):
        run(g, inputs)
    with pytest.raises(InterpError, match=r"input %x has shape \(5, 8\), declared bf16\[T,8\]"):
        run(g, _inputs(t=5))


A2A = """graph @g<T = 2>(%p: bf16[4,T,3]) attributes {ranks = 2, tp = 2} {
  %o.a2a = o_group_a2a(%p) {tp = 2} : bf16[2,2*T,3]
  return %o.a2a
}
"""


def test_ranks_run_in_lockstep_and_collectives_see_every_rank():
    g = parse_graph(A2A)
    verify(g)
    assert rank_count(g) == 2
    per_rank = [{"p": np.full((4, 2, 3), r * 10 + np.arange(4)[:, None, None], np.float32)} for r in range(2)]
    out = run(g, per_rank)
    assert isinstance(out, list) and len(out) == 2
    for r, res in enumerate(out):
        got = res["o.a2a"].astype(np.float32)
        # rank r holds groups 2r, 2r+1; rows src·T + t
        assert got.shape == (2, 4, 3)
        for lg in range(2):
            assert np.all(got[lg, :2] == 0 * 10 + 2 * r + lg) and np.all(got[lg, 2:] == 10 + 2 * r + lg)


def test_wrong_rank_count_is_an_error():
    g = parse_graph(A2A)
    with pytest.raises(InterpError, match="graph runs on 2 ranks, got inputs for 1"):
        run(g, [{"p": np.zeros((4, 2, 3), np.float32)}])


INOUT = """graph @g<T = 2>(%kv: bf16[T,4], %cache: bf16[6,4] inout, %slot: i32[T], %lens: i32[T]) {
  %s.ins, %s.bias = swa_cache_insert_valid_bias(%kv, %cache, %slot, %lens) {window = 3} : bf16[6,4], f32[T,3]
  return %s.ins, %s.bias
}
"""


def test_inout_buffers_are_not_mutated_and_the_new_version_is_returned():
    g = parse_graph(INOUT)
    verify(g)
    cache = np.zeros((6, 4), BF16)
    inputs = {"kv": np.ones((2, 4), BF16), "cache": cache, "slot": np.array([5, -1], np.int32),
              "lens": np.array([1, 3], np.int32)}
    out = run(g, inputs)
    assert not cache.astype(np.float32).any()
    new = out["s.ins"].astype(np.float32)
    assert new[5].tolist() == [1, 1, 1, 1] and not new[:5].any()
    assert out["s.bias"].tolist() == np.array([[0, -1e20, -1e20], [0, 0, 0]], np.float32).tolist()


def test_a_failing_reference_names_the_node(monkeypatch):
    from dspark_ir.ops import get_op

    text = """graph @g<T = 2>(%x: f32[T,4,8]) {
  %hc.r = hc_pre_rms(%x) : f32[T]
  return %hc.r
}
"""
    g = parse_graph(text)
    monkeypatch.setattr(get_op("hc_pre_rms"), "reference", staticmethod(lambda *a, **k: 1 / 0))
    with pytest.raises(InterpError, match=r"node 'hc.r': hc_pre_rms failed: ZeroDivisionError"):
        run(g, {"x": np.zeros((2, 4, 8), np.float32)})
    monkeypatch.setattr(get_op("hc_pre_rms"), "reference", staticmethod(lambda x, **k: np.zeros(2, np.float64)))
    with pytest.raises(InterpError, match=r"%hc.r: hc_pre_rms produced float64, declared f32\[T\]"):
        run(g, {"x": np.zeros((2, 4, 8), np.float32)})

"""Indexer visibility, top-k contract (−1 padding, ties lower index first) and the bypass equivalence."""
from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from goldens.compare import check
from goldens.config import config_by_name
from goldens.indexer import bypass_topk, topk_indices, visible_lengths
from goldens.inputs import ATTENTION_REGIMES, make_inputs
from goldens.layers import decode_csa

TINY = config_by_name("tiny")


@settings(max_examples=60, deadline=None)
@given(scores=arrays(np.float32, (4, TINY.score_len), elements=st.sampled_from([-2.0, -0.5, 0.0, 0.5, 3.0])),
       visible=st.lists(st.integers(0, TINY.score_len), min_size=4, max_size=4))
def test_topk_contract(scores, visible):
    topk = topk_indices(TINY, scores, np.array(visible))
    assert topk.shape == scores.shape and topk.dtype == np.int32
    for t, v in enumerate(visible):
        k = min(TINY.idx_topk, v)
        chosen, tail = topk[t, :k], topk[t, k:]
        assert np.all(tail == -1)
        assert len(set(chosen.tolist())) == k and np.all((chosen >= 0) & (chosen < v))
        s = scores[t, chosen]
        assert np.all(np.diff(s) <= 0)
        ties = np.diff(s) == 0
        assert np.all(np.diff(chosen)[ties] > 0)
        rest = np.setdiff1d(np.arange(v), chosen)
        if k and rest.size:
            worst = s[-1]
            assert np.all(scores[t, rest] <= worst)
            assert np.all(rest[scores[t, rest] == worst] > chosen[s == worst].max())


@settings(max_examples=60, deadline=None)
@given(starts=st.lists(st.integers(0, TINY.max_pos - TINY.seq), min_size=TINY.batch, max_size=TINY.batch),
       extra=st.lists(st.integers(0, 3), min_size=TINY.batch, max_size=TINY.batch))
def test_visible_lengths_bound(starts, extra):
    starts = np.array(starts)
    positions = (starts[:, None] + np.arange(TINY.seq)).reshape(-1)
    kv_seq_len = np.minimum(starts + TINY.seq + np.array(extra), TINY.max_pos)
    visible = visible_lengths(TINY, positions, kv_seq_len)
    assert np.all(visible <= (positions + 1) // TINY.csa_ratio)
    assert np.all(visible <= TINY.score_len) and np.all(visible >= 0)


def test_bypass_topk_is_bounded_identity():
    out = bypass_topk(TINY, np.array([0, 3, 16]), width=20)
    assert out[0].tolist() == [-1] * 20
    assert out[1].tolist() == [0, 1, 2] + [-1] * 17
    assert out[2].tolist() == list(range(16)) + [-1] * 4


@settings(max_examples=12, deadline=None)
@given(seed=st.integers(0, 2**16), regime=st.sampled_from(ATTENTION_REGIMES))
def test_layer_topk_respects_visibility(seed, regime):
    inputs = make_inputs("csa", TINY, seed, regime)
    trace = {}
    decode_csa(TINY, inputs, trace)
    pos, topk, visible = inputs["positions"], trace["idx.topk"], trace["idx.visible"]
    assert np.all(visible <= (pos + 1) // TINY.csa_ratio)
    counts = (topk >= 0).sum(axis=1)
    np.testing.assert_array_equal(counts, np.minimum(visible, TINY.idx_topk))
    assert np.all(topk < np.maximum(visible, 1)[:, None])
    score = trace["idx.score"]
    cols = np.arange(TINY.score_len)[None, :]
    assert np.all(score[cols >= visible[:, None]] == np.float32(-3.4028234663852886e38))
    assert np.all(np.isfinite(score[cols < visible[:, None]]))
    rows = trace["attn.cmp_rows"]
    assert np.all((rows >= 0).sum(axis=1) == np.minimum(visible, TINY.idx_topk))


def test_long_cache_topk_really_selects():
    inputs = make_inputs("csa", TINY, 0, "long_cache")
    trace = {}
    decode_csa(TINY, inputs, trace)
    assert np.all(trace["idx.visible"] > TINY.idx_topk)
    assert not np.array_equal(trace["idx.topk"], bypass_topk(TINY, np.minimum(trace["idx.visible"], TINY.idx_topk)))


def test_bypass_matches_scored_topk_when_everything_is_visible():
    for seed in range(3):
        for regime in ("short_cache", "topk_boundary", "default"):
            inputs = make_inputs("csa", TINY, seed, regime)
            trace = {}
            scored = decode_csa(TINY, inputs, trace)
            bypassed = decode_csa(TINY, inputs, bypass=True)
            assert check("x_out_csa", bypassed["x_out"], scored["x_out"])

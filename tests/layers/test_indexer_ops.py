"""Lightning-indexer ops (kernels/indexer.py, dspark_ir/ops/indexer.py) against the independent goldens
(goldens/indexer.py): query side and scores bitwise, head weights within a few f32 ulps (ascending K-split sum vs
the golden's exact sum), top-k with −1 padding and stable tie order, and the bypass writer."""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_ir.errors import ShapeError
from dspark_ir.graph import Graph
from dspark_ir.semantics import compressor as KC
from dspark_ir.semantics import indexer as K
from dspark_ir.types import TensorType
from goldens import config as gc
from goldens import inputs as gi
from goldens.indexer import bypass_topk, head_weights, index_query, index_scores, topk_indices, visible_lengths
from goldens.norm import rms_norm
from goldens.numerics import q8, rope_half
from goldens.paging import request_of_tokens

from .helpers import bitwise

SEEDS = (0, 1, 2)


@lru_cache(maxsize=None)
def case(seed: int, regime: str, tp: int = 1):
    cfg = gc.config_by_name("tiny").with_(tp=tp)
    inputs = gi.make_inputs("csa", cfg, seed, regime)
    rng = np.random.default_rng(100 + seed)
    x_normed = rms_norm(rng.standard_normal((cfg.tokens, cfg.hidden)), inputs["norm_w"], cfg.rms_eps)
    qr, qr_scale = q8(rng.standard_normal((cfg.tokens, cfg.q_lora)).astype(np.float32))
    return cfg, inputs, x_normed, qr, qr_scale


def query_side(cfg, inputs, qr, qr_scale):
    """The q-side chain as the graph runs it: int8 matmul → dequant → rope (first position) → Hadamard → q8."""
    acc = (qr.astype(np.int64) @ inputs["idx_wq_b"].astype(np.int64)).astype(np.int32)
    q = K.idx_qr_dequant(acc, qr_scale[:, 0], inputs["idx_wq_b_scale"], heads=cfg.idx_heads)
    cos, sin = KC.rope_gather_rows(inputs["rope_cos"], inputs["rope_sin"], inputs["positions"], at="first",
                                   seq=cfg.seq)
    cos_il, sin_signed = KC.rope_interleave(cos, sin)
    q = K.idx_qr_rope(q, cos_il, sin_signed, KC.rope_swap_idx(rope_dim=cfg.rope_dim), seq=cfg.seq)
    return K.idx_q_quant(K.idx_hadamard_matmul(q, inputs["idx_hadamard"]))


def golden_query(cfg, inputs, qr, qr_scale):
    positions = inputs["positions"]
    first = positions[request_of_tokens(len(positions), cfg.seq) * cfg.seq]
    c, s = rope_half(inputs["rope_cos"], first), rope_half(inputs["rope_sin"], first)
    return index_query(cfg, qr, qr_scale, inputs["idx_wq_b"], inputs["idx_wq_b_scale"], inputs["idx_hadamard"], c, s)


def weights(cfg, x_normed, inputs):
    partials = K.idx_weights_proj(x_normed, inputs["idx_weights_proj"], k_split=4)
    return K.idx_weights_reduce(partials, scale=cfg.index_weights_scale)


def score_args(cfg):
    return dict(ratio=cfg.csa_ratio, seq=cfg.seq, score_len=cfg.score_len)


@pytest.mark.parametrize("regime", gi.ATTENTION_REGIMES)
@pytest.mark.parametrize("seed", SEEDS)
def test_query_score_topk_are_bitwise_golden(seed, regime):
    cfg, inputs, x_normed, qr, qr_scale = case(seed, regime)
    q_i8, q_s = query_side(cfg, inputs, qr, qr_scale)
    want_i8, want_s = golden_query(cfg, inputs, qr, qr_scale)
    assert bitwise(q_i8, want_i8) and bitwise(q_s, want_s[..., 0])
    w = weights(cfg, x_normed, inputs)
    vis = visible_lengths(cfg, inputs["positions"], inputs["kv_seq_len"])
    score = K.idx_score(q_i8, q_s, w, inputs["idx_kv_cache"], inputs["idx_kv_scale"], inputs["idx_block_table"],
                        inputs["positions"], inputs["kv_seq_len"], block_size=cfg.block_size, **score_args(cfg))
    assert bitwise(score, index_scores(cfg, want_i8, want_s, w, inputs["idx_kv_cache"], inputs["idx_kv_scale"],
                                       inputs["idx_block_table"], vis))
    topk = K.idx_topk(score, inputs["positions"], inputs["kv_seq_len"], k=cfg.idx_topk, **score_args(cfg))
    assert topk.dtype == np.int32 and bitwise(topk, topk_indices(cfg, score, vis))


@pytest.mark.parametrize("seed", SEEDS)
def test_head_weights_within_a_few_ulps_of_the_exact_sum(seed):
    """Ascending f32 sum of 4 exact K-split partials vs the golden's exact sum: within 4 ulp of Σ|partials|
    (3 f32 additions and the scale product); with one split the two are bitwise equal."""
    cfg, inputs, x_normed, _, _ = case(seed, "default")
    want = head_weights(cfg, x_normed, inputs["idx_weights_proj"])
    got = weights(cfg, x_normed, inputs)
    partials = K.idx_weights_proj(x_normed, inputs["idx_weights_proj"], k_split=4)
    bound = 4 * np.spacing(np.abs(partials).sum(axis=0) * np.float32(cfg.index_weights_scale))
    assert np.all(np.abs(got - want) <= bound)
    one = K.idx_weights_reduce(K.idx_weights_proj(x_normed, inputs["idx_weights_proj"], k_split=1),
                               scale=cfg.index_weights_scale)
    assert bitwise(one, want)


def test_topk_ties_keep_the_lower_index_and_pad_with_minus_one():
    cfg = gc.config_by_name("tiny").with_(tp=1)
    T = cfg.tokens
    positions = np.tile(np.arange(119, 119 + cfg.seq), cfg.batch).astype(np.int32)  # 30 visible entries each
    kv_len = np.full(cfg.batch, 123 + 1, np.int32)
    score = np.full((T, cfg.score_len), -3.0e38, np.float32)
    vis = K.visible_lengths(positions, kv_len, **score_args(cfg))
    for t in range(T):
        score[t, : vis[t]] = np.round(np.linspace(1, 0, vis[t]) * 5) / 5  # runs of equal scores
    topk = K.idx_topk(score, positions, kv_len, k=cfg.idx_topk, **score_args(cfg))
    for t in range(T):
        sel = topk[t, : cfg.idx_topk]
        assert np.all(sel >= 0) and np.all(topk[t, cfg.idx_topk:] == -1)
        s = score[t, sel]
        assert np.all((s[:-1] > s[1:]) | ((s[:-1] == s[1:]) & (sel[:-1] < sel[1:])))  # ties: ascending index
    assert bitwise(topk, topk_indices(cfg, score, vis))


def test_score_capped_at_max_visible():
    """max_visible caps visible: entries below it as without the cap, FP32_NEG_INF from it on (the template then
    reads only its pages); a cap at or above every visible length changes nothing."""
    cfg, inputs, x_normed, qr, qr_scale = case(0, "long_cache")
    q_i8, q_s = query_side(cfg, inputs, qr, qr_scale)
    args = (q_i8, q_s, weights(cfg, x_normed, inputs), inputs["idx_kv_cache"], inputs["idx_kv_scale"],
            inputs["idx_block_table"], inputs["positions"], inputs["kv_seq_len"])
    full = K.idx_score(*args, block_size=cfg.block_size, **score_args(cfg))
    vis = visible_lengths(cfg, inputs["positions"], inputs["kv_seq_len"])
    cap = int(vis.max()) // 2
    capped = K.idx_score(*args, block_size=cfg.block_size, max_visible=cap, **score_args(cfg))
    assert bitwise(capped[:, :cap], full[:, :cap]) and np.all(capped[:, cap:] == K.FP32_NEG_INF)
    assert np.any(full[:, cap:] != K.FP32_NEG_INF)
    assert bitwise(K.idx_score(*args, block_size=cfg.block_size, max_visible=int(vis.max()), **score_args(cfg)), full)
    topk = K.idx_topk(capped, inputs["positions"], inputs["kv_seq_len"], k=cfg.idx_topk, max_visible=cap,
                      **score_args(cfg))
    assert bitwise(topk, topk_indices(cfg, capped, np.minimum(vis, cap)))


@pytest.mark.parametrize("cap", [None, "half"])
@pytest.mark.parametrize("seed", SEEDS)
def test_score_tail_is_open_and_no_topk_reads_it(seed, cap):
    """idx_score's open entries (OpDef.open_entries, upstream's unwritten tail) are exactly l ≥ min(visible,
    max_visible); whatever they hold (here values that would win any sort, and NaN), the top-k — one full sort or
    the prefill's staged sort — picks the same indices: it masks by the visible count, as upstream's topk."""
    from dspark_ir.ops import get_op

    cfg, inputs, x_normed, qr, qr_scale = case(seed, "long_cache")
    q_i8, q_s = query_side(cfg, inputs, qr, qr_scale)
    args = (q_i8, q_s, weights(cfg, x_normed, inputs), inputs["idx_kv_cache"], inputs["idx_kv_scale"],
            inputs["idx_block_table"], inputs["positions"], inputs["kv_seq_len"])
    vis = visible_lengths(cfg, inputs["positions"], inputs["kv_seq_len"])
    bound = None if cap is None else int(vis.max()) // 2
    attrs = dict(block_size=cfg.block_size, max_visible=bound, **score_args(cfg))
    score = K.idx_score(*args, **attrs)
    (mask,) = get_op("idx_score").open_entries(*args, **attrs)
    assert get_op("idx_score").open_entries is K.idx_score_open
    seen = vis if bound is None else np.minimum(vis, bound)
    assert np.array_equal(mask, np.arange(cfg.score_len)[None, :] >= seen[:, None]) and mask.any() and (~mask).any()
    for filler in (np.float32(3.0e38), np.float32(np.nan)):
        dirty = np.where(mask, filler, score)
        for stages in (None, (32, 64, 256)):
            kw = dict(k=cfg.idx_topk, max_visible=bound, sort_stages=stages, **score_args(cfg))
            clean = K.idx_topk(score, inputs["positions"], inputs["kv_seq_len"], **kw)
            assert bitwise(K.idx_topk(dirty, inputs["positions"], inputs["kv_seq_len"], **kw), clean)


@pytest.mark.parametrize("regime", ["empty_cmp", "short_cache", "window_boundary", "topk_boundary"])
def test_bounded_writer_is_the_topk_set_when_visible_fits(regime):
    """The bypass precondition holds in these regimes (visible ≤ idx_topk): same set, ascending, −1 tail; the
    boundary visible == idx_topk is included."""
    cfg, inputs, x_normed, qr, qr_scale = case(0, regime)
    vis = visible_lengths(cfg, inputs["positions"], inputs["kv_seq_len"])
    assert np.all(vis <= cfg.idx_topk)
    q_i8, q_s = query_side(cfg, inputs, qr, qr_scale)
    score = K.idx_score(q_i8, q_s, weights(cfg, x_normed, inputs), inputs["idx_kv_cache"], inputs["idx_kv_scale"],
                        inputs["idx_block_table"], inputs["positions"], inputs["kv_seq_len"],
                        block_size=cfg.block_size, **score_args(cfg))
    topk = K.idx_topk(score, inputs["positions"], inputs["kv_seq_len"], k=cfg.idx_topk, **score_args(cfg))
    bounded = K.idx_topk_bounded(inputs["positions"], inputs["kv_seq_len"], k=cfg.idx_topk, **score_args(cfg))
    assert bitwise(bounded, bypass_topk(cfg, vis))
    assert bitwise(np.sort(np.where(topk < 0, 1 << 30, topk), axis=1), np.sort(np.where(bounded < 0, 1 << 30,
                                                                                        bounded), axis=1))
    if regime == "topk_boundary":
        assert np.any(vis == cfg.idx_topk)


def test_shape_rules():
    g = Graph("t", {"T": 16, "B": 4})
    p = {n: g.add_param(n, TensorType.of(dt, sh)) for n, dt, sh in [
        ("score", "f32", [16, 128]), ("pos", "i32", [16]), ("kv_len", "i32", [4]), ("bad", "f32", [16, 64])]}
    node = g.add_op("idx_topk", [p["score"], p["pos"], p["kv_len"]],
                    dict(k=16, ratio=4, seq=4, score_len=128, max_visible=64), names="idx.topk")
    assert str(node.result.type) == "i32[16,128]"
    with pytest.raises(ShapeError, match="score width"):
        g.add_op("idx_topk", [p["bad"], p["pos"], p["kv_len"]], dict(k=16, ratio=4, seq=4, score_len=128), names="x")
    with pytest.raises(ShapeError, match="kv_seq_len rows"):
        g.add_op("idx_topk", [p["score"], p["pos"], p["kv_len"]], dict(k=16, ratio=4, seq=8, score_len=128),
                 names="y")


# ---- the staged prefill sort (sort_stages, dspark-model.md §6(h)) ---------------------------------------------
@settings(max_examples=80, deadline=None)
@given(st.data())
def test_staged_topk_is_the_topk_exactly_when_its_widest_stage_covers_the_prefix(data):
    """Against a plain argsort of the visible prefix: equal whenever the widest stage covers it; past it, the
    first min(k, visible) staged entries are the first runs' keys (all visible, unique), which differ from the
    top-k once a better key sits beyond the first run."""
    first = data.draw(st.sampled_from([1, 2, 4]))
    stages = [first * 2 ** i for i in range(data.draw(st.integers(1, 4)))]
    score_len, k = data.draw(st.sampled_from([16, 32, 48])), data.draw(st.integers(1, 12))
    t = 6
    positions = np.array(data.draw(st.lists(st.integers(0, score_len - 1), min_size=t, max_size=t)), np.int32)
    score = np.random.default_rng(data.draw(st.integers(0, 99))).standard_normal((t, score_len)).astype(np.float32)
    attrs = dict(k=k, ratio=1, seq=t, score_len=score_len)
    got = K.idx_topk(score, positions, [score_len], sort_stages=stages, **attrs)
    for row, (p, g_row) in enumerate(zip(positions, got)):
        visible = int(p) + 1
        n = min(k, visible)
        assert (g_row[n:] == -1).all() and len(set(g_row[:n])) == n and (g_row[:n] < visible).all()
        if stages[-1] >= visible:
            full = np.argsort(-score[row, :visible], kind="stable")[:n]
            np.testing.assert_array_equal(g_row[:n], full, err_msg=f"row {row}")
        else:
            runs = np.concatenate([np.argsort(-score[row, lo:min(lo + stages[-1], visible)], kind="stable") + lo
                                   for lo in range(0, visible, stages[-1])])
            np.testing.assert_array_equal(g_row[:n], runs[:n], err_msg=f"row {row}")

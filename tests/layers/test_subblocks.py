"""Each op reference of the shared prefix, SWA attention and the O path against the golden sub-block functions.

Where the reference follows the golden's op order, the check is bitwise (same inputs → same bits). The atomic
split-K projections (qr, kv) are the only stages that are not: there the graph value is checked against the golden
within the dsv4-math tolerance, and the downstream stages are fed the golden's own intermediate.
"""
from __future__ import annotations

import numpy as np
import pytest

import runner
from dspark_ir import layers
from dspark_ir.interp import run
from dspark_ir.semantics import attention as ka
from dspark_ir.semantics import collective as kc
from dspark_ir.semantics import hc as khc
from dspark_ir.semantics import oproj as ko
from dspark_ir.semantics import qkv as kq
from dspark_ir.semantics.matmul import matmul as k_matmul
from goldens import attention as ga
from goldens import compare as gcmp
from goldens import hc as ghc
from goldens import o_proj as gop
from goldens import qkv as gqkv
from goldens.numerics import imatmul, matmul, rope_half
from goldens.paging import write_rows

from .helpers import bitwise, f32


def _tables(cfg, inputs):
    return kq.rope_tables(inputs["rope_cos"], inputs["rope_sin"], inputs["positions"], rope_dim=cfg.rope_dim)


# ---- hc ---------------------------------------------------------------------------------------------------------
def test_hc_pre_stages_are_bitwise(swa_case):
    cfg, inputs, trace, _ = swa_case
    tiles = layers.GraphBuilder("decode-swa", cfg).tiles
    x_hc = inputs["x_hc"]
    inv = khc.hc_pre_rms(x_hc, tile=[tiles.T_TILE, tiles.RMS_K_CHUNK], eps=cfg.hc_eps)
    assert bitwise(inv, ghc.hc_inv_rms(cfg, x_hc)[:, 0])
    seed = np.zeros((cfg.tokens, cfg.mix_hc), np.float32)
    mixes = khc.hc_pre_linear(x_hc, inputs["hc_fn"], seed, k_split=tiles.LINEAR_OK)
    assert bitwise(mixes * inv[:, None], ghc.hc_mix(cfg, x_hc, inputs["hc_fn"]))
    pre, post = khc.split_pre_post(mixes, inv, inputs["hc_scale"], inputs["hc_base"], eps=cfg.hc_eps)
    comb = khc.comb_sinkhorn(mixes, inv, inputs["hc_scale"], inputs["hc_base"], iters=cfg.sinkhorn_iters,
                             eps=cfg.hc_eps)
    assert bitwise(post, trace["hc.post"])
    assert bitwise(comb, trace["hc.comb"])
    assert bitwise(khc.mix_x(x_hc, pre), trace["hc.x_mixed"])


def test_hc_pre_linear_forms_agree(swa_case):
    """atomic (seeded, ascending), none and ordered partials + ascending reduce are the same bits; another split
    order (what the shuffled executor does) differs by rounding only."""
    cfg, inputs, _, _ = swa_case
    x, fn, k = inputs["x_hc"], inputs["hc_fn"], 4
    atomic = khc.hc_pre_linear(x, fn, np.zeros((cfg.tokens, cfg.mix_hc), np.float32), k_split=k)
    plain = khc.hc_pre_linear(x, fn, accumulate="none", k_split=k)
    partials = khc.hc_pre_linear(x, fn, accumulate="ordered", k_split=k)
    assert partials.shape == (k * cfg.tokens, cfg.mix_hc)
    assert bitwise(atomic, plain)
    assert bitwise(atomic, khc.hc_pre_linear_reduce(partials, k_split=k))
    shuffled = khc.hc_pre_linear(x, fn, np.zeros_like(atomic), k_split=k, split_order=[3, 1, 0, 2])
    np.testing.assert_allclose(shuffled, atomic, rtol=1e-5, atol=1e-5)


def test_hc_post_is_bitwise(swa_case):
    cfg, inputs, trace, outputs = swa_case
    y = khc.hc_post(trace["o.attn_out"], inputs["x_hc"], trace["hc.post"], trace["hc.comb"])
    assert bitwise(y, outputs["x_out"])
    assert bitwise(y, ghc.hc_post(trace["o.attn_out"], inputs["x_hc"], trace["hc.post"], trace["hc.comb"]))


# ---- qkv --------------------------------------------------------------------------------------------------------
def test_rope_tables_match_the_pair_form(swa_case):
    cfg, inputs, _, _ = swa_case
    cos_il, sin_signed = _tables(cfg, inputs)
    c = rope_half(inputs["rope_cos"], inputs["positions"])
    s = rope_half(inputs["rope_sin"], inputs["positions"])
    assert bitwise(cos_il[:, 0::2], c) and bitwise(cos_il[:, 1::2], c)
    assert bitwise(sin_signed[:, 0::2], -s) and bitwise(sin_signed[:, 1::2], s)


def test_q_side_is_bitwise_given_the_golden_accumulator(swa_case):
    cfg, inputs, trace, _ = swa_case
    qa = matmul(f32(trace["norm.x_normed"]), f32(inputs["wq_a"]))
    qr, qr_scale = kq.qr_rms_norm_quant(qa, inputs["gamma_cq"], eps=cfg.rms_eps)
    assert bitwise(qr, trace["qkv.qr"])
    assert bitwise(qr_scale, trace["qkv.qr_scale"][:, 0])
    acc = k_matmul(qr, inputs["wq_b"], out="i32")
    assert bitwise(acc, imatmul(qr, inputs["wq_b"]))
    q = kq.qproj_dequant_rms_nope_rope(acc, qr_scale, inputs["wq_b_scale"], *_tables(cfg, inputs),
                                       heads=cfg.heads, eps=cfg.rms_eps)
    assert bitwise(q, trace["qkv.q"])


def test_kv_side_is_bitwise_given_the_golden_accumulator(swa_case):
    cfg, inputs, trace, _ = swa_case
    ka_ = matmul(f32(trace["norm.x_normed"]), f32(inputs["wkv"]))
    kv = kq.kv_rms_norm_rope(ka_, inputs["gamma_ckv"], *_tables(cfg, inputs), eps=cfg.rms_eps)
    c, s = rope_half(inputs["rope_cos"], inputs["positions"]), rope_half(inputs["rope_sin"], inputs["positions"])
    assert bitwise(kv, gqkv.kv_proj(cfg, trace["norm.x_normed"], inputs["wkv"], inputs["gamma_ckv"], c, s))


def test_graph_stages_against_the_golden_trace(swa_case):
    """The interpreter's per-node values: bitwise up to the projections, then within the dsv4-math bounds."""
    cfg, inputs, trace, _ = swa_case
    g = layers.build("decode-swa", tp=1)
    env = run(g, runner.layer_inputs(g, 0), keep=True)
    assert bitwise(env["hc.mix_x"], trace["hc.x_mixed"])
    assert bitwise(env["hc.split_pre_post.post"], trace["hc.post"])
    assert bitwise(env["hc.comb_sinkhorn"], trace["hc.comb"])
    assert bitwise(env["attn.rms_norm"], trace["norm.x_normed"])
    assert gcmp.check("q", env["qkv.qproj_dequant_rms_nope_rope"], trace["qkv.q"])
    assert gcmp.check("kv", env["qkv.kv_rms_norm_rope"], trace["qkv.kv"])
    assert gcmp.check("qr", env["qkv.qr_rms_norm_quant"], trace["qkv.qr"])
    assert gcmp.check("qr_scale", env["qkv.qr_rms_norm_quant.scale"], trace["qkv.qr_scale"][:, 0])
    assert gcmp.check("packed", env["swa.merge_norm"], trace["attn.packed"][:, : cfg.tokens])
    assert gcmp.check("attn_out", env["o.proj_b_act"], trace["o.attn_out"])


# ---- attention --------------------------------------------------------------------------------------------------
def test_cache_insert_and_bias(swa_case):
    cfg, inputs, trace, outputs = swa_case
    cache, bias = ka.swa_cache_insert_valid_bias(trace["qkv.kv"], inputs["kv_cache"], inputs["swa_slot_mapping"],
                                                 inputs["swa_lens"], window=cfg.window)
    assert bitwise(cache, outputs["kv_cache"])
    assert bitwise(cache, write_rows(inputs["kv_cache"], inputs["swa_slot_mapping"], trace["qkv.kv"]))
    _, valid = ga.swa_window(inputs["swa_indices"], inputs["swa_lens"])
    indices_ok = np.asarray(inputs["swa_indices"]) >= 0
    assert np.array_equal((bias == 0) & indices_ok, valid)
    assert np.all((bias == 0) | (bias == np.float32(-1e20)))
    # the split form (#e) computes the same bits
    assert bitwise(ka.swa_cache_writeback(trace["qkv.kv"], inputs["kv_cache"], inputs["swa_slot_mapping"]), cache)
    assert bitwise(ka.swa_valid_bias(inputs["swa_lens"], window=cfg.window), bias)


def test_gather_qk_pv_merge_norm_are_bitwise(swa_case):
    cfg, inputs, trace, outputs = swa_case
    rows = ka.swa_gather_kv(outputs["kv_cache"], inputs["swa_indices"])
    keys, _ = ga.gather_keys(outputs["kv_cache"], inputs["swa_indices"])
    assert bitwise(rows, keys)
    _, bias = ka.swa_cache_insert_valid_bias(trace["qkv.kv"], inputs["kv_cache"], inputs["swa_slot_mapping"],
                                             inputs["swa_lens"], window=cfg.window)
    m, l, o = ka.qk_pv(trace["qkv.q"], rows, bias, inputs["swa_indices"], scale=cfg.softmax_scale,
                       k_tile=cfg.window)
    packed = ka.merge_norm(m, l, o, inputs["attn_sink"], *_tables(cfg, inputs), o_groups=cfg.o_groups)
    assert packed.dtype.name == "bfloat16" and packed.shape == (cfg.o_groups, cfg.tokens, 2 * cfg.head_dim)
    assert bitwise(packed, trace["attn.packed"][:, : cfg.tokens])


def test_qk_pv_tiles_merge_like_the_golden(swa_case):
    """k_tile < window: tiles merged in order with the log-sum-exp rule = the golden's tile merge, bitwise."""
    cfg, inputs, trace, outputs = swa_case
    keys, valid = ga.gather_keys(outputs["kv_cache"], *ga.swa_window(inputs["swa_indices"], inputs["swa_lens"]))
    want = ga.merge_partials([ga.tile_partial(trace["qkv.q"], keys[:, a:b], valid[:, a:b], cfg.softmax_scale)
                              for a, b in ga.even_tiles(0, cfg.window, 4)])
    bias = np.where(np.arange(cfg.window)[None, :] < inputs["swa_lens"][:, None], 0, -1e20).astype(np.float32)
    got = ka.qk_pv(trace["qkv.q"], keys, bias, inputs["swa_indices"], scale=cfg.softmax_scale, k_tile=4)
    for a, b in zip(got, want):
        assert bitwise(a, b)


# ---- O path -----------------------------------------------------------------------------------------------------
def _o_tp1(cfg, packed, wo_a, wo_b, wo_b_scale, out="bf16"):
    parts = []
    for g in range(wo_a.shape[0]):
        q, s = ko.quant_rows(ko.o_proj_a(packed, wo_a, group=g))
        parts += [ko.o_proj_b(q, wo_b, group=g), s]
    return ko.o_proj_b_dequant(wo_b_scale, *parts, out=out)


def test_o_proj_tp1_is_bitwise(swa_case):
    cfg, inputs, trace, _ = swa_case
    packed = trace["attn.packed"][:, : cfg.tokens]
    got = _o_tp1(cfg, packed, inputs["wo_a"], inputs["wo_b"], inputs["wo_b_scale"])
    assert bitwise(got, trace["o.attn_out"])
    assert bitwise(got, gop.o_proj(cfg, trace["attn.packed"], inputs["wo_a"], inputs["wo_b"], inputs["wo_b_scale"]))


@pytest.mark.parametrize("tp", [2, 4])
def test_tp_o_path_is_bitwise(tp):
    """all-to-all → per-rank f32 partials → reduce-scatter equals goldens.o_proj.o_proj_tp bit for bit."""
    from goldens import config as gc
    from goldens import inputs as gi

    cfg = gc.config_by_name("tiny").with_(tp=tp)
    per_rank = gi.make_rank_inputs("swa", cfg, 1)
    rng = np.random.default_rng(7)
    packed = [rng.standard_normal((cfg.o_groups, cfg.tokens, cfg.heads_per_group * cfg.head_dim))
              .astype(np.float32) for _ in range(tp)]
    recv = kc.o_group_a2a([[p] for p in packed], ranks=tp)
    want_recv = gop.o_group_all_to_all(cfg, packed)
    assert all(bitwise(a, b) for a, b in zip(recv, want_recv))
    partials = [_o_tp1(cfg, recv[r], per_rank[r]["wo_a"], per_rank[r]["wo_b"], per_rank[r]["wo_b_scale"], "f32")
                for r in range(tp)]
    got = kc.tp_o_reduce_scatter([[p] for p in partials], ranks=tp)
    want = gop.o_proj_tp(cfg, packed, [i["wo_a"] for i in per_rank], [i["wo_b"] for i in per_rank],
                         per_rank[0]["wo_b_scale"])
    assert all(bitwise(a, b) for a, b in zip(got, want))

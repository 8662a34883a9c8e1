"""rb, q8, RoPE, the cube split-K matmul, Sinkhorn and hc_post (goldens/numerics.py, goldens/hc.py)."""
from __future__ import annotations

import numpy as np
import pytest

from goldens.hc import hc_post, hc_pre, sinkhorn
from goldens.numerics import cube_mad_matmul, deq, q8, rb, rope_fwd, rope_half, rope_inv, rope_inv_freq, rope_tables


def rb_bits(x):
    bits = np.asarray(x, dtype=np.float32).view(np.uint32).astype(np.uint64)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.astype(np.uint32).view(np.float32)


def test_rb_ties_to_even():
    one_ulp = 2.0 ** -7
    x = np.array([1 + one_ulp / 2, 1 + 3 * one_ulp / 2, -(1 + one_ulp / 2), 1 + one_ulp / 2 + 2 ** -20], np.float32)
    assert rb(x).tolist() == [1.0, 1 + 2 * one_ulp, -1.0, 1 + one_ulp]


def test_rb_matches_the_bit_formula():
    x = np.random.default_rng(0).standard_normal(100_000).astype(np.float32) * 1e3
    np.testing.assert_array_equal(rb(x), rb_bits(x))


def test_q8_hand_cases():
    values, scale = q8(np.array([[127.0, 2.5, 3.5, -2.5], [2.0, 1.0, 0.5, -0.2]], np.float32))
    assert values.dtype == np.int8 and scale.shape == (2, 1)
    assert values.tolist() == [[127, 2, 4, -2], [127, 64, 32, -13]]
    assert scale[0, 0] == np.float32(1.0) and scale[1, 0] == np.float32(1.0) / (np.float32(127) / np.float32(2))


def test_q8_amax_floor_and_axis():
    values, scale = q8(np.zeros((3, 5), np.float32))
    assert not values.any() and scale[0, 0] == np.float32(1) / (np.float32(127) / np.float32(1e-4))
    w = np.random.default_rng(1).standard_normal((6, 4)).astype(np.float32)
    values, scale = q8(w, axis=0)
    assert scale.shape == (1, 4) and np.abs(values).max(axis=0).tolist() == [127] * 4
    np.testing.assert_allclose(deq(values, 1.0, scale), w, atol=float(np.abs(w).max()) / 127)


def test_rope_fwd_inv_identity(tiny):
    cos, sin = rope_tables(tiny, "compress")
    pos = np.arange(0, 512, 7)
    c, s = rope_half(cos, pos), rope_half(sin, pos)
    x = np.random.default_rng(2).standard_normal((len(pos), tiny.rope_dim)).astype(np.float32)
    back = rope_inv(rope_fwd(x, c, s), c, s)
    norm = np.repeat(c * c + s * s, 2, axis=1)
    np.testing.assert_allclose(back, x * norm, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(back, x, atol=0.05)


def test_rope_tables(flash, tiny):
    for cfg in (flash, tiny):
        for profile in ("base", "compress"):
            cos, sin = rope_tables(cfg, profile)
            assert cos.shape == (cfg.max_pos, cfg.rope_dim)
            np.testing.assert_array_equal(cos, rb(cos))
            np.testing.assert_array_equal(cos[:, : cfg.rope_dim // 2], cos[:, cfg.rope_dim // 2 :])
            assert np.all(cos[0] == 1) and np.all(sin[0] == 0)


def test_yarn_ramp_matches_the_note(flash):
    base = 1.0 / 160000.0 ** (np.arange(0, 64, 2) / 64)
    inv = rope_inv_freq(flash, "compress")
    np.testing.assert_allclose(inv[:16], base[:16], rtol=1e-6)
    np.testing.assert_allclose(inv[25:], base[25:] / 16, rtol=1e-6)
    assert np.all(inv[16:25] < base[16:25]) and np.all(inv[16:25] > base[16:25] / 16)


def cube_mad_slow(x, w, splits):
    m, k = x.shape
    out = np.zeros((m, w.shape[0]), np.float32)
    per = k // splits
    for i in range(m):
        for j in range(w.shape[0]):
            parts = []
            for s in range(splits):
                acc = np.float32(0)
                for g in range(s * per, (s + 1) * per, 4):
                    group = sum(float(x[i, c]) * float(w[j, c]) for c in range(g, g + 4))
                    acc = np.float32(float(acc) + group)
                parts.append(acc)
            total = parts[0]
            for p in parts[1:]:
                total = np.float32(total + p)
            out[i, j] = total
    return out


def test_cube_mad_order_is_exact():
    rng = np.random.default_rng(3)
    x = rng.standard_normal((3, 64)).astype(np.float32)
    w = rng.standard_normal((5, 64)).astype(np.float32)
    np.testing.assert_array_equal(cube_mad_matmul(x, w, 4), cube_mad_slow(x, w, 4))
    np.testing.assert_allclose(cube_mad_matmul(x, w, 4), x.astype(np.float64) @ w.T.astype(np.float64), rtol=1e-5)


def test_sinkhorn_rows_and_columns_sum_to_one(tiny):
    c = np.random.default_rng(4).standard_normal((64, 4, 4)).astype(np.float32)
    comb = sinkhorn(tiny, c)
    np.testing.assert_allclose(comb.sum(axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(comb.sum(axis=2), 1.0, atol=2e-3)
    assert np.all(comb > 0)


def test_hc_pre_shapes_and_gates(tiny):
    rng = np.random.default_rng(5)
    x_hc = rng.standard_normal((8, 4, tiny.hidden)).astype(np.float32)
    fn = (rng.standard_normal((24, tiny.hc_dim)) / 32).astype(np.float32)
    x_mixed, post, comb = hc_pre(tiny, x_hc, fn, np.ones(3, np.float32), np.zeros(24, np.float32))
    assert x_mixed.shape == (8, tiny.hidden) and post.shape == (8, 4) and comb.shape == (8, 4, 4)
    np.testing.assert_array_equal(x_mixed, rb(x_mixed))
    assert np.all((post > 0) & (post < 2))


def test_hc_post_identity_comb_returns_residual():
    rng = np.random.default_rng(6)
    res = rng.standard_normal((3, 4, 8)).astype(np.float32)
    out = hc_post(np.ones((3, 8), np.float32), res, np.zeros((3, 4), np.float32), np.broadcast_to(np.eye(4), (3, 4, 4)))
    np.testing.assert_array_equal(out, res)


@pytest.mark.parametrize("profile", ["bad"])
def test_rope_profile_is_checked(tiny, profile):
    with pytest.raises(ValueError, match="profile"):
        rope_tables(tiny, profile)

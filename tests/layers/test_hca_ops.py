"""HCA two-stream ops (kernels/sparse.py, dspark_ir/ops/sparse.py): compressed work items past the visible rows
are neutral (so a static work-item count bounded by the cache extent gives the golden's bits), unmapped pages are
invalid, the fused merge+pack equals merge → pack bit for bit, and the shape rules link the two stages."""
from __future__ import annotations

import numpy as np
import pytest

from dspark_ir.errors import ShapeError
from dspark_ir.graph import Graph
from dspark_ir.semantics import sparse as K
from dspark_ir.types import TensorType

from .helpers import bitwise

RNG = np.random.default_rng(11)
T, B, S, H, HD, W, R, BS = 8, 2, 4, 4, 16, 8, 4, 4


def stream():
    q = RNG.standard_normal((T, H, HD)).astype(K.BF16)
    rows = RNG.standard_normal((T, W, HD)).astype(K.BF16)
    idx = RNG.integers(-1, 50, (T, W)).astype(np.int32)
    idx[:, -1] = 1                                             # the token itself is always in its window
    return q, K.hca_raw_attn(q, rows, K.hca_raw_transpose(rows), idx, scale=0.25)


def compressed(works: int, table):
    cache = RNG.standard_normal((B * 4 * BS, HD)).astype(K.BF16)
    return K.hca_cmp_work_gather(cache, table, block_size=BS, work_rows=2 * BS, works=works)


def partials(q, rows, phys, positions, kv_len):
    return K.hca_cmp_qk_pv(q, rows, phys, positions, kv_len, scale=0.25, ratio=R, seq=S, work_rows=2 * BS,
                           max_rows=64)


def test_work_items_past_the_visible_rows_are_neutral():
    q, (m, l, heads) = stream()
    positions = np.array([9, 10, 11, 12, 20, 21, 22, 23], np.int32)   # n = 2..3 and 5..6 visible rows
    kv_len = np.array([13, 24], np.int32)
    table = np.array([[3, 1, 5, 7], [0, 2, 4, 6]], np.int32)
    cache = RNG.standard_normal((32, HD)).astype(K.BF16)
    rows1, phys1 = K.hca_cmp_work_gather(cache, table, block_size=BS, work_rows=2 * BS, works=1)
    rows2, phys2 = K.hca_cmp_work_gather(cache, table, block_size=BS, work_rows=2 * BS, works=2)
    assert bitwise(rows2[:, : 2 * BS], rows1) and bitwise(phys2[:, : 2 * BS], phys1)
    one = partials(q, rows1, phys1, positions, kv_len)
    two = partials(q, rows2, phys2, positions, kv_len)
    assert np.all(two[0][:, 1] == np.float32(-1e20)) and not two[1][:, 1].any() and not two[2][:, 1].any()
    sink = RNG.standard_normal(H).astype(np.float32)
    assert bitwise(K.hca_stream_merge(m, l, heads, *one, sink), K.hca_stream_merge(m, l, heads, *two, sink))


def test_unmapped_pages_and_invisible_rows_are_masked():
    q, _ = stream()
    positions = np.array([27, 28, 29, 30, 27, 28, 29, 30], np.int32)  # n = 7 for every token
    kv_len = np.array([31, 31], np.int32)
    table = np.array([[3, -1, 5, 7], [0, 2, 4, 6]], np.int32)
    cache = RNG.standard_normal((32, HD)).astype(K.BF16)
    rows, phys = K.hca_cmp_work_gather(cache, table, block_size=BS, work_rows=2 * BS, works=1)
    assert np.all(phys[0, BS: 2 * BS] == -1) and not np.asarray(rows[0, BS: 2 * BS], np.float32).any()
    m, l, o = partials(q, rows, phys, positions, kv_len)
    # request 1, row 7 is not visible (n = 7); request 0 sees rows 0..3 only (page 1 unmapped)
    changed = np.array(rows, copy=True)
    changed[1, 7] = changed[1, 7] * 4
    changed[0, 4:] = 5.0
    assert all(bitwise(a, b) for a, b in zip((m, l, o), partials(q, changed, phys, positions, kv_len)))


def test_fused_merge_pack_is_bitwise_the_two_ops():
    q, (m, l, heads) = stream()
    positions = np.array([9, 10, 11, 12, 20, 21, 22, 23], np.int32)
    kv_len = np.array([13, 24], np.int32)
    table = np.array([[3, 1, 5, 7], [0, 2, 4, 6]], np.int32)
    cmp = partials(q, *compressed(2, table), positions, kv_len)
    sink = RNG.standard_normal(H).astype(np.float32)
    cos = RNG.standard_normal((T, 8)).astype(K.BF16)
    sin = RNG.standard_normal((T, 8)).astype(K.BF16)
    swap = np.arange(8, dtype=np.int32) ^ 1
    two = K.hca_stream_pack(K.hca_stream_merge(m, l, heads, *cmp, sink), cos, sin, swap, o_groups=2)
    assert two.shape == (2, T, 2 * HD) and two.dtype == K.BF16
    assert bitwise(K.hca_stream_merge_pack(m, l, heads, *cmp, sink, cos, sin, swap, o_groups=2), two)


def test_shape_rules_link_merge_and_pack():
    g = Graph("t", {"T": T})
    p = {n: g.add_param(n, TensorType.of(dt, sh)) for n, dt, sh in [
        ("m", "f32", ["T", H]), ("l", "f32", ["T", H]), ("heads", "f32", ["T", H, HD]),
        ("cm", "f32", ["T", 2, H]), ("cl", "f32", ["T", 2, H]), ("co", "f32", ["T", 2, H, HD]),
        ("sink", "f32", [H]), ("cos", "bf16", ["T", 8]), ("sin", "bf16", ["T", 8]), ("swap", "i32", [8]),
        ("bad_co", "f32", ["T", 2, H, 8])]}
    merged = g.add_op("hca_stream_merge", [p[n] for n in ("m", "l", "heads", "cm", "cl", "co", "sink")],
                      names="hca.hca_stream_merge").result
    packed = g.add_op("hca_stream_pack", [merged, p["cos"], p["sin"], p["swap"]], {"o_groups": 2},
                      names="hca.hca_stream_pack").result
    assert str(packed.type) == f"bf16[2,T,{2 * HD}]"
    fused = g.add_op("hca_stream_merge_pack", [p[n] for n in ("m", "l", "heads", "cm", "cl", "co", "sink", "cos",
                                                              "sin", "swap")], {"o_groups": 2}, names="fused").result
    assert fused.type == packed.type
    with pytest.raises(ShapeError, match="do not match the stream"):
        g.add_op("hca_stream_merge", [p[n] for n in ("m", "l", "heads", "cm", "cl", "bad_co", "sink")], names="x")

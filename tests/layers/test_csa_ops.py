"""CSA sparse-attention ops (kernels/sparse.py, dspark_ir/ops/sparse.py): the plan stage's masking
(dsv4-math §6.1: keep 0 ≤ raw < (pos+1)//4, so a speculative second boundary that was never pooled is dropped;
unmapped pages are dropped), its block mask / bias / item order, the neutrality of an empty block in the merge, and
the WAR marker kv_touch in the verifier."""
from __future__ import annotations

import numpy as np
import pytest

from dspark_ir.errors import ShapeError, VerifyError
from dspark_ir.graph import Graph
from dspark_ir.semantics import sparse as K
from dspark_ir.types import TensorType
from dspark_ir.verifier import verify
from goldens import config as gc
from goldens.attention import csa_compressed_rows

from .helpers import bitwise

CFG = gc.config_by_name("tiny").with_(tp=1)
RNG = np.random.default_rng(7)


def plan_inputs():
    T, r, k = CFG.tokens, CFG.csa_ratio, CFG.idx_topk
    positions = np.array([3, 40, 70, 200, 9, 60, 63, 120])[:, None] + np.arange(CFG.seq)[None, :]
    positions = positions.reshape(-1).astype(np.int32)
    topk = np.full((T, CFG.score_len), -1, np.int32)
    for t in range(T):
        n = (positions[t] + 1) // r + 2                      # two entries beyond the visible bound
        topk[t, : min(k, n)] = RNG.permutation(n)[: min(k, n)]
    table = RNG.permutation(CFG.batch * 8).reshape(CFG.batch, 8).astype(np.int32)
    table[1, 1] = -1                                         # an unmapped page
    swa = RNG.integers(-1, 100, (T, CFG.window)).astype(np.int32)
    return topk, positions, table, swa


def run_plan():
    topk, positions, table, swa = plan_inputs()
    return (topk, positions, table, swa), K.csa_slots_build_valid_qk_plan(
        topk, positions, table, swa, ratio=CFG.csa_ratio, seq=CFG.seq, block_size=CFG.block_size,
        idx_topk=CFG.idx_topk, k_tile=CFG.window)


def test_plan_masks_to_the_pooled_entries_and_mapped_pages():
    (topk, positions, table, swa), (rows, mask, bias, order) = run_plan()
    assert bitwise(rows, csa_compressed_rows(CFG, topk, positions, table))
    raw = topk[:, : CFG.idx_topk]
    beyond = raw >= ((positions + 1) // CFG.csa_ratio)[:, None]
    assert beyond.any() and np.all(rows[beyond] == -1)
    unmapped = (np.arange(CFG.tokens)[:, None] // CFG.seq == 1) & (raw // CFG.block_size == 1)
    assert unmapped.any() and np.all(rows[unmapped] == -1)
    valid = np.concatenate([swa >= 0, rows >= 0], axis=1)
    assert bitwise(bias, np.where(valid, 0.0, -1e20).astype(np.float32))
    assert bitwise(mask, valid.reshape(CFG.tokens, -1, CFG.window).any(-1))


def test_plan_orders_non_empty_items_first():
    (_, _, _, _), (_, mask, _, order) = run_plan()
    flat = mask.reshape(-1).astype(bool)
    assert sorted(order) == list(range(flat.size))
    n = int(flat.sum())
    assert flat[order[:n]].all() and not flat[order[n:]].any()
    assert list(order[:n]) == sorted(order[:n])


def test_an_empty_block_is_neutral_in_the_merge():
    """A top-k block with no valid row leaves the merged state bit for bit unchanged (m = −1e20, l = 0, o = 0)."""
    T, H, HD, W = 4, 2, 16, 8
    q = RNG.standard_normal((T, H, HD)).astype(K.BF16)
    cache = RNG.standard_normal((64, HD)).astype(K.BF16)
    swa = RNG.integers(0, 64, (T, W)).astype(np.int32)
    cmp_idx = np.full((T, W), -1, np.int32)
    bias = np.concatenate([np.zeros((T, W)), np.full((T, W), -1e20)], axis=1).astype(np.float32)
    order = np.arange(2 * T, dtype=np.int32)
    m, l, o = K.csa_qk_pv(q, cache, swa, cache, cmp_idx, bias, order, scale=0.25, k_tile=W)
    assert np.all(m[:, 1] == np.float32(-1e20)) and not l[:, 1].any() and not o[:, 1].any()
    sink = RNG.standard_normal(H).astype(np.float32)
    cos = np.ones((T, 4), K.BF16)
    sin = np.zeros((T, 4), K.BF16)
    both = K.csa_merge_norm(m, l, o, sink, cos, sin, o_groups=2)
    alone = K.csa_merge_norm(m[:, :1], l[:, :1], o[:, :1], sink, cos, sin, o_groups=2)
    assert bitwise(both, alone)


def test_live_blocks_are_the_leading_blocks():
    """live_blocks = n: the partials of the first n blocks, bit for bit those of the full op (the caller's bound
    says the later ones are empty, and an empty block is neutral in the merge: test above)."""
    T, H, HD, W = 4, 2, 16, 8
    q = RNG.standard_normal((T, H, HD)).astype(K.BF16)
    cache = RNG.standard_normal((64, HD)).astype(K.BF16)
    swa = RNG.integers(0, 64, (T, W)).astype(np.int32)
    cmp_idx = np.concatenate([RNG.integers(0, 64, (T, W)), np.full((T, 2 * W), -1)], axis=1).astype(np.int32)
    bias = np.zeros((T, 4 * W), np.float32)
    order = np.arange(4 * T, dtype=np.int32)
    full = K.csa_qk_pv(q, cache, swa, cache, cmp_idx, bias, order, scale=0.25, k_tile=W)
    live = K.csa_qk_pv(q, cache, swa, cache, cmp_idx, bias, order, scale=0.25, k_tile=W, live_blocks=2)
    assert all(x.shape[1] == 2 and bitwise(x, f[:, :2]) for x, f in zip(live, full))
    assert np.all(full[0][:, 2:] == np.float32(-1e20)) and not full[1][:, 2:].any()


def test_live_blocks_shape_rule():
    g = Graph("t", {"T": 4})
    ins = [g.add_param("q", TensorType.of("bf16", ["T", 2, 16])), g.add_param("kv", TensorType.of("bf16", [64, 16])),
           g.add_param("swa", TensorType.of("i32", ["T", 8])), g.add_param("cmp", TensorType.of("bf16", [64, 16])),
           g.add_param("ci", TensorType.of("i32", ["T", 24])), g.add_param("bias", TensorType.of("f32", ["T", 32])),
           g.add_param("order", TensorType.of("i32", ["T*4"]))]
    node = g.add_op("csa_qk_pv", ins, dict(scale=0.25, k_tile=8, live_blocks=2), names=["m", "l", "o"])
    assert [r.type.shape[1].value() for r in node.results] == [2, 2, 2]
    with pytest.raises(ShapeError, match=r"live_blocks must be in \[1, 4\]"):
        g.add_op("csa_qk_pv", ins, dict(scale=0.25, k_tile=8, live_blocks=5), names=["m5", "l5", "o5"])


def _touch_graph(read_touched: bool) -> Graph:
    g = Graph("t", {"T": 4})
    kv = g.add_param("kv", TensorType.of("bf16", ["T", 8]))
    cache = g.add_param("kv_cache", TensorType.of("bf16", [32, 8]), inout=True)
    slots = g.add_param("slots", TensorType.of("i32", ["T"]))
    wrote = g.add_op("kv_cache_writeback", [kv, cache, slots], names="csa.csa_cache_writeback").result
    touched = g.add_op("kv_touch", [wrote], names="csa.kv_touch").result
    reader = g.add_op("o_local_bridge", [touched if read_touched else wrote], names="csa.reader",
                      deps=[touched]).result
    g.set_returns([reader, touched])
    return g


def test_kv_touch_is_an_in_place_update():
    """A reader ordered after kv_touch must read the touched version; the stale one is a verifier error."""
    verify(_touch_graph(read_touched=True))
    with pytest.raises(VerifyError, match="after 'csa.kv_touch' overwrote it"):
        verify(_touch_graph(read_touched=False))

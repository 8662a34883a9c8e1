"""KV-compressor ops (kernels/compressor.py, dspark_ir/ops/compressor.py) against the independent goldens
(goldens/compressor.py, goldens/indexer.py): the CSA main (r = 4, overlap), the indexer inner C8 (r = 4, overlap,
idx_head_dim) and the HCA (r = R, no overlap) compressors, bitwise, on every input regime and at S = 4 and S = 8
(two ratio-4 boundaries per chunk: only the first is pooled), plus unmapped ring pages and unmapped slots."""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

from dspark_ir.errors import ShapeError
from dspark_ir.graph import Graph
from dspark_ir.semantics import compressor as K
from dspark_ir.types import TensorType
from goldens import config as gc
from goldens import inputs as gi
from goldens.compressor import compress_step, compressor_weights, csa_spec, hca_spec, indexer_spec
from goldens.indexer import write_index_cache
from goldens.layers import write_cmp_entries
from goldens.norm import rms_norm
from goldens.numerics import rope_half

from .helpers import bitwise

SEEDS = (0, 1, 2)
# (layer kind, input prefix, spec, state name, table name)
COMPRESSORS = {
    "csa_main": ("csa", "cmp_", csa_spec, "cmp_state", "cmp_state_block_table"),
    "csa_inner": ("csa", "idx_cmp_", indexer_spec, "idx_cmp_state", "idx_cmp_state_block_table"),
    "hca": ("hca", "cmp_", hca_spec, "cmp_state", "cmp_state_block_table"),
}


@lru_cache(maxsize=None)
def config(seq: int):
    return gc.config_by_name("tiny").with_(tp=1, seq=seq)


@lru_cache(maxsize=None)
def case(kind: str, seq: int, seed: int, regime: str):
    cfg = config(seq)
    inputs = gi.make_inputs(kind, cfg, seed, regime)
    x_normed = rms_norm(np.random.default_rng(seed).standard_normal((cfg.tokens, cfg.hidden)), inputs["norm_w"],
                        cfg.rms_eps)
    return cfg, inputs, x_normed


def run_kernels(cfg, spec, inputs, prefix, state_name, table_name, x_normed):
    """kv_score_proj → scatter_softmax_pool → finish, exactly as the layer graph chains them: (state, pooled, y)."""
    w = compressor_weights(inputs, prefix)
    kvp, scp = K.cmp_kv_score_proj(x_normed.astype(K.BF16), w["wkv"], w["wgate"])
    state, pooled = K.cmp_scatter_softmax_pool(kvp, scp, w["ape"], inputs[state_name], inputs[table_name],
                                               inputs["positions"], ratio=spec.ratio, head_dim=spec.head_dim,
                                               overlap=spec.overlap, block_size=cfg.block_size, seq=cfg.seq)
    cos, sin = K.rope_gather_rows(inputs["rope_cos"], inputs["rope_sin"], inputs["positions"], at="boundary",
                                  seq=cfg.seq, ratio=spec.ratio)
    cos_il, sin_signed = K.rope_interleave(cos, sin)
    return state, pooled, (w, cos_il, sin_signed)


@pytest.mark.parametrize("regime", gi.ATTENTION_REGIMES)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("seq", [4, 8])
@pytest.mark.parametrize("which", list(COMPRESSORS))
def test_compressor_step_is_bitwise_golden(which, seq, seed, regime):
    kind, prefix, spec_fn, state_name, table_name = COMPRESSORS[which]
    cfg, inputs, x_normed = case(kind, seq, seed, regime)
    spec = spec_fn(cfg)
    want_state, entries = compress_step(cfg, spec, x_normed, inputs["positions"], compressor_weights(inputs, prefix),
                                        inputs[state_name], inputs[table_name], inputs["rope_cos"],
                                        inputs["rope_sin"])
    state, pooled, (w, cos_il, sin_signed) = run_kernels(cfg, spec, inputs, prefix, state_name, table_name,
                                                         x_normed)
    assert bitwise(state, want_state)
    assert {e.token // cfg.seq for e in entries} == {b for b in range(cfg.batch) if np.any(pooled[b])}
    if which == "csa_inner":
        y = K.cmp_rmsnorm_rope(pooled, w["norm_w"], cos_il, sin_signed, eps=cfg.rms_eps)
        for e in entries:
            assert bitwise(y[e.token // cfg.seq], e.y)
        k = K.cmp_kv_hadamard(y, inputs["idx_hadamard"])
        cache, scale = K.idx_kv_cache_write(k, inputs["idx_kv_cache"], inputs["idx_kv_scale"],
                                            inputs["idx_slot_mapping"], inputs["positions"], ratio=spec.ratio,
                                            seq=cfg.seq)
        want_cache, want_scale = write_index_cache(inputs["idx_kv_cache"], inputs["idx_kv_scale"], entries,
                                                   inputs["idx_slot_mapping"], inputs["idx_hadamard"])
        assert bitwise(cache, want_cache) and bitwise(scale, want_scale)
        return
    cmp_kv = K.cmp_rmsnorm_rope_cache_write(pooled, w["norm_w"], cos_il, sin_signed, inputs["cmp_kv"].astype(K.BF16),
                                            inputs["cmp_slot_mapping"], inputs["positions"], ratio=spec.ratio,
                                            seq=cfg.seq, eps=cfg.rms_eps)
    assert cmp_kv.dtype == K.BF16
    assert bitwise(cmp_kv, write_cmp_entries(inputs["cmp_kv"], entries, inputs["cmp_slot_mapping"]))


def test_the_regimes_pool_entries():
    """Non-vacuity of the sweep above: pooling happens, including entry 0 (no previous window) and ring reuse."""
    cfg, inputs, _ = case("csa", 4, 0, "empty_cmp")
    assert np.all(inputs["positions"].reshape(-1, cfg.seq)[:, 0] == 0)  # entry 0 at pos 3: previous rows missing
    _, inputs, _ = case("csa", 4, 0, "long_cache")
    assert inputs["positions"].min() >= cfg.csa_ratio * 2 * cfg.block_size  # far beyond the ring: rows are reused


@pytest.mark.parametrize("seed", SEEDS)
def test_second_boundary_in_a_chunk_is_not_pooled(seed):
    """S = 8, r = 4: every chunk closes two windows; only the first entry is pooled and written (dsv4-math §4)."""
    cfg, inputs, x_normed = case("csa", 8, seed, "short_cache")
    spec = csa_spec(cfg)
    _, pooled, (w, cos_il, sin_signed) = run_kernels(cfg, spec, inputs, "cmp_", "cmp_state",
                                                     "cmp_state_block_table", x_normed)
    before = inputs["cmp_kv"].astype(K.BF16)
    after = K.cmp_rmsnorm_rope_cache_write(pooled, w["norm_w"], cos_il, sin_signed, before,
                                           inputs["cmp_slot_mapping"], inputs["positions"], ratio=4, seq=8)
    slots = inputs["cmp_slot_mapping"].reshape(-1, 8)
    for b in range(cfg.batch):
        mapped = slots[b][slots[b] >= 0]
        assert len(mapped) == 2
        assert not bitwise(after[mapped[0]], before[mapped[0]])
        assert bitwise(after[mapped[1]], before[mapped[1]])


@pytest.mark.parametrize("which", list(COMPRESSORS))
def test_unmapped_ring_page_and_unmapped_slot(which):
    """An unmapped state page reads kv 0 / score −inf and is not written; a slot −1 is skipped."""
    kind, prefix, spec_fn, state_name, table_name = COMPRESSORS[which]
    cfg, inputs, x_normed = case(kind, 4, 1, "default")
    inputs = dict(inputs)
    table = inputs[table_name].copy()
    table[:, 0] = -1
    inputs[table_name] = table
    slot_name = "idx_slot_mapping" if which == "csa_inner" else "cmp_slot_mapping"
    slots = inputs[slot_name].copy()
    slots[: cfg.seq] = -1
    inputs[slot_name] = slots
    spec = spec_fn(cfg)
    want_state, entries = compress_step(cfg, spec, x_normed, inputs["positions"], compressor_weights(inputs, prefix),
                                        inputs[state_name], table, inputs["rope_cos"], inputs["rope_sin"])
    state, pooled, (w, cos_il, sin_signed) = run_kernels(cfg, spec, inputs, prefix, state_name, table_name,
                                                         x_normed)
    assert bitwise(state, want_state)
    if which != "csa_inner":
        got = K.cmp_rmsnorm_rope_cache_write(pooled, w["norm_w"], cos_il, sin_signed, inputs["cmp_kv"],
                                             slots, inputs["positions"], ratio=spec.ratio, seq=cfg.seq)
        assert bitwise(got, write_cmp_entries(inputs["cmp_kv"], entries, slots))


@pytest.mark.parametrize("at", ["first", "boundary"])
def test_request_rope_rows(at):
    cfg, inputs, _ = case("csa", 4, 2, "default")
    first = inputs["positions"].reshape(-1, cfg.seq)[:, 0]
    pos = first if at == "first" else first - first % cfg.csa_ratio
    cos, sin = K.rope_gather_rows(inputs["rope_cos"], inputs["rope_sin"], inputs["positions"], at=at, seq=cfg.seq,
                                  ratio=cfg.csa_ratio)
    assert bitwise(cos, rope_half(inputs["rope_cos"], pos)) and bitwise(sin, rope_half(inputs["rope_sin"], pos))
    cos_il, sin_signed = K.rope_interleave(cos, sin)
    assert bitwise(cos_il[:, 0::2], cos) and bitwise(cos_il[:, 1::2], cos)
    assert bitwise(sin_signed[:, 0::2], -np.asarray(sin, np.float32)) and bitwise(sin_signed[:, 1::2], sin)


def _graph(params: dict[str, tuple[str, list]]) -> tuple[Graph, dict]:
    g = Graph("t", {"T": 16, "B": 4})
    return g, {name: g.add_param(name, TensorType.of(dt, shape)) for name, (dt, shape) in params.items()}


def test_shape_rules_reject_mismatches():
    g, p = _graph({"kv": ("f32", ["T", 128]), "sc": ("f32", ["T", 128]), "ape": ("f32", [4, 128]),
                   "state": ("f32", [64, 256]), "table": ("i32", ["B", 2]), "pos": ("i32", ["T"]),
                   "bad_state": ("f32", [64, 128])})
    attrs = dict(ratio=4, head_dim=64, overlap=True, block_size=8, seq=4)
    node = g.add_op("cmp_scatter_softmax_pool", [p["kv"], p["sc"], p["ape"], p["state"], p["table"], p["pos"]],
                    attrs, names="cmp.scatter_softmax_pool")
    assert [str(v.type) for v in node.results] == ["f32[64,256]", "f32[B,64]"]
    with pytest.raises(ShapeError, match="state width"):
        g.add_op("cmp_scatter_softmax_pool", [p["kv"], p["sc"], p["ape"], p["bad_state"], p["table"], p["pos"]],
                 attrs, names="x")
    with pytest.raises(ShapeError, match="OUT = 64"):
        g.add_op("cmp_scatter_softmax_pool", [p["kv"], p["sc"], p["ape"], p["state"], p["table"], p["pos"]],
                 dict(attrs, overlap=False), names="y")

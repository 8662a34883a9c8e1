"""Every tiny layer golden on 3 seeds × regimes; input contract; write locality (goldens/layers.py, inputs.py)."""
from __future__ import annotations

import numpy as np
import pytest

from goldens.compressor import csa_spec, pooling_tokens
from goldens.inputs import (
    ATTENTION_KINDS,
    KINDS,
    input_specs,
    make_inputs,
    make_rank_inputs,
    output_specs,
    regimes_for,
    start_ranges,
    typed_inputs,
    typed_outputs,
)
from goldens.layers import LAYERS, decode_csa, decode_hca, run_layer
from goldens.numerics import rb

SEEDS = (0, 1, 2)
CASES = [(kind, regime, seed) for kind in KINDS for regime in regimes_for(kind) for seed in SEEDS]
STORAGE = {"bf16": np.float32, "f32": np.float32, "i8": np.int8, "i32": np.int32}


@pytest.mark.parametrize("kind,regime,seed", CASES)
def test_layer_outputs_are_finite_with_the_right_shapes(tiny, kind, regime, seed):
    out = run_layer(kind, tiny, make_inputs(kind, tiny, seed, regime))
    specs = output_specs(kind, tiny)
    assert set(out) == set(specs)
    for name, (dtype, shape) in specs.items():
        assert out[name].shape == shape and out[name].dtype == STORAGE[dtype], name
        assert np.all(np.isfinite(out[name])), name


@pytest.mark.parametrize("kind", KINDS)
def test_inputs_follow_their_specs(tiny, kind):
    inputs = make_inputs(kind, tiny, 0)
    specs = input_specs(kind, tiny)
    assert set(inputs) == set(specs)
    for name, (dtype, shape) in specs.items():
        assert inputs[name].shape == shape and inputs[name].dtype == STORAGE[dtype], name
        if dtype == "bf16":
            np.testing.assert_array_equal(inputs[name], rb(inputs[name]), err_msg=name)
    assert all(a.dtype.name == "bfloat16" for n, a in typed_inputs(kind, tiny, inputs).items()
               if specs[n][0] == "bf16")


@pytest.mark.parametrize("kind", KINDS)
def test_rank_inputs_follow_the_shard_specs(tiny, kind):
    specs = input_specs(kind, tiny, rank_local=True)
    for inputs in make_rank_inputs(kind, tiny, 0):
        assert {n: a.shape for n, a in inputs.items()} == {n: s for n, (_, s) in specs.items()}


@pytest.mark.parametrize("kind", ["csa", "moe_hash"])
def test_flash_specs_build_without_data(flash, kind):
    specs = input_specs(kind, flash)
    if kind == "csa":
        assert specs["wo_b"] == ("i8", (4096, 8192)) and specs["kv_cache"] == ("bf16", (16 * 8192, 512))
        assert specs["cmp_state"] == ("f32", (16 * 64, 2048)) and specs["idx_kv_cache"][1] == (16 * 2048, 128)
    else:
        assert specs["w1"] == ("i8", (256, 2048, 4096)) and specs["tid2eid"] == ("i32", (129280, 6))
    assert output_specs(kind, flash)["x_out"] == ("f32", (128, 4, 4096))


def test_inputs_are_deterministic_per_seed(tiny):
    a, b, c = (make_inputs("csa", tiny, s) for s in (7, 7, 8))
    assert all(np.array_equal(a[n], b[n]) for n in a)
    assert not np.array_equal(a["x_hc"], c["x_hc"]) and not np.array_equal(a["wkv"], c["wkv"])


def test_make_inputs_is_rank_zero_with_full_weights(tiny):
    single = make_inputs("hca", tiny, 3)
    rank0 = make_rank_inputs("hca", tiny, 3)[0]
    for name, value in rank0.items():
        if name in ("wo_a", "wo_b"):
            continue
        np.testing.assert_array_equal(single[name], value, err_msg=name)


@pytest.mark.parametrize("regime", ["empty_cmp", "short_cache", "long_cache", "window_boundary", "topk_boundary",
                                    "cmp_boundary"])
def test_regime_positions(tiny, regime):
    lo, hi = start_ranges(tiny)[regime]
    for seed in SEEDS:
        pos = make_inputs("swa", tiny, seed, regime)["positions"].reshape(tiny.batch, tiny.seq)
        assert np.all((pos[:, 0] >= lo) & (pos[:, 0] <= hi))
        visible = (pos + 1) // tiny.csa_ratio
        expect = {
            "empty_cmp": lambda: np.all(pos[:, 0] == 0),
            "short_cache": lambda: np.all(visible < tiny.idx_topk),
            "long_cache": lambda: np.all(visible > tiny.idx_topk),
            "window_boundary": lambda: np.all(np.any(pos == tiny.window - 1, axis=1) & np.any(pos == tiny.window, 1)),
            "topk_boundary": lambda: np.all(np.any(visible == tiny.idx_topk, axis=1)),
            "cmp_boundary": lambda: np.all(np.any((pos + 1) % tiny.hca_ratio == 0, axis=1)),
        }[regime]
        assert expect()


@pytest.mark.parametrize("kind", ATTENTION_KINDS)
def test_kv_cache_changes_only_at_the_slot_mapping(tiny, kind):
    inputs = make_inputs(kind, tiny, 4)
    trace = {}
    out = LAYERS[kind](tiny, inputs, trace)
    slots = inputs["swa_slot_mapping"]
    changed = np.flatnonzero(np.any(out["kv_cache"] != inputs["kv_cache"], axis=1))
    assert set(changed) <= set(slots.tolist())
    np.testing.assert_array_equal(out["kv_cache"][slots], trace["qkv.kv"])


@pytest.mark.parametrize("kind", ["csa", "hca"])
def test_cmp_kv_changes_only_at_pooled_slots(tiny, kind):
    for seed in SEEDS:
        inputs = make_inputs(kind, tiny, seed)
        out = run_layer(kind, tiny, inputs)
        slots = inputs["cmp_slot_mapping"]
        changed = set(np.flatnonzero(np.any(out["cmp_kv"] != inputs["cmp_kv"], axis=1)).tolist())
        assert changed <= set(slots[slots >= 0].tolist())


def test_second_ratio4_boundary_writes_state_but_is_not_pooled(tiny):
    cfg = tiny.with_(seq=8)
    inputs = make_inputs("csa", cfg, 5, "short_cache")
    out = decode_csa(cfg, inputs)
    slots = inputs["cmp_slot_mapping"]
    pooled = {t for t, _ in pooling_tokens(cfg, csa_spec(cfg), inputs["positions"])}
    boundaries = np.flatnonzero(slots >= 0)
    second = [t for t in boundaries if t not in pooled]
    assert len(pooled) == cfg.batch and len(second) == cfg.batch
    for t in pooled:
        assert not np.array_equal(out["cmp_kv"][slots[t]], inputs["cmp_kv"][slots[t]])
    for t in second:
        np.testing.assert_array_equal(out["cmp_kv"][slots[t]], inputs["cmp_kv"][slots[t]])
        np.testing.assert_array_equal(out["idx_kv_cache"][inputs["idx_slot_mapping"][t]],
                                      inputs["idx_kv_cache"][inputs["idx_slot_mapping"][t]])


def test_first_csa_entry_is_the_plain_softmax_pool_of_the_state(tiny):
    inputs = make_inputs("csa", tiny, 6, "empty_cmp")
    trace = {}
    out = decode_csa(tiny, inputs, trace)
    hd, width = tiny.head_dim, 2 * tiny.head_dim
    for b in range(tiny.batch):
        t = b * tiny.seq + 3
        rows = [_ring_row(tiny, inputs["cmp_state_block_table"][b], p) for p in range(4)]
        state = out["cmp_state"][rows]
        kv, score = state[:, hd:width], state[:, width + hd :]
        weights = np.exp(score - score.max(0)) / np.exp(score - score.max(0)).sum(0)
        pooled = (kv * weights).sum(0)
        y = pooled / np.sqrt(np.mean(pooled**2) + tiny.rms_eps) * inputs["cmp_norm_w"]
        np.testing.assert_allclose(out["cmp_kv"][inputs["cmp_slot_mapping"][t]], rb(y), rtol=1 / 128, atol=1e-4)


def _ring_row(cfg, table_row, pos):
    bs = cfg.block_size
    return table_row[(pos // bs) % len(table_row)] * bs + pos % bs


def test_state_rows_hold_the_projections(tiny):
    inputs = make_inputs("hca", tiny, 7)
    trace = {}
    out = decode_hca(tiny, inputs, trace)
    x = trace["norm.x_normed"].astype(np.float64)
    kvp = x @ inputs["cmp_wkv"].T.astype(np.float64)
    scp = x @ inputs["cmp_wgate"].T.astype(np.float64) + inputs["cmp_ape"][inputs["positions"] % tiny.hca_ratio]
    for t, pos in enumerate(inputs["positions"]):
        row = _ring_row(tiny, inputs["cmp_state_block_table"][t // tiny.seq], pos)
        np.testing.assert_allclose(out["cmp_state"][row], np.concatenate([kvp[t], scp[t]]), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_goldens_do_not_mutate_inputs(tiny, kind):
    inputs = make_inputs(kind, tiny, 9)
    before = {name: a.copy() for name, a in inputs.items()}
    out = typed_outputs(kind, tiny, run_layer(kind, tiny, inputs))
    for name, a in before.items():
        np.testing.assert_array_equal(inputs[name], a, err_msg=name)
    specs = output_specs(kind, tiny)
    assert all(out[n].dtype.name == "bfloat16" for n in out if specs[n][0] == "bf16")


def test_tiny_layer_is_fast(tiny):
    import time
    inputs = make_inputs("csa", tiny, 0, "long_cache")
    start = time.perf_counter()
    decode_csa(tiny, inputs)
    assert time.perf_counter() - start < 2.0

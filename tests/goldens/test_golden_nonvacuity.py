"""Non-vacuity: one changed weight element moves x_out beyond the hc_post tolerance (dsv4-math §2.2: 1e-3)."""
from __future__ import annotations

import numpy as np
import pytest

from goldens.hc import hc_pre
from goldens.inputs import make_inputs
from goldens.layers import run_layer
from goldens.moe import gate_from_inputs
from goldens.numerics import rb


def perturb(inputs, name, index, delta):
    out = dict(inputs)
    value = inputs[name].copy()
    if value.dtype == np.int8:
        value[index] = np.int8(-127 if value[index] > 0 else 127)
    else:
        value[index] = rb(value[index] + delta) if name not in ("hc_fn", "gate_w") else value[index] + delta
    out[name] = value
    return out


def moved_outputs(kind, cfg, inputs, name, index, delta=1.0) -> set[str]:
    """Outputs that differ beyond tolerance: 1e-3 for floats, more than 1 LSB for int8 caches."""
    base = run_layer(kind, cfg, inputs)
    changed = run_layer(kind, cfg, perturb(inputs, name, index, delta))
    moved = set()
    for out, value in base.items():
        if value.dtype == np.int8:
            far = np.abs(changed[out].astype(np.int32) - value).max() > 1
        else:
            far = not np.allclose(changed[out], value, atol=1e-3, rtol=1e-3)
        if far:
            moved.add(out)
    return moved


def moved(kind, cfg, inputs, name, index, delta=1.0) -> bool:
    return "x_out" in moved_outputs(kind, cfg, inputs, name, index, delta)


@pytest.mark.parametrize("kind,regime,name,index", [
    ("swa", "default", "wkv", (3, 5)),
    ("swa", "default", "wkv", (3, 60)),
    ("swa", "default", "wq_a", (1, 2)),
    ("swa", "default", "wq_b", (4, 70)),
    ("swa", "default", "wo_a", (1, 3, 5)),
    ("swa", "default", "wo_b", (5, 7)),
    ("swa", "default", "hc_fn", (10, 100)),
    ("csa", "long_cache", "wkv", (0, 0)),
    ("csa", "long_cache", "wo_b", (17, 200)),
    ("csa", "empty_cmp", "cmp_wkv", (70, 9)),
    ("csa", "long_cache", "idx_weights_proj", (11, 2)),
    ("csa", "long_cache", "idx_hadamard", (3, 20)),
    ("csa", "long_cache", "idx_wq_b", (6, 40)),
    ("hca", "default", "cmp_wgate", (7, 20)),
    ("hca", "default", "cmp_wkv", (7, 20)),
])
def test_attention_weight_moves_x_out(tiny, kind, regime, name, index):
    assert moved(kind, tiny, make_inputs(kind, tiny, 0, regime), name, index)


@pytest.mark.parametrize("kind,name,index,output", [
    ("csa", "idx_cmp_wkv", (40, 9), "idx_kv_cache"),
    ("csa", "idx_cmp_norm_w", (4,), "idx_kv_cache"),
    ("csa", "idx_cmp_ape", (1, 40), "idx_cmp_state"),
    ("csa", "cmp_ape", (2, 5), "cmp_state"),
    ("csa", "cmp_norm_w", (6,), "cmp_kv"),
    ("hca", "cmp_norm_w", (6,), "cmp_kv"),
])
def test_compressor_weight_moves_its_cache(tiny, kind, name, index, output):
    inputs = make_inputs(kind, tiny, 0, "empty_cmp" if kind == "csa" else "window_boundary")
    assert output in moved_outputs(kind, tiny, inputs, name, index)


def test_indexer_weights_are_dead_under_bypass_conditions(tiny):
    inputs = make_inputs("csa", tiny, 0, "short_cache")
    assert not moved("csa", tiny, inputs, "idx_weights_proj", (11, 2))


@pytest.mark.parametrize("name", ["w1", "w2", "w3"])
def test_routed_expert_weight_moves_x_out(tiny, name):
    inputs = make_inputs("moe", tiny, 0)
    x_mixed, _, _ = hc_pre(tiny, inputs["x_hc"], inputs["hc_fn"], inputs["hc_scale"], inputs["hc_base"])
    expert = int(gate_from_inputs(tiny, x_mixed, inputs).idx[0, 0])
    index = (expert, 3, 5)
    assert moved("moe", tiny, inputs, name, index)
    unused = sorted(set(range(tiny.n_experts)) - set(gate_from_inputs(tiny, x_mixed, inputs).idx.ravel().tolist()))
    if unused:
        assert not moved("moe", tiny, inputs, name, (unused[0], 3, 5))


@pytest.mark.parametrize("kind,name,index", [
    ("moe", "sh_w2", (9, 4)), ("moe", "gate_w", (2, 7)), ("moe", "norm_w", (12,)), ("moe_hash", "sh_w1", (0, 0)),
])
def test_moe_weight_moves_x_out(tiny, kind, name, index):
    assert moved(kind, tiny, make_inputs(kind, tiny, 1), name, index, delta=2.0)

"""fuse-mix-x-rms-norm on the layers: bitwise on tiny decode and prefill attention layers (TP1, TP4; 3 seeds) and
within the golden tolerance; the fused task reads x_hc, the pre gate and the norm weight, keeps the norm's grid and
feeds every reader of the old norm; it explains why it leaves the MoE layer's mix alone; at flash TP4 it is one
task of ceil(T / T_TILE) = 16 blocks, the captured code's grid.
Before/after cases: tests/passes/fuse-mix-x-rms-norm/."""
from __future__ import annotations

import pytest

from .layer_support import SEEDS, flash_opt, golden_mismatches, optimise, skips, statuses, tiny

PASS, FUSED, MIX, NORM = "fuse-mix-x-rms-norm", "attn.mix_x_rms_norm", "hc.mix_x", "attn.rms_norm"


def _check_fused(g) -> None:
    assert MIX not in g.nodes and NORM not in g.nodes
    fused = g.nodes[FUSED]
    producers = [v.producer.name if v.producer else v.name for v in fused.operands]
    assert producers == ["x_hc", "hc.split_pre_post", "norm_w"]
    assert "attn.late_dep" in {u.name for u in g.users(fused.result)}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("layer, tp", [("decode-swa", 1), ("decode-swa", 4), ("decode-csa", 4), ("decode-hca", 1),
                                       ("decode-hca", 4), ("prefill-swa", 1)])
def test_bitwise_on_tiny_layers_and_within_the_golden_tolerance(layer, tp, seed):
    before = tiny(layer, tp)
    norm = before.nodes[NORM]
    result = optimise(before, PASS, seed)      # the bitwise contract is checked
    assert statuses(result) == {PASS: "changed"}
    _check_fused(result.graph)
    fused = result.graph.nodes[FUSED]
    for key in ("tile", "blocks", "tail", "aer"):
        assert fused.attrs.get(key) == norm.attrs.get(key), key
    assert not golden_mismatches(result.graph, seed)


def test_moe_mix_feeds_its_own_norm_op_and_is_left_alone():
    result = optimise(tiny("moe", 1), PASS, numerics=False)
    assert statuses(result) == {PASS: "no-op"}
    assert "not by an rmsnorm" in skips(result, PASS)[MIX]


def test_skips_when_x_mixed_is_returned():
    g = tiny("decode-hca", 1).clone()
    g.set_returns(g.returns + [g.values[MIX]])
    result = optimise(g, PASS, numerics=False)
    assert statuses(result) == {PASS: "no-op"}
    assert "returned by the graph" in skips(result, PASS)[MIX]


def test_fires_at_flash_tp4_on_the_captured_grid(tmp_path):
    g = flash_opt("decode-hca", tmp_path)
    _check_fused(g)
    assert g.nodes[FUSED].attrs["blocks"].value(g.env) == 16
    assert str(g.nodes[FUSED].result.type) == "bf16[T,4096]"

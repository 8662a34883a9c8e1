"""split-writeback-bias on the layers: bitwise on tiny decode-swa (3 seeds, T = 16 (the writeback over the TP group's
kv rows) and a ragged T = 100) and within the golden tolerance; the clamped writeback blocks commit every slot; a
no-op on HCA/CSA (separate kv_cache_writeback) and MoE; fires on decode-swa at flash TP4. Before/after cases:
tests/passes/split-writeback-bias/."""
from __future__ import annotations

import networkx as nx
import numpy as np
import pytest

import runner
from dspark_ir import layers, parse_graph
from dspark_ir.interp import run
from dspark_ir.semantics.attention import swa_cache_writeback
from passes import PassContext, run_pipeline

from .layer_support import SEEDS, flash_opt, golden_mismatches, optimise, skips, statuses, tiny

FUSED, WRITEBACK, BIAS = "swa.swa_cache_insert_valid_bias", "swa.swa_cache_writeback", "swa.swa_valid_bias"


def _check_split(g, tile: int, blocks: int, clamped: bool, bias_tile: int, bias_blocks: int) -> None:
    """The fused task is gone; writeback ∥ bias with the given tiles; the consumers read the right halves."""
    env = g.env
    assert FUSED not in g.nodes
    wb, bias = g.nodes[WRITEBACK], g.nodes[BIAS]
    assert (wb.attrs["tile"], wb.attrs["blocks"].value(env), wb.attrs.get("tail") == "clamp") == \
        ((tile,), blocks, clamped)
    assert (bias.attrs["tile"], bias.attrs["blocks"].value(env)) == ((bias_tile,), bias_blocks)
    slots = "swa_slot_mapping" if g.attributes["tp"] == 1 else "cp.slot_mapping_own_rows"   # TP > 1: the group's
    assert [v.name for v in wb.operands] == ["qkv.kv_rms_norm_rope", "kv_cache", slots]
    assert [v.name for v in bias.operands] == ["swa_lens"]
    nxg = g.to_networkx()
    assert not nx.has_path(nxg, WRITEBACK, BIAS) and not nx.has_path(nxg, BIAS, WRITEBACK)
    assert g.nodes["swa.swa_gather_kv"].operands[0] is wb.result          # the gather still waits for the writeback
    assert g.nodes["swa.qk_pv"].operands[2] is bias.result
    assert wb.result in g.returns                                         # the updated cache is the layer output


@pytest.mark.parametrize("seed", SEEDS)
def test_bitwise_on_tiny_swa_and_within_the_golden_tolerance(seed):
    result = optimise(tiny("decode-swa"), "split-writeback-bias", seed)   # T = 16; the contract is checked
    assert statuses(result) == {"split-writeback-bias": "changed"}
    _check_split(result.graph, 8, 4, False, 4, 4)        # tiny TP2: the group's 32 kv rows in 8-row writeback tiles
    assert not golden_mismatches(result.graph, seed)


@pytest.mark.parametrize("seed", SEEDS)
def test_ragged_t100_commits_every_slot(seed):
    """T = 100 (TP1, 25 requests of 4): ceil(100/8) = 13 writeback blocks, the last one 4 rows."""
    g = tiny("decode-swa", tp=1, batch=25)
    result = optimise(g, "split-writeback-bias", seed)
    opt = result.graph
    _check_split(opt, 8, 13, True, 4, 25)
    assert not golden_mismatches(opt, seed)
    # Execute the writeback block by block as the attributes say (rows [b·tile, min((b+1)·tile, T))) with the
    # reference, and check the result is the whole scatter: the clamped tail block commits rows 96..99.
    inputs = runner.layer_inputs(opt, seed)
    values = run(opt, inputs, keep=True)
    kv, slots, out = values["qkv.kv_rms_norm_rope"], inputs["swa_slot_mapping"], values[WRITEBACK]
    wb = opt.nodes[WRITEBACK]
    tile, blocks, rows = wb.attrs["tile"][0], wb.attrs["blocks"].value(opt.env), opt.env["T"]
    assert np.array_equal(_blockwise(kv, inputs["kv_cache"], slots, tile, blocks), out)
    last = {int(s): t for t, s in enumerate(slots) if s >= 0}           # later rows win
    tail = [t for t in range(tile * (rows // tile), rows) if slots[t] >= 0 and last[int(slots[t])] == t]
    assert tail and all(np.array_equal(out[slots[t]], kv[t]) for t in tail)
    # non-vacuous: floor division (rows // tile blocks) would leave those slots unwritten
    assert not np.array_equal(_blockwise(kv, inputs["kv_cache"], slots, tile, rows // tile), out)


def _blockwise(kv, cache, slots, tile: int, blocks: int):
    for b in range(blocks):
        lo, hi = b * tile, min((b + 1) * tile, len(slots))
        cache = swa_cache_writeback(kv[lo:hi], cache, slots[lo:hi])
    return cache


@pytest.mark.parametrize("layer", ["decode-hca", "decode-csa"])
def test_no_op_on_hca_and_csa(layer):
    result = optimise(tiny(layer), "split-writeback-bias", numerics=False)
    assert statuses(result) == {"split-writeback-bias": "no-op"}
    block = layer.split("-")[1]
    assert skips(result, "split-writeback-bias") == {
        f"{block}.{block}_cache_writeback": "already a separate cache writeback task (no fused valid bias to split)"}


def test_no_op_on_moe():
    assert statuses(optimise(tiny("moe"), "split-writeback-bias", numerics=False)) == \
        {"split-writeback-bias": "no-op"}


def test_fires_on_swa_at_flash_tp4(tmp_path):
    g = flash_opt("decode-swa", tmp_path)
    _check_split(g, 32, 16, False, 8, 16)     # the group's 512 kv rows: 16 blocks of 32 (the seed's); T/8 = 16


@pytest.mark.parametrize("layer", ["decode-hca", "decode-csa"])
def test_flash_hca_csa_keep_their_writeback(layer, tmp_path):
    before = layers.build(layer, config="flash", tp=4)
    after = flash_opt(layer, tmp_path)
    assert not after.ops("swa_cache_writeback") and not after.ops("swa_valid_bias")
    for node in before.ops("kv_cache_writeback"):
        assert after.nodes[node.name].attrs == node.attrs


def test_option_and_refusals():
    fused = ("%s.fused, %s.fused.bias = swa_cache_insert_valid_bias(%kv, %kv_cache, %slot, %lens) "
             "{window = 16, tile = [8]} : bf16[64,64], f32[T,16]")
    text = f"""
graph @sym<T>(%kv: bf16[T,64], %kv_cache: bf16[64,64] inout, %slot: i32[T], %lens: i32[T]) {{
  {fused}
  return %s.fused.bias, %s.fused
}}"""
    ctx = PassContext(use_env=False, check_numerics=False)
    result = run_pipeline(parse_graph(text), "split-writeback-bias", ctx=ctx)
    assert not result.changed and "not bound" in skips(result, "split-writeback-bias")["s.fused"]
    bound = text.replace("@sym<T>", "@sym<T = 24>")
    result = run_pipeline(parse_graph(bound), "split-writeback-bias{tile_rows=16}",
                          ctx=ctx.replace(check_numerics=True))
    wb = result.graph.nodes["s.swa_cache_writeback"]
    assert (wb.attrs["tile"], str(wb.attrs["blocks"]), wb.attrs["tail"]) == ((16,), "ceil(T/16)", "clamp")
    assert str(result.graph.nodes["s.swa_valid_bias"].attrs["blocks"]) == "T//8"

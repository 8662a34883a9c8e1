"""dequant-workers on the layers: bitwise on tiny (3 seeds, every attention layer) and still within the golden
tolerance; a no-op on MoE; at flash TP4 the q side's dequant + RMSNorm + RoPE goes from 16 blocks to 48 cyclic
workers. Before/after cases: tests/passes/dequant-workers/."""
from __future__ import annotations

import pytest

from dspark_ir import layers, parse_graph
from passes import get_pass

from .layer_support import ATTENTION, SEEDS, flash_opt, golden_mismatches, optimise, statuses, tiny
from .support import HERE

DEQUANT = "qkv.qproj_dequant_rms_nope_rope"


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("layer", ATTENTION)
def test_bitwise_on_tiny_and_within_the_golden_tolerance(layer, seed):
    g = tiny(layer)                                          # TP2: T = 16 tokens, 2 head tiles: 4 units
    result = optimise(g, "dequant-workers", seed)            # the manager checks the bitwise contract
    assert statuses(result) == {"dequant-workers": "changed"}
    node = result.graph.nodes[DEQUANT]
    assert (node.attrs["workers"], node.attrs["blocks"].value(g.env)) == (4, 4)
    assert node.attrs["tile"] == g.nodes[DEQUANT].attrs["tile"]
    assert not golden_mismatches(result.graph, seed)


def test_no_op_on_moe():
    assert statuses(optimise(tiny("moe"), "dequant-workers", numerics=False)) == {"dequant-workers": "no-op"}


@pytest.mark.parametrize("layer", ATTENTION)
def test_fires_at_flash_tp4(layer, tmp_path):
    before = layers.build(layer, config="flash", tp=4)
    after = flash_opt(layer, tmp_path)
    was, node = before.nodes[DEQUANT], after.nodes[DEQUANT]
    assert was.attrs["blocks"].value(before.env) == 16 and "workers" not in was.attrs
    assert (node.attrs["workers"], node.attrs["blocks"].value(after.env)) == (48, 48)


def test_skip_reasons():
    case = parse_graph((HERE / "dequant-workers" / "few_units.before.dsir").read_text())
    reasons = {s.at: s.reason for s in get_pass("dequant-workers")(workers=2).match(case)}
    assert reasons == {"a.qproj_dequant_rms_nope_rope": "already 2 blocks for 4 (token, head) units (workers = 2)",
                       "b.qproj_dequant_rms_nope_rope": "already on 4 workers"}
    assert {s.reason for s in get_pass("dequant-workers")(workers=1).match(case)} == {
        "workers = 1: nothing to spread"}

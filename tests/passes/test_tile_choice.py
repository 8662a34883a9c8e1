"""tile-choice: the decode matmuls get the largest M tile the cube buffers allow (fewer weight re-reads);
bitwise on tiny (every attention layer), a no-op on MoE; at flash TP4 qr_proj 16 → 128 rows, qproj 64 → 128,
kv_proj (split 4 ways over M) 16 → 32. Before/after cases: tests/passes/tile-choice/."""
from __future__ import annotations

import pytest

from dspark_ir import layers, parse_graph
from passes import get_pass
from passes.tile_choice import traffic

from .layer_support import ATTENTION, golden_mismatches, optimise, skips, statuses, tiny
from .support import HERE


@pytest.mark.parametrize("layer", ATTENTION)
def test_bitwise_on_tiny_and_within_the_golden_tolerance(layer):
    g = tiny(layer)
    result = optimise(g, "split-m-fanout,tile-choice", 0)     # the manager checks the bitwise contract
    assert statuses(result)["tile-choice"] in ("changed", "no-op")
    for node in result.graph.nodes.values():
        if node.op == "matmul" and node.attrs.get("tile"):
            m = node.operands[0].type.shape[0].value(g.env)
            assert m % node.attrs["tile"][0] == 0, node.name
    assert not golden_mismatches(result.graph, 0)


def test_no_op_on_moe():
    result = optimise(tiny("moe"), "tile-choice", numerics=False)
    assert statuses(result) == {"tile-choice": "no-op"}


def test_fires_at_flash_tp4():
    g = layers.build("decode-swa", config="flash", tp=4)
    result = optimise(g, "split-m-fanout,tile-choice", numerics=False)
    tiles = {n: result.graph.nodes[n].attrs["tile"] for n in
             ("qkv.qr_proj_matmul", "qkv.qproj_matmul", "qkv.kv_proj_matmul")}
    assert tiles == {"qkv.qr_proj_matmul": (128, 128, 256), "qkv.qproj_matmul": (128, 512, 1024),
                     "qkv.kv_proj_matmul": (128, 128, 256)}   # the TP group's 512 rows in 4 M parts of 128
    fanned = optimise(g, "split-m-fanout", numerics=False).graph
    for name in tiles:                                     # the SPMD grid is the one split-m-fanout left
        assert result.graph.nodes[name].attrs["blocks"] == fanned.nodes[name].attrs["blocks"]


def test_modelled_traffic():
    """A once, the weight once per M tile, an atomic accumulator read+written once per K split."""
    g = layers.build("decode-swa", config="flash", tp=4)
    node = g.nodes["qkv.qr_proj_matmul"]                    # 128 x 4096 @ 4096 x 1024 bf16, atomic, k_split 2
    a, w, acc = 128 * 4096 * 2, 4096 * 1024 * 2, 2 * 2 * 128 * 1024 * 4
    assert traffic(node, 128, 4096, 1024, 2, 2, 16) == a + 8 * w + acc
    assert traffic(node, 128, 4096, 1024, 2, 2, 128) == a + w + acc


def test_case_skip_reasons():
    g = parse_graph((HERE / "tile-choice" / "no_fire.before.dsir").read_text())
    reasons = {s.at: s.reason for s in get_pass("tile-choice")().match(g)}
    assert reasons["a.full"] == "M tile 64 is already the largest that fits (M = 64, m_split = 1)"
    assert reasons["b.narrow"].startswith("M tile 64 would cut modelled traffic only 1.18x")
    assert reasons["c.untiled"] == "no (m, n, k) tile (tile = None)"


def test_max_m_tile_option_caps_the_tile():
    g = parse_graph((HERE / "tile-choice" / "decode_qkv.before.dsir").read_text())
    result = optimise(g, "tile-choice{max_m_tile=64}", numerics=False)
    assert result.graph.nodes["qkv.qr_proj_matmul"].attrs["tile"][0] == 64
    assert skips(result, "tile-choice")["qkv.qproj_matmul"].startswith("M tile 64 is already the largest")

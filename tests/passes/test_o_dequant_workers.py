"""o-dequant-workers on the layers: bitwise on tiny TP2 (3 seeds, every attention layer) and still within the golden
tolerance; the TP1 dequant (bf16 proj_b_act) and MoE are left alone; at flash TP4 the f32 O-B dequant goes from 512
blocks of [8, 512] to 48 cyclic workers over [16, 512] tiles (12 per owner, as the later decode_o_proj).
Before/after cases: tests/passes/o-dequant-workers/."""
from __future__ import annotations

import pytest

from dspark_ir import layers, parse_graph
from passes import get_pass
from passes.infra.base import Skip

from .layer_support import ATTENTION, SEEDS, flash_opt, golden_mismatches, optimise, skips, statuses, tiny
from .support import HERE

DEQUANT = "o.tp_o_b_dequant"


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("layer", ATTENTION)
def test_bitwise_on_tiny_and_within_the_golden_tolerance(layer, seed):
    g = tiny(layer)                                          # TP2: 2·T = 32 rows of one 256-wide column tile
    result = optimise(g, "o-dequant-workers", seed)          # the manager checks the bitwise contract
    assert statuses(result) == {"o-dequant-workers": "changed"}
    was, node = g.nodes[DEQUANT], result.graph.nodes[DEQUANT]
    rows = node.result.type.shape[0].value(g.env)
    assert was.attrs["blocks"].value(g.env) == rows // 8
    assert (node.attrs["workers"], node.attrs["blocks"].value(g.env)) == (rows // 16, rows // 16)
    assert list(node.attrs["tile"]) == [16, was.attrs["tile"][1]]
    assert not golden_mismatches(result.graph, seed)


def test_tp1_and_moe_left_alone():
    result = optimise(tiny("decode-hca", tp=1), "o-dequant-workers", numerics=False)
    assert statuses(result) == {"o-dequant-workers": "no-op"}
    assert set(skips(result, "o-dequant-workers").values()) == {
        "TP1 O path (proj_b_act, bf16 out): upstream keeps one block per token tile there"}
    assert statuses(optimise(tiny("moe"), "o-dequant-workers", numerics=False)) == {"o-dequant-workers": "no-op"}


def test_fires_at_flash_tp4(tmp_path):
    before = layers.build("decode-hca", config="flash", tp=4)
    after = flash_opt("decode-hca", tmp_path)
    assert before.nodes[DEQUANT].attrs["blocks"].value(before.env) == 512
    node = after.nodes[DEQUANT]
    assert (node.attrs["workers"], node.attrs["blocks"].value(after.env), list(node.attrs["tile"])) == (
        48, 48, [16, 512])


def test_skip_reasons():
    case = parse_graph((HERE / "o-dequant-workers" / "few_tiles.before.dsir").read_text())
    found = list(get_pass("o-dequant-workers")(workers=4, rows=8).match(case))
    assert {s.at: s.reason for s in found if isinstance(s, Skip)} == {
        "o.tp_o_b_dequant": "already 4 blocks for 4 tiles of [8, 512] (workers = 4)"}
    assert [s.node.name for s in found if not isinstance(s, Skip)] == ["o.second"]

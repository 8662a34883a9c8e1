"""quant-workers on the layers: bitwise on tiny TP2 (3 seeds, every attention layer) and still within the golden
tolerance; a no-op at TP1 (the TP1 path's `quant` stays one `pl.at` block) and on MoE; at flash TP4 both local O
groups' tp_o_a_quant become 24 cyclic workers over 8-row tiles. Before/after cases: tests/passes/quant-workers/."""
from __future__ import annotations

import pytest

from dspark_ir import layers, parse_graph
from passes import get_pass

from .layer_support import ATTENTION, SEEDS, flash_opt, golden_mismatches, optimise, statuses, tiny
from .support import HERE

QUANTS = ("o.tp_o_a_quant.g0", "o.tp_o_a_quant.g1")


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("layer", ATTENTION)
def test_bitwise_on_tiny_tp2_and_within_the_golden_tolerance(layer, seed):
    g = tiny(layer, tp=2)                                    # tp·T = 32 rows per local group: 4 tiles of 8
    result = optimise(g, "quant-workers", seed)              # the manager checks the bitwise contract
    assert statuses(result) == {"quant-workers": "changed"}
    groups = [n for n in result.graph.nodes.values() if n.op == "quant_rows"]
    assert groups and all(n.attrs["tile"] == (8,) and n.attrs["workers"] == 4 for n in groups)
    assert not golden_mismatches(result.graph, seed)


@pytest.mark.parametrize("layer", ["decode-swa", "moe"])
def test_no_op_at_tp1_and_on_moe(layer):
    assert statuses(optimise(tiny(layer, tp=1), "quant-workers", numerics=False)) == {"quant-workers": "no-op"}


@pytest.mark.parametrize("layer", ATTENTION)
def test_fires_at_flash_tp4(layer, tmp_path):
    before = layers.build(layer, config="flash", tp=4)
    after = flash_opt(layer, tmp_path)
    for name in QUANTS:                                     # 4·T = 512 rows: 64 tiles over 24 workers
        was, node = before.nodes[name], after.nodes[name]
        assert was.attrs["blocks"].value(before.env) == 1 and "tile" not in was.attrs
        assert (node.attrs["tile"], node.attrs["workers"], node.attrs["blocks"].value(after.env)) == ((8,), 24, 24)
        assert "tail" not in node.attrs


def test_skip_reasons():
    case = parse_graph((HERE / "quant-workers" / "no_fire.before.dsir").read_text())
    reasons = {s.at: s.reason for s in get_pass("quant-workers")().match(case)}
    assert reasons == {"a.tp_o_a_quant.g0": "8 rows are one tile of 8",
                       "b.tp_o_a_quant.g0": "already tiled over rows"}

"""kv-score-token-groups on the layers: bitwise on tiny HCA and CSA at TP1/2/4 (3 seeds) and still within the
golden tolerance; explains itself where it does not fire; at flash the compressors' grids halve.
Before/after cases: tests/passes/kv-score-token-groups/."""
from __future__ import annotations

import pytest

from dspark_ir import layers, parse_graph
from passes import get_pass

from .layer_support import SEEDS, golden_mismatches, optimise, skips, statuses, tiny
from .support import HERE

PASS = "kv-score-token-groups"
SITES = {"decode-hca": ("cmp.kv_score_proj",), "decode-csa": ("cmp.kv_score_proj", "icmp.kv_score_proj")}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("tp", (1, 2, 4))
@pytest.mark.parametrize("layer", sorted(SITES))
def test_bitwise_on_tiny_and_within_the_golden_tolerance(layer, tp, seed):
    g = tiny(layer, tp)
    result = optimise(g, PASS, seed)                         # the manager checks the bitwise contract
    assert statuses(result) == {PASS: "changed"}
    for name in SITES[layer]:
        was, node = g.nodes[name], result.graph.nodes[name]
        tiles = -(-g.env["T"] // was.attrs["tile"][0])
        assert node.attrs["token_tiles"] == 2
        assert node.attrs["blocks"].value(g.env) == was.attrs["blocks"].value(g.env) // tiles * -(-tiles // 2)
    assert not golden_mismatches(result.graph, seed)


@pytest.mark.parametrize("layer", ("decode-swa", "moe"))
def test_no_op_without_a_compressor(layer):
    assert statuses(optimise(tiny(layer), PASS, numerics=False)) == {PASS: "no-op"}


@pytest.mark.parametrize(("layer", "tp", "blocks"), [("decode-hca", 4, {"cmp.kv_score_proj": (64, 32)}),
                                                     ("decode-hca", 1, {"cmp.kv_score_proj": (256, 128)}),
                                                     ("decode-csa", 4, {"cmp.kv_score_proj": (128, 64),
                                                                        "icmp.kv_score_proj": (64, 32)})])
def test_flash_grids(layer, tp, blocks):
    g = layers.build(layer, config="flash", tp=tp)
    after = optimise(g, PASS, numerics=False).graph
    for name, (was, now) in blocks.items():
        assert [x.nodes[name].attrs["blocks"].value(g.env) for x in (g, after)] == [was, now]


def test_skip_reasons():
    case = parse_graph((HERE / PASS / "no_fire.before.dsir").read_text())
    reasons = {s.at: s.reason for s in get_pass(PASS)().match(case)}
    assert reasons == {"a.kv_score_proj": "T = 4 is one token tile of 4: no weight tile is fetched twice",
                       "b.kv_score_proj": "already 2 token tiles per block",
                       "c.kv_score_proj": "no [m, n, k] tile (the grid is not one block per token tile and output "
                                          "tile)"}
    assert {s.reason for s in get_pass(PASS)(token_tiles=1).match(case)} == {"token_tiles = 1: nothing to group"}
    assert skips(optimise(case, PASS, numerics=False), PASS) == reasons


def test_explains_itself_on_swa():
    result = optimise(tiny("decode-swa"), PASS, numerics=False)
    assert skips(result, PASS) == {"swa.qk_pv": "SWA attends over the raw window only: the layer has no compressor"}

"""pool-fanout on the layers: bitwise on tiny (3 seeds, the two compressor layers) and still within the golden
tolerance; a no-op on decode-swa and MoE (no compressor); at flash TP4 the HCA pool and both CSA pools become
ceil(B/2) = 8 blocks of 2 requests. Before/after cases: tests/passes/pool-fanout/."""
from __future__ import annotations

import pytest

from dspark_ir import layers, parse_graph
from passes import get_pass

from .layer_support import SEEDS, flash_opt, golden_mismatches, optimise, statuses, tiny
from .support import HERE

POOLS = {"decode-hca": ("cmp.scatter_softmax_pool",),
         "decode-csa": ("cmp.scatter_softmax_pool", "icmp.scatter_softmax_pool")}


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("layer", sorted(POOLS))
def test_bitwise_on_tiny_and_within_the_golden_tolerance(layer, seed):
    g = tiny(layer)                                          # TP2: B = 4 requests
    result = optimise(g, "pool-fanout", seed)                # the manager checks the bitwise contract
    assert statuses(result) == {"pool-fanout": "changed"}
    for name in POOLS[layer]:
        node = result.graph.nodes[name]
        assert (node.attrs["tile"], node.attrs["blocks"].value(g.env)) == ((2,), 2), name
        assert [v.name for v in node.operands] == [v.name for v in g.nodes[name].operands]
    assert not golden_mismatches(result.graph, seed)


@pytest.mark.parametrize("layer", ["decode-swa", "moe"])
def test_no_op_without_a_compressor(layer):
    assert statuses(optimise(tiny(layer), "pool-fanout", numerics=False)) == {"pool-fanout": "no-op"}


@pytest.mark.parametrize("layer", sorted(POOLS))
def test_fires_at_flash_tp4(layer, tmp_path):
    before = layers.build(layer, config="flash", tp=4)
    after = flash_opt(layer, tmp_path)
    for name in POOLS[layer]:                               # B = 16: one `pl.at` block -> 8 blocks of 2
        was, node = before.nodes[name], after.nodes[name]
        assert was.attrs["blocks"].value(before.env) == 1 and "tile" not in was.attrs
        assert (node.attrs["tile"], node.attrs["blocks"].value(after.env)) == ((2,), 8), name
        assert "tail" not in node.attrs


def test_one_request_per_block_and_skip_reasons():
    g = tiny("decode-hca")
    node = optimise(g, "pool-fanout{requests=1}", numerics=False).graph.nodes["cmp.scatter_softmax_pool"]
    assert (node.attrs["tile"], node.attrs["blocks"].value(g.env)) == ((1,), 4)
    case = parse_graph((HERE / "pool-fanout" / "no_fire.before.dsir").read_text())
    reasons = {s.at: s.reason for s in get_pass("pool-fanout")().match(case)}
    assert reasons == {"a.scatter_softmax_pool": "2 request(s) fit one block of 2",
                       "b.scatter_softmax_pool": "already 2 request(s) per block"}
    with pytest.raises(ValueError, match=r"option 'requests' must be >= 1, got 0"):
        get_pass("pool-fanout")(requests=0)

"""split-m-fanout on the layers: bitwise on tiny (3 seeds, every attention layer) and still within the golden
tolerance; a no-op where kv_proj is a single M tile and on MoE; fires on kv_proj at flash TP4 (16 → 64 blocks).
Before/after cases: tests/passes/split-m-fanout/."""
from __future__ import annotations

import pytest

from dspark_ir import layers, parse_graph
from dspark_ir.graph import Graph
from passes import PassContext, get_pass, run_pipeline

from .layer_support import ATTENTION, SEEDS, flash_opt, golden_mismatches, optimise, skips, statuses, tiny
from .support import HERE

KV = "qkv.kv_proj_matmul"


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("layer", ATTENTION)
def test_bitwise_on_tiny_and_within_the_golden_tolerance(layer, seed):
    g = tiny(layer)                                         # TP2: T = 16 = 2 M tiles of 8
    result = optimise(g, "split-m-fanout", seed)            # the manager checks the bitwise contract
    assert statuses(result) == {"split-m-fanout": "changed"}
    kv = result.graph.nodes[KV]
    ways = 4 if layer == "decode-swa" else 2                # SWA's KV side: the TP group's 32 rows (4 M tiles)
    assert (kv.attrs["m_split"], kv.attrs["blocks"].value()) == (ways, ways * g.nodes[KV].attrs["blocks"].value())
    assert not golden_mismatches(result.graph, seed)


def test_no_op_where_m_is_one_tile_and_on_moe():
    for layer in ("decode-hca", "decode-csa"):              # TP4: T = 8, one 8-row M tile (SWA: the group's 32)
        result = optimise(tiny(layer, tp=4), "split-m-fanout", numerics=False)
        assert statuses(result) == {"split-m-fanout": "no-op"}
        assert skips(result, "split-m-fanout")[KV] == "the M extent (8 rows) is a single 8-row tile"
    assert statuses(optimise(tiny("moe"), "split-m-fanout", numerics=False)) == {"split-m-fanout": "no-op"}


@pytest.mark.parametrize("layer", ATTENTION)
def test_fires_on_kv_proj_at_flash_tp4(layer, tmp_path):
    before = layers.build(layer, config="flash", tp=4)
    after = flash_opt(layer, tmp_path)
    kv, was = after.nodes[KV], before.nodes[KV]
    # (512/128)·KV_OK = 16 blocks → ·KV_OM = 64; each block loops over 128/16/4 = 2 M tiles
    assert (was.attrs["blocks"].value(), kv.attrs["blocks"].value(after.env)) == (16, 64)
    assert (kv.attrs["m_split"], kv.attrs["k_split"], kv.attrs["accumulate"]) == (4, 4, "atomic")
    assert "tail" not in kv.attrs
    # edges unchanged: the seed is still an operand (it precedes all 64 blocks), the late_dep edge stays
    # (SWA: typed-gather lets kv_proj read the gathered window instead of its read-back copy;
    # fuse-mix-x-rms-norm makes the attention norm the fused mix + norm task)
    fused = {"attn.rms_norm": "attn.mix_x_rms_norm"}
    assert [v.name for v in kv.operands] == [fused.get(v.name, v.name.removesuffix(".copy_out"))
                                             for v in was.operands]
    gathered = ["cp.x_normed_allgather"] if layer == "decode-swa" else []   # typed-gather's wait → reader edge
    assert kv.operands[2].producer.op == "zeros" and [d.name for d in kv.deps] == ["attn.late_dep", *gathered]
    # no other matmul is re-gridded (the M tile inside a block is tile-choice's, later in the pipeline)
    for node in after.ops("matmul"):
        if node.name != KV and node.name in before.nodes:
            grid = lambda attrs: {k: v for k, v in attrs.items() if k != "tile"}  # noqa: E731
            assert grid(node.attrs) == grid(before.nodes[node.name].attrs), node.name


def test_case_skip_reasons():
    g = parse_graph((HERE / "split-m-fanout" / "no_fire.before.dsir").read_text())
    reasons = {s.at: s.reason for s in get_pass("split-m-fanout")().match(g)}
    assert reasons == {
        "qkv.qr_proj_matmul": "not selected by ops=[kv_proj_matmul]",
        "s.kv_proj_matmul": "the M extent (16 rows) is a single 16-row tile",
        "c.kv_proj_matmul": "already 24 blocks >= 24 cores",
        "d.kv_proj_matmul": "16 blocks != (N/n_tile)·k_split = 2: the grid already covers M (or is unknown)",
        "e.kv_proj_matmul": "already split (m_split = 2)",
    }


def test_unbound_m_is_refused():
    g = parse_graph("""
graph @sym<T>(%x: bf16[T,64], %w: bf16[64,32]) {
  %q.kv_proj_seed = zeros() {shape = [T, 32]} : f32[T,32]
  %q.kv_proj_matmul = matmul(%x, %w, %q.kv_proj_seed) {accumulate = atomic, k_split = 2, tile = [16, 32, 32], blocks = 2} : f32[T,32]
  return %q.kv_proj_matmul
}""")  # noqa: E501
    result = run_pipeline(g, "split-m-fanout", ctx=PassContext(use_env=False, check_numerics=False))
    assert not result.changed
    assert "not bound" in skips(result, "split-m-fanout")["q.kv_proj_matmul"]


def test_ways_option_and_reassociation_free_grid():
    """ways = 8 at T = 128 (8 M tiles): one M tile per block; the k-split partials per element are unchanged."""
    g = parse_graph((HERE / "split-m-fanout" / "kv_proj.before.dsir").read_text())
    result = optimise(g, "split-m-fanout{ways=8}")
    kv = result.graph.nodes[KV]
    assert (kv.attrs["m_split"], kv.attrs["k_split"], kv.attrs["blocks"].value()) == (8, 4, 64)
    assert _edges(result.graph) == _edges(g)


def _edges(g: Graph) -> set[tuple[str, str]]:
    return set(g.to_networkx().edges)

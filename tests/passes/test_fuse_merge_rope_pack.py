"""fuse-merge-rope-pack on the layers: bitwise on tiny decode-hca (TP1, TP2, TP4; 3 seeds; and input regimes where
all or some compressed work-item partials are neutral) and within the golden tolerance; the fused task
carries the raw attention, compressed qk_pv, rope_cs and rope_swap producers and the packed output still feeds the
TP1 O projection and the TP exchange; the `workers` option sets the block count; a no-op on SWA/CSA/MoE; fires on
decode-hca at flash TP4 with 48 workers. Before/after cases: tests/passes/fuse-merge-rope-pack/."""
from __future__ import annotations

import numpy as np
import pytest

import runner
from dspark_ir.interp import run
from passes.infra.contracts import BITWISE, check_outputs

from .layer_support import SEEDS, flash_opt, golden_mismatches, optimise, skips, statuses, tiny

FUSED, MERGE, PACK = "hca.hca_stream_merge_pack", "hca.hca_stream_merge", "hca.hca_stream_pack"


def _check_fused(g, workers: int, head_tile: int, raw: str = "hca.hca_raw_attn") -> None:
    assert MERGE not in g.nodes and PACK not in g.nodes
    fused = g.nodes[FUSED]
    assert fused.op == "hca_stream_merge_pack"
    assert (fused.attrs["blocks"].value(), fused.attrs["workers"], fused.attrs["tile"]) == (workers, workers,
                                                                                            (head_tile,))
    producers = [v.producer.name if v.producer else v.name for v in fused.operands]
    assert producers == [raw, raw, raw, "hca.hca_cmp_qk_pv",
                         "hca.hca_cmp_qk_pv", "hca.hca_cmp_qk_pv", "attn_sink", "hca.rope_cs", "hca.rope_cs",
                         "hca.rope_swap"]
    readers = {u.name for u in g.users(fused.result)}
    assert readers in ({"o.o_group_a2a"}, {f"o.proj_a_mm.g{i}" for i in range(g.nodes[FUSED].attrs["o_groups"])})


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_bitwise_on_tiny_hca_and_within_the_golden_tolerance(tp, seed):
    result = optimise(tiny("decode-hca", tp), "fuse-merge-rope-pack", seed)   # the bitwise contract is checked
    assert statuses(result) == {"fuse-merge-rope-pack": "changed"}
    _check_fused(result.graph, 48, 4)
    assert not golden_mismatches(result.graph, seed)


@pytest.mark.parametrize("regime, neutral", [("empty_cmp", "all"), ("default", "some")])
def test_bitwise_when_compressed_partials_are_neutral(regime, neutral):
    """Neutral work-item partials (l = 0: no visible compressed row) must stay neutral through the fused merge."""
    g = tiny("decode-hca", 1)
    inputs = runner.layer_inputs(g, 0, regime)
    before = run(g, inputs, keep=True)
    empty = np.asarray(before["hca.hca_cmp_qk_pv.l"]) == 0
    assert empty.all() if neutral == "all" else (empty.any() and not empty.all())
    after = optimise(g, "fuse-merge-rope-pack", numerics=False).graph
    got = run(after, inputs)
    assert check_outputs(BITWISE, [[before[v.name] for v in g.returns]], [[got[v.name] for v in after.returns]],
                         [v.name for v in g.returns], [v.name for v in after.returns]) is None


def test_workers_option_sets_the_pool():
    result = optimise(tiny("decode-hca", 2), "fuse-merge-rope-pack{workers=4}")
    _check_fused(result.graph, 4, 4)


@pytest.mark.parametrize("layer, tp", [("decode-swa", 2), ("decode-csa", 2), ("moe", 1)])
def test_no_op_without_the_hca_pair(layer, tp):
    result = optimise(tiny(layer, tp), "fuse-merge-rope-pack", numerics=False)
    assert statuses(result) == {"fuse-merge-rope-pack": "no-op"} and not skips(result, "fuse-merge-rope-pack")


def test_skips_when_the_stream_heads_have_another_reader():
    g = tiny("decode-hca", 1).clone()
    g.set_returns(g.returns + [g.values[MERGE]])
    result = optimise(g, "fuse-merge-rope-pack", numerics=False)
    assert statuses(result) == {"fuse-merge-rope-pack": "no-op"}
    assert "returned by the graph" in skips(result, "fuse-merge-rope-pack")[MERGE]


def test_fires_at_flash_tp4(tmp_path):
    g = flash_opt("decode-hca", tmp_path)
    _check_fused(g, 48, 16, raw="hca.hca_raw_attn_request")    # the default pipeline ran raw-kv-gather-per-request
    assert str(g.nodes[FUSED].result.type) == "bf16[8,T,4096]"


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_heads_on_chip_false_is_the_seed_kernel_and_bitwise(tp, seed):
    """pypto-lib #1229 as the option: false marks the fused node stage_heads (the seed's GM round trip of the f32
    heads inside the kernel); the graph is otherwise the default's and the contract stays bitwise."""
    staged = optimise(tiny("decode-hca", tp), "fuse-merge-rope-pack{heads_on_chip=false}", seed).graph
    assert staged.nodes[FUSED].attrs["stage_heads"] is True
    on_chip = optimise(tiny("decode-hca", tp), "fuse-merge-rope-pack", numerics=False).graph
    assert "stage_heads" not in on_chip.nodes[FUSED].attrs
    node = staged.nodes[FUSED]
    node.attrs = {k: v for k, v in node.attrs.items() if k != "stage_heads"}
    assert staged.structurally_equal(on_chip)


def test_heads_on_chip_round_trips_and_prints_only_when_off():
    from passes.infra.pipeline import parse_pipeline

    text = "fuse-merge-rope-pack{heads_on_chip=false}"
    assert str(parse_pipeline(str(parse_pipeline(text)))) == text
    assert str(parse_pipeline("fuse-merge-rope-pack{heads_on_chip=true}")) == "fuse-merge-rope-pack"

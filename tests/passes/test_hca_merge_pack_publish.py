"""hca-merge-pack-publish on the layers: on tiny HCA at TP2 and TP4 (3 seeds, after the default pipeline) the
merge-pack and the exchange become one publish, bitwise (the numeric contract) and within the golden tolerance;
the fused task lowers with a clean dependency lint and the multi-rank simulator completes on one core group per
rank with the interpreter's values; a no-op at TP1 and on SWA / CSA, with the reasons; fires at flash TP4; a
planted wrong rewrite is caught by the contract. Before/after cases: tests/passes/hca-merge-pack-publish/; the
local part through pypto: tests/kernels/test_templates_merge_pack_publish.py."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from dspark_ir import layers
from lowering import build_task_graph, lint
from passes import get_pass, register_pass, run_pipeline
from passes.hca_merge_pack_publish import HcaMergePackPublish
from passes.infra.errors import PassError
from passes.infra.rewriting import set_operand

from .layer_support import SEEDS, assert_simulates_as_interpreted, golden_mismatches, optimise, skips, statuses, tiny

NAME = "hca-merge-pack-publish"
MERGE_PACK, A2A, FUSED = "hca.hca_stream_merge_pack", "o.o_group_a2a", "hca.hca_stream_merge_pack_publish"
DEFAULT_WITH = f"fuse-merge-rope-pack,a2a-direct-read,{NAME}"


def _check(before, after) -> None:
    assert MERGE_PACK not in after.nodes and A2A not in after.nodes
    fused, merge_pack, a2a = after.nodes[FUSED], before.nodes[MERGE_PACK], before.nodes[A2A]
    assert fused.op == "hca_stream_merge_pack_publish"
    assert [v.name for v in fused.operands] == [v.name for v in merge_pack.operands]
    assert (fused.attrs["workers"], fused.attrs["blocks"].value(), fused.attrs["publish_tokens"]) == (48, 48, 4)
    assert (fused.attrs["tp"], fused.attrs["t_pad"]) == (a2a.attrs["tp"], a2a.attrs["t_pad"])
    assert str(fused.result.type) == str(a2a.result.type)
    readers = {u.name for u in after.users(fused.result)}
    assert readers == {u.name for u in before.users(a2a.result)}


def _fused_before(tp: int):
    return optimise(tiny("decode-hca", tp), "fuse-merge-rope-pack,a2a-direct-read", numerics=False).graph


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("tp", [2, 4])
def test_bitwise_on_tiny_hca(tp, seed):
    before = _fused_before(tp)
    result = optimise(before, NAME, seed)                     # the bitwise contract is checked on seed's inputs
    assert statuses(result) == {NAME: "changed"}
    _check(before, result.graph)
    assert not golden_mismatches(result.graph, seed)


def test_tp1_swa_csa_and_unfused_explain_why_not():
    result = optimise(_fused_before(1), NAME, numerics=False)
    assert statuses(result) == {NAME: "no-op"}
    assert skips(result, NAME) == {MERGE_PACK: "no o_group_a2a reads its packed heads (TP1: they feed the local "
                                               "O projection, there is no exchange window to publish into)"}
    csa = optimise(tiny("decode-csa", 2), NAME, numerics=False)
    assert skips(csa, NAME) == {A2A: "its packed heads come from %csa.merge_norm (csa_merge_norm), not an "
                                     "hca_stream_merge_pack (#1170 changed HCA only)"}
    assert statuses(optimise(tiny("decode-swa", 4), NAME, numerics=False)) == {NAME: "no-op"}
    unfused = optimise(tiny("decode-hca", 2), NAME, numerics=False)
    assert statuses(unfused) == {NAME: "no-op"}
    assert "fuse-merge-rope-pack makes the merge-pack" in skips(unfused, NAME)["hca.hca_stream_merge"]


def test_staged_heads_explain_why_not():
    g = optimise(tiny("decode-hca", 2), "fuse-merge-rope-pack{heads_on_chip=false}", numerics=False).graph
    assert {s.at: s.reason for s in get_pass(NAME)().match(g)} == {
        A2A: f"%{MERGE_PACK} stages its heads through GM (stage_heads): the publish tiles start from the heads in "
             "the worker's buffers"}


@pytest.mark.parametrize("options", ["", "{workers=24,publish_tokens=8}"])
def test_options_round_trip_through_the_pipeline(options):
    result = optimise(_fused_before(2), NAME + options, numerics=False)
    fused = result.graph.nodes[FUSED]
    assert (fused.attrs["publish_tokens"], fused.attrs["workers"]) == ((8, 24) if options else (4, 48))
    assert str(result.pipeline) == NAME + options


def test_tp4_lowers_clean_and_simulates_on_one_core_group():
    g = optimise(tiny("decode-hca", 4), DEFAULT_WITH, numerics=False).graph
    tg = build_task_graph(g)
    assert lint(tg).ok
    [task] = [t for t in tg.tasks if t.name == FUSED]
    assert task.collective and task.attrs["blocks"] == 48
    assert_simulates_as_interpreted(g)


def test_fires_at_flash_tp4():
    before = optimise(layers.build("decode-hca", config="flash", tp=4), "fuse-merge-rope-pack,a2a-direct-read",
                      numerics=False).graph
    after = optimise(before, NAME, numerics=False).graph
    _check(before, after)
    window = after.nodes[FUSED].result.type
    assert [d.value(after.env) for d in window.shape] == [2, 512, 4096]      # LG groups, tp·T_PAD rows


@register_pass
@dataclass(frozen=True)
class PlantedPublishSwappedTables(HcaMergePackPublish):
    """(test only) The publish with the inverse-RoPE cos and sin tables swapped: a wrong rewrite."""

    name = "planted-hca-publish-swapped-tables"

    def rewrite(self, g, site):
        record = super().rewrite(g, site)
        fused = g.nodes[FUSED]
        cos, sin = fused.operands[7], fused.operands[8]
        set_operand(g, fused, 7, sin)
        set_operand(g, fused, 8, cos)
        return record


def test_planted_swapped_tables_break_the_contract():
    with pytest.raises(PassError) as e:
        run_pipeline(_fused_before(2), "planted-hca-publish-swapped-tables", check_numerics=True, use_env=False)
    assert e.value.kind == "contract"

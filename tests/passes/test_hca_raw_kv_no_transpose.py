"""hca-raw-kv-no-transpose on the layers: bitwise on tiny decode-hca at TP1/2/4 × 3 seeds (S = 4, and S = 1) and
within the golden tolerance; the transpose task is gone and the attention waits on the gather only; --explain on
SWA/CSA (their attention reads the keys directly already) and MoE (nothing); fires at flash TP4. Before/after
cases: tests/passes/hca-raw-kv-no-transpose/."""
from __future__ import annotations

import networkx as nx
import pytest

from dspark_ir import layers
from passes import PassContext, run_pipeline

from .layer_support import SEEDS, golden_mismatches, optimise, skips, statuses, tiny

NAME = "hca-raw-kv-no-transpose"


def _check_direct(g) -> None:
    assert not g.ops("hca_raw_transpose") and not g.ops("hca_raw_attn")
    direct, = g.ops("hca_raw_attn_direct")
    assert [v.name for v in direct.operands] == ["qkv.qproj_dequant_rms_nope_rope", "hca.hca_gather_kv", "swa_indices"]
    assert nx.has_path(g.to_networkx(), "hca.hca_gather_kv", direct.name)
    merge = g.nodes["hca.hca_stream_merge"]
    assert merge.operands[:3] == direct.results


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("seed", SEEDS)
def test_bitwise_on_tiny_hca_and_within_the_golden_tolerance(tp, seed):
    result = optimise(tiny("decode-hca", tp=tp), NAME, seed)        # S = 4; the bitwise contract is checked
    assert statuses(result) == {NAME: "changed"}
    _check_direct(result.graph)
    assert not golden_mismatches(result.graph, seed)


def test_one_token_per_request():
    g = layers.build("decode-hca", config="tiny", tp=1, seq=1)
    result = optimise(g, NAME, 1)
    _check_direct(result.graph)
    assert not golden_mismatches(result.graph, 1)


def test_keeps_the_attention_attributes_and_deps():
    before = tiny("decode-hca", tp=4)
    old = before.nodes["hca.hca_raw_attn"]
    direct, = optimise(before, NAME, numerics=False).graph.ops("hca_raw_attn_direct")
    assert direct.attrs == old.attrs and [d.name for d in direct.deps] == [d.name for d in old.deps]


@pytest.mark.parametrize("layer", ["decode-swa", "decode-csa"])
def test_explains_swa_and_csa(layer):
    result = optimise(tiny(layer), NAME, numerics=False)
    assert statuses(result) == {NAME: "no-op"}
    why = skips(result, NAME)
    assert why and all("reads its gathered keys directly already" in reason for reason in why.values())


def test_no_op_on_moe():
    result = optimise(tiny("moe"), NAME, numerics=False)
    assert statuses(result) == {NAME: "no-op"} and not skips(result, NAME)


def test_idempotent_and_explains_the_direct_form():
    once = optimise(tiny("decode-hca"), NAME, numerics=False).graph
    again = optimise(once, NAME, numerics=False)
    assert not again.changed
    assert skips(again, NAME) == {"hca.hca_raw_attn_direct": "already reads the rows directly (no Kᵀ operand)"}


def test_fires_at_flash_tp4():
    g = layers.build("decode-hca", config="flash", tp=4)
    transposes = g.ops("hca_raw_transpose")
    assert len(transposes) == 1 and transposes[0].attrs["blocks"].value(g.env) == 512   # T·W/RAW_K_TILE
    result = run_pipeline(g, NAME, ctx=PassContext(use_env=False, check_numerics=False))
    _check_direct(result.graph)

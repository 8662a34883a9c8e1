"""retiled-cse on the layers: each attention layer's second RoPE table task goes (bitwise on tiny, 3 seeds, and
within the golden tolerance), the lowered layer has one task less, fuse-merge-rope-pack still fuses after it, and
it is off in the default pipeline. Before/after cases: tests/passes/retiled-cse/."""
from __future__ import annotations

import pytest

from dspark_ir import layers
from lowering import build_task_graph
from passes import PassContext, default_pipeline, run_pipeline

from .layer_support import ATTENTION, SEEDS, flash_opt, golden_mismatches, optimise, statuses, tiny

PASS = "retiled-cse"
SECOND = {"decode-swa": "swa.rope_cs", "decode-csa": "csa.rope_cs", "decode-hca": "hca.rope_cs"}


@pytest.mark.parametrize("layer", ATTENTION)
@pytest.mark.parametrize("seed", SEEDS)
def test_the_second_rope_tables_go_bitwise(layer, seed):
    result = optimise(tiny(layer), f"canonicalize,cse,{PASS}", seed)       # the contract is checked
    g, run_ = result.graph, result.runs[-1]
    assert run_.status == "changed" and run_.removed == [SECOND[layer]]
    kept = g.nodes["qkv.q_rope_prepare"]
    kv_tables = 1 if layer == "decode-swa" else 0       # SWA's KV side has its own (the TP group's rows)
    assert [n.op for n in g.nodes.values()].count("rope_tables") == 1 + kv_tables
    readers = {u.name for v in kept.results for u in g.users(v)}
    assert any(not name.startswith("qkv.") for name in readers), readers   # the output side reads it now
    assert not golden_mismatches(g, seed)


@pytest.mark.parametrize("layer", ATTENTION)
def test_one_task_less_after_the_default_pipeline(layer):
    g = tiny(layer)
    base = run_pipeline(g, ctx=PassContext(use_env=False)).graph
    shared = run_pipeline(g, ctx=PassContext(use_env=False, enabled=[PASS], check_numerics=True)).graph
    assert SECOND[layer] in base.nodes and SECOND[layer] not in shared.nodes
    assert len(build_task_graph(shared).tasks) == len(build_task_graph(base).tasks) - 1


def test_fuse_merge_rope_pack_still_fuses_after_it():
    result = optimise(tiny("decode-hca"), f"canonicalize,cse,{PASS},fuse-merge-rope-pack")
    assert statuses(result)["fuse-merge-rope-pack"] == "changed"
    fused = next(n for n in result.graph.nodes.values() if n.op == "hca_stream_merge_pack")
    assert {v.name for v in fused.operands} >= {"qkv.q_rope_prepare", "qkv.q_rope_prepare.sin_signed"}


def test_off_by_default_and_a_no_op_without_rope_tables():
    assert PASS not in [p.name for p in default_pipeline()]
    assert optimise(layers.build("moe", "tiny"), PASS, numerics=False).runs[0].status == "no-op"


def test_fires_at_flash_tp4(tmp_path):
    g = flash_opt("decode-hca", tmp_path, "--enable", PASS)
    assert "hca.rope_cs" not in g.nodes and "qkv.q_rope_prepare" in g.nodes

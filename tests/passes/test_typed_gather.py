"""typed-gather: the seed's typed gathers act on context-parallel all-gathers (cp_allgather) only. On a gathered
window the consumers read it directly (bitwise, checked by the case runner: tests/passes/typed-gather/); the
O path's all-to-all is left to a2a-direct-read (test_a2a_direct_read.py). Of today's layers only SWA at TP > 1
has cp_allgathers (x_normed, positions, slot mapping: the seed's context-parallel KV side); HCA and CSA have none."""
from __future__ import annotations

import numpy as np
import pytest

from dspark_ir import parse_graph, verify
from dspark_ir.interp import run
from passes import PassContext, run_pipeline

from .layer_support import ATTENTION, statuses, tiny
from .support import HERE

GATHER = (HERE / "typed-gather" / "cp_allgather.before.dsir").read_text()


def test_cp_allgather_gives_every_rank_every_ranks_rows():
    g = parse_graph(GATHER)
    verify(g)
    per_rank = [{"payload": np.full((2, 8), r + 1, np.float32), "w": np.zeros((4, 8), np.float32)} for r in range(2)]
    out = run(g, per_rank)
    for res in out:
        np.testing.assert_array_equal(res["kv.out"][:, 0], [1, 1, 2, 2])


def test_fires_on_a_cp_allgather_read_back():
    result = run_pipeline(parse_graph(GATHER), "typed-gather", ctx=PassContext(use_env=False, check_numerics=True))
    g = result.graph
    assert not g.ops("window_copy_out") and g.ops("window_release")
    assert g.nodes["kv.out"].operands[0] is g.nodes["kv.cp_allgather"].result


@pytest.mark.parametrize("layer", ATTENTION)
def test_leaves_the_o_path_to_a2a_direct_read(layer):
    result = run_pipeline(tiny(layer, 2), "typed-gather", ctx=PassContext(use_env=False, check_numerics=True))
    g = result.graph
    assert [n.name for n in g.ops("window_copy_out")] == ["o.o_group_a2a.copy_out"]
    assert statuses(result) == {"typed-gather": "changed" if layer == "decode-swa" else "no-op"}


def test_swa_kv_side_reads_the_gathered_rows():
    g = run_pipeline(tiny("decode-swa", 4), "typed-gather", ctx=PassContext(use_env=False, check_numerics=True)).graph
    gathered = g.nodes["cp.x_normed_allgather"].result
    assert g.nodes["qkv.kv_proj_matmul"].operands[0] is gathered
    releases = [n.name for n in g.ops("window_release")]
    assert sorted(releases) == ["cp.positions_allgather.release", "cp.slot_mapping_allgather.release",
                                "cp.x_normed_allgather.release"]

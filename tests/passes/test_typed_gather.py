"""typed-gather: the seed's typed gathers act on context-parallel all-gathers (cp_allgather) only. On a gathered
window the consumers read it directly (bitwise, checked by the case runner: tests/passes/typed-gather/); the
O path's all-to-all is left to a2a-direct-read (test_a2a_direct_read.py). At TP > 1 SWA has token cp_allgathers
(x_normed, positions, slot mapping: the seed's context-parallel KV side); CSA (main + aux) and HCA have the untyped
compressor-payload steps (pack → cp_allgather → read-back → unpack), which the pass turns into the typed step."""
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
    assert statuses(result) == {"typed-gather": "changed"}


@pytest.mark.parametrize("layer, steps", [("decode-csa", ["cp.csa_main_allgather", "cp.csa_aux_allgather"]),
                                          ("decode-hca", ["cp.hca_allgather"])])
def test_types_the_compressor_payload_steps(layer, steps):
    before = tiny(layer, 2)
    assert [n.name for n in before.ops("cp_allgather")] == steps
    assert len(before.ops("cp_wire_pack")) == len(before.ops("cp_wire_unpack")) == len(steps)
    g = run_pipeline(before, "typed-gather", ctx=PassContext(use_env=False, check_numerics=True)).graph
    assert not g.ops("cp_wire_pack") and not g.ops("cp_wire_unpack") and not g.ops("cp_allgather")
    assert [n.name for n in g.ops("cp_typed_allgather")] == [s + ".typed" for s in steps]
    assert [n.name for n in g.ops("cp_typed_readback")] == [s + ".readback" for s in steps]
    for s in steps:      # the rank's own rows are cut from the decoded read-back, as before from the unpack
        assert g.nodes[s + ".own_rows"].operands[0] is g.nodes[s + ".readback"].results[0]


def test_tp1_has_no_compressor_payload_step():
    for layer in ("decode-csa", "decode-hca"):
        g = tiny(layer, 1)
        assert not g.ops("cp_wire_pack") and not g.ops("cp_allgather") and not g.ops("cp_rank_rows")


def test_swa_kv_side_reads_the_gathered_rows():
    g = run_pipeline(tiny("decode-swa", 4), "typed-gather", ctx=PassContext(use_env=False, check_numerics=True)).graph
    gathered = g.nodes["cp.x_normed_allgather"].result
    assert g.nodes["qkv.kv_proj_matmul"].operands[0] is gathered
    releases = [n.name for n in g.ops("window_release")]
    assert sorted(releases) == ["cp.positions_allgather.release", "cp.slot_mapping_allgather.release",
                                "cp.x_normed_allgather.release"]

"""decode-swa at TP > 1 in the seed's context-parallel form (docs/seed-baselines.md "SWA"): x_normed, positions and
the slot mapping are all-gathered over the TP group, the KV side runs on the group's tp·T rows, the other ranks'
slots are masked to −1; at TP1 nothing is gathered."""
from __future__ import annotations

import numpy as np
import pytest

from dspark_ir import layers
from dspark_ir.semantics.collective import cp_allgather, cp_own_rows


@pytest.mark.parametrize("tp", [2, 4])
def test_kv_side_runs_on_the_groups_rows(tp):
    g = layers.build("decode-swa", config="tiny", tp=tp)
    env = g.env
    T = g.symbols["T"]
    for name in ("qkv.kv_proj_matmul", "qkv.kv_rms_norm_rope", "qkv.kv_rope_prepare", "cp.slot_mapping_own_rows"):
        assert g.nodes[name].results[0].type.concrete_shape(env)[0] == tp * T, name
    assert g.nodes["qkv.qr_proj_matmul"].result.type.concrete_shape(env)[0] == T
    insert = g.nodes["swa.swa_cache_insert_valid_bias"]
    assert insert.operands[2] is g.nodes["cp.slot_mapping_own_rows"].result
    assert insert.results[1].type.concrete_shape(env)[0] == T          # the bias: the rank's query rows
    x_gather = g.nodes["cp.x_normed_allgather"]
    assert x_gather.attrs["blocks"].value() == 16 and g.nodes["cp.x_normed_allgather.copy_out"].attrs[
        "blocks"].value() == 16


def test_tp1_has_no_gather():
    g = layers.build("decode-swa", config="tiny", tp=1)
    assert not g.ops("cp_allgather") and not g.ops("cp_own_rows")


def test_own_rows_keeps_each_ranks_slots_only():
    slots = [np.array([10, 11], np.int32), np.array([20, -1], np.int32)]
    gathered = cp_allgather([[s] for s in slots], ranks=2)
    assert all(np.array_equal(x, [10, 11, 20, -1]) for x in gathered)
    own = cp_own_rows([[x] for x in gathered], ranks=2, fill=-1)
    np.testing.assert_array_equal(own[0], [10, 11, -1, -1])
    np.testing.assert_array_equal(own[1], [-1, -1, 20, -1])

"""widen-tile on the layers: bitwise on tiny (3 seeds, every attention layer) and still within the golden tolerance;
a no-op on MoE; at flash TP4 KV_RMS_T_TILE 8 → 16 on kv_rms_norm_rope and its rope-row materialiser, stopped
there by the UB budget. Before/after cases: tests/passes/widen-tile/."""
from __future__ import annotations

import pytest

from dspark_ir import layers, parse_graph
from passes import get_pass
from passes.widen_tile import ub_bytes

from .layer_support import ATTENTION, SEEDS, flash_opt, golden_mismatches, optimise, skips, statuses, tiny
from .support import HERE

NORM, ROPE = "qkv.kv_rms_norm_rope", "qkv.q_rope_prepare"


def _kv_side(layer: str, tp: int) -> tuple[str, int]:
    """(the KV side's RoPE materialiser, its rows per rank token): SWA at TP > 1 runs the KV side on the TP group's
    gathered rows with its own tables (docs/seed-baselines.md "SWA")."""
    return ("qkv.kv_rope_prepare", tp) if layer == "decode-swa" and tp > 1 else (ROPE, 1)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("layer", ATTENTION)
def test_bitwise_on_tiny_and_within_the_golden_tolerance(layer, seed):
    g = tiny(layer)                                         # TP2: T = 16, KV_RMS_T_TILE 4
    result = optimise(g, "widen-tile", seed)                # the manager checks the bitwise contract
    assert statuses(result) == {"widen-tile": "changed"}
    rope, group = _kv_side(layer, 2)
    for name in (NORM, rope):
        node = result.graph.nodes[name]
        assert (node.attrs["tile"], node.attrs["blocks"].value(g.env)) == ((16,), group), name
    assert not golden_mismatches(result.graph, seed)


def test_no_op_on_moe():
    result = optimise(tiny("moe"), "widen-tile", numerics=False)
    assert statuses(result) == {"widen-tile": "no-op"}


def test_tp4_tiny_stops_at_the_row_extent():
    result = optimise(tiny("decode-hca", tp=4), "widen-tile", numerics=False)   # T = 8: 4 → 8, not 16
    assert result.graph.nodes[NORM].attrs["tile"] == (8,)
    assert skips(result, "widen-tile")[NORM] == "a 16-row tile would exceed the 8 rows"


@pytest.mark.parametrize("layer", ATTENTION)
def test_fires_at_flash_tp4(layer, tmp_path):
    before = layers.build(layer, config="flash", tp=4)
    after = flash_opt(layer, tmp_path)
    rope, group = _kv_side(layer, 4)
    for name in (NORM, rope):                              # 8 → 16: spmd ceil(128/16) = 8 (was 16); SWA: ·4 rows
        node, was = after.nodes[name], before.nodes[name]
        assert (was.attrs["tile"], was.attrs["blocks"].value(before.env)) == ((8,), 16 * group), name
        assert (node.attrs["tile"], node.attrs["blocks"].value(after.env)) == ((16,), 8 * group), name
        assert "tail" not in node.attrs
        # (SWA: typed-gather lets the tables read the gathered positions' window, with a dep on it)
        assert [v.name for v in node.operands] == [v.name.removesuffix(".copy_out") for v in was.operands]
        assert was.deps == [] and [d.name for d in node.deps] == [v.name for v in node.operands
                                                                 if v.name.startswith("cp.")]


def test_flash_ub_budget_stops_at_16_rows():
    """The seed's 16-row tile fits the ~192 KB UB budget at flash; 32 rows do not."""
    g = layers.build("decode-swa", config="flash", tp=4)
    norm = g.nodes[NORM]
    rows = norm.result.type.concrete_shape(g.env)[0]        # the KV side's rows (the TP group's 512)
    assert ub_bytes(g, norm, 16, rows) <= 192 * 1024 < ub_bytes(g, norm, 32, rows)
    result = optimise(g, "widen-tile{min_rows=64}", numerics=False)
    assert result.graph.nodes[NORM].attrs["tile"] == (16,)
    assert skips(result, "widen-tile")[NORM].startswith("a 32-row tile needs ~")


def test_case_skip_reasons():
    g = parse_graph((HERE / "widen-tile" / "no_fire.before.dsir").read_text())
    reasons = {s.at: s.reason for s in get_pass("widen-tile")().match(g)}
    assert reasons == {"a.kv_rms_norm_rope": "already 16 rows per block (min_rows = 16)",
                       "b.kv_rms_norm_rope": "no one-entry row tile (tile = None)"}

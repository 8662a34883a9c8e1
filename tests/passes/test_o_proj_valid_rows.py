"""o-proj-valid-rows on the layers: on tiny SWA / HCA / CSA at TP1 built with a token capacity above T (the seed's
padded decode_o_proj_tp1), bitwise (3 seeds), within the golden tolerance, and the result is exactly the graph the
layer builds without a capacity; a no-op that explains itself at TP2 / TP4 (the O path's exchanged rows are all
valid) and on TP1 graphs without a capacity; MoE has no O path. At flash TP1 with 16 × 8 tokens in a 512-token
capacity: proj_b 256 → 64 blocks (pypto-lib #1226). Before/after cases: tests/passes/o-proj-valid-rows/."""
from __future__ import annotations

from functools import lru_cache

import pytest

from dspark_ir import layers
from dspark_ir.errors import ConfigError
from dspark_ir.ops.oproj import OProjB, QuantRows
from passes import PassContext, run_pipeline
from passes.infra.pipeline import parse_pipeline

from .layer_support import ATTENTION, SEEDS, golden_mismatches, optimise, skips, statuses, tiny

PASS = "o-proj-valid-rows"


@lru_cache(maxsize=None)
def padded(layer: str, capacity: int = 64):
    return layers.build(layer, config="tiny", tp=1, token_capacity=capacity)


def _proj_b(g):
    return [n for n in g.topo_order() if n.opdef is OProjB]


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("layer", ATTENTION)
def test_bitwise_on_tiny_tp1_with_padding_and_equal_to_the_unpadded_build(layer, seed):
    g = padded(layer)
    assert all(n.result.type.shape[0].value(g.env) == 64 for n in _proj_b(g))
    result = optimise(g, PASS, seed)                   # the bitwise contract is checked on the seed's inputs
    assert statuses(result) == {PASS: "changed"}
    assert result.graph.structurally_equal(tiny(layer, 1))
    assert not golden_mismatches(result.graph, seed)


@pytest.mark.parametrize("layer", ATTENTION)
def test_the_padded_before_holds_the_golden_too(layer):
    assert not golden_mismatches(padded(layer), 0)


@pytest.mark.parametrize("tp", [2, 4])
@pytest.mark.parametrize("layer", ATTENTION)
def test_explains_why_not_on_the_tp_path(layer, tp):
    result = optimise(tiny(layer, tp), PASS)
    assert statuses(result) == {PASS: "no-op"}
    reasons = skips(result, PASS)
    assert reasons and all("all valid" in why for why in reasons.values())
    assert set(reasons) == {n.name for n in _proj_b(tiny(layer, tp))}


@pytest.mark.parametrize("layer", ATTENTION)
def test_no_op_at_tp1_without_a_capacity(layer):
    result = optimise(tiny(layer, 1), PASS, numerics=False)
    assert statuses(result) == {PASS: "no-op"}
    assert all("all valid" in why for why in skips(result, PASS).values())


def test_no_op_on_moe():
    result = optimise(tiny("moe", 1), PASS, numerics=False)
    assert statuses(result) == {PASS: "no-op"} and not skips(result, PASS)


def test_row_tile_option_round_trips_and_sets_the_tile():
    text = f"{PASS}{{row_tile=8}}"
    assert str(parse_pipeline(str(parse_pipeline(text)))) == text == str(parse_pipeline(text))
    assert str(parse_pipeline(f"{PASS}{{row_tile=0}}")) == PASS                 # the default does not print
    ctx = PassContext(use_env=False, check_numerics=True, verify_each=True, roundtrip_each=True)
    result = run_pipeline(padded("decode-hca"), text, ctx=ctx)
    nodes = _proj_b(result.graph)
    T = result.graph.env["T"]
    assert all(n.attrs["tile"][0] == 8 and n.attrs["blocks"].value(result.graph.env) == T // 8 for n in nodes)


def test_capacity_errors_are_one_line():
    with pytest.raises(ConfigError, match="token_capacity: .* TP1 form"):
        layers.build("decode-hca", config="tiny", tp=2, token_capacity=64)
    with pytest.raises(ConfigError, match="below the T = 32"):
        layers.build("decode-swa", config="tiny", tp=1, token_capacity=16)


def test_a_capacity_within_the_tile_pad_adds_no_rows():
    """capacity 40 at T = 32 pads to 48 rows; capacity = T pads none (the graph the layer always built)."""
    assert layers.build("decode-swa", config="tiny", tp=1, token_capacity=32).structurally_equal(tiny("decode-swa", 1))
    g = layers.build("decode-swa", config="tiny", tp=1, token_capacity=40)
    assert {n.attrs.get("pad_rows") for n in g.topo_order() if n.opdef is QuantRows} == {48}


@pytest.mark.parametrize("layer", ATTENTION)
def test_fires_at_flash_tp1_rows_mostly_padding(layer):
    """16 requests × 8 tokens = 128 valid rows in the seed's 512-token capacity: 256 → 64 proj_b blocks."""
    g = layers.build(layer, config="flash", tp=1, batch=16, seq=8, token_capacity=512)
    blocks = lambda graph: sum(n.attrs["blocks"].value(graph.env) for n in _proj_b(graph))  # noqa: E731
    assert blocks(g) == 256
    # the firing and the grid only: the contract is checked on tiny above (flash numerics would build GiBs of
    # golden inputs and take minutes per layer)
    result = run_pipeline(g, PASS, ctx=PassContext(use_env=False, check_numerics=False))
    assert statuses(result) == {PASS: "changed"} and blocks(result.graph) == 64

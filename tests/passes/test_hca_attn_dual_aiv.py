"""hca-attn-dual-aiv on the layers: bitwise on tiny HCA at TP1/2/4 (3 seeds) and still within the golden
tolerance; explains itself on CSA; at flash TP4 the raw attention goes 512 -> 128 blocks of 64 heads and the
compressed QK/PV 128 blocks -> 24 workers. The template option it sets:
tests/kernels/test_templates_hca_attn_options.py.
Before/after cases: tests/passes/hca-attn-dual-aiv/."""
from __future__ import annotations

import pytest

from dspark_ir import layers
from passes import get_pass

from .layer_support import SEEDS, golden_mismatches, optimise, skips, statuses, tiny

PASS = "hca-attn-dual-aiv"
RAW, CMP = "hca.hca_raw_attn", "hca.hca_cmp_qk_pv"


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("tp", (1, 2, 4))
def test_bitwise_on_tiny_hca_and_within_the_golden_tolerance(tp, seed):
    g = tiny("decode-hca", tp)
    result = optimise(g, PASS, seed)
    assert statuses(result) == {PASS: "changed"}
    raw, cmp = result.graph.nodes[RAW], result.graph.nodes[CMP]
    heads = g.nodes[RAW].operands[0].type.shape[1].value(g.env)
    assert raw.attrs["tile"] == (1, heads) and raw.attrs["blocks"].value(g.env) == g.env["T"]
    items = g.nodes[CMP].attrs["blocks"].value(g.env)
    assert (cmp.attrs["workers"], cmp.attrs["aiv_split"]) == (min(24, items), 2)
    assert not golden_mismatches(result.graph, seed)


def test_explains_itself_on_csa():
    result = optimise(tiny("decode-csa"), PASS, numerics=False)
    assert statuses(result) == {PASS: "no-op"}
    assert skips(result, PASS) == {"csa.qk_pv": "CSA's qk_pv already runs on cyclic workers (#1187 changed HCA only)"}


@pytest.mark.parametrize(("tp", "raw", "cmp"), [(4, (512, 128), (128, 24)), (1, (2048, 512), (512, 24))])
def test_flash_grids(tp, raw, cmp):
    g = layers.build("decode-hca", config="flash", tp=tp)
    after = optimise(g, PASS, numerics=False).graph
    for name, (was, now) in ((RAW, raw), (CMP, cmp)):
        assert [x.nodes[name].attrs["blocks"].value(g.env) for x in (g, after)] == [was, now]


def test_second_run_explains():
    once = optimise(tiny("decode-hca"), PASS, numerics=False).graph
    reasons = {s.at: s.reason for s in get_pass(PASS)().match(once)}
    assert reasons == {RAW: "already 8 of 8 heads per block (head_tile = 64) and QK look-ahead 2",
                       CMP: "already on 16 workers"}


def test_lookahead_round_trips_and_is_set_on_the_raw_task():
    result = optimise(tiny("decode-hca"), PASS + "{lookahead=0}", numerics=False)
    assert str(result.pipeline) == PASS + "{lookahead=0}"
    assert "lookahead" not in result.graph.nodes[RAW].attrs
    default = optimise(tiny("decode-hca"), PASS, numerics=False).graph
    assert default.nodes[RAW].attrs["lookahead"] == 2


def test_lookahead_carries_to_the_direct_and_per_request_forms():
    """The default pipeline's order (hca-attn-dual-aiv before hca-raw-kv-no-transpose and
    raw-kv-gather-per-request) carries the option to the forms whose templates read it."""
    for extra, name in (("", "hca.hca_raw_attn_direct"), ("raw-kv-gather-per-request", "hca.hca_raw_attn_request")):
        pipe = ",".join(p for p in (PASS, "hca-raw-kv-no-transpose", extra) if p)
        g = optimise(tiny("decode-hca"), pipe, numerics=False).graph
        assert g.nodes[name].attrs["lookahead"] == 2


def test_explains_itself_on_swa():
    result = optimise(tiny("decode-swa"), PASS, numerics=False)
    assert statuses(result) == {PASS: "no-op"}
    assert skips(result, PASS) == {"swa.qk_pv": "SWA's window attention: #1187 changed the HCA attention templates "
                                                "only"}

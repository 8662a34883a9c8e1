"""raw-kv-gather-per-request on the layers: bitwise on tiny decode-hca at TP1/2/4 × 3 seeds (S = 4; TP1's golden
inputs hold requests at the start of their context, whose windows are shorter than W, so the per-token offsets
into the request rows are not all S − 1 … 0) and at S = 2, within the golden tolerance; one gather per request of
W + S − 1 rows; the option toggles the #1170 (a) one-run copy; --explain on the transposed form, S = 1 and the
other layers; at flash TP4 the gather is 16 blocks of 135 rows. Before/after cases:
tests/passes/raw-kv-gather-per-request/."""
from __future__ import annotations

import numpy as np
import pytest

import runner
from dspark_ir import layers
from dspark_ir.semantics.sparse import request_window_rows
from passes import PassContext, run_pipeline

from .layer_support import SEEDS, golden_mismatches, optimise, skips, statuses, tiny

NAME = "raw-kv-gather-per-request"
BOTH = "hca-raw-kv-no-transpose," + NAME


def _check_request_form(g, requests: int, rows: int, contiguous: bool = True) -> None:
    assert not g.ops("swa_gather_kv") and not g.ops("hca_raw_attn_direct")
    gather, = g.ops("hca_request_kv_gather")
    attn, = g.ops("hca_raw_attn_request")
    assert gather.result.type.concrete_shape(g.env)[:2] == (requests, rows)
    assert gather.attrs["blocks"].value(g.env) == requests and gather.attrs["contiguous"] is contiguous
    assert attn.operands[1] is gather.result and attn.operands[2].name == "swa_indices"
    assert g.nodes["hca.hca_stream_merge"].operands[:3] == attn.results


@pytest.mark.parametrize("tp", [1, 2, 4])
@pytest.mark.parametrize("seed", SEEDS)
def test_bitwise_on_tiny_hca_and_within_the_golden_tolerance(tp, seed):
    g = tiny("decode-hca", tp=tp)
    result = optimise(g, BOTH, seed)                       # the bitwise contract is checked on golden inputs
    assert statuses(result) == {"hca-raw-kv-no-transpose": "changed", NAME: "changed"}
    _check_request_form(result.graph, g.env["B"], 16 + 3)
    assert not golden_mismatches(result.graph, seed)


def test_two_tokens_per_request():
    g = layers.build("decode-hca", config="tiny", tp=1, seq=2)
    result = optimise(g, BOTH, 2)
    _check_request_form(result.graph, g.env["B"], 16 + 1)
    assert not golden_mismatches(result.graph, 2)


def test_short_windows_reach_the_request_offsets():
    """Non-vacuity: TP1's inputs have requests whose first token sees fewer than W rows, so their later tokens
    append at e_{t0} + k − 1 < W − 1, and the request row list holds −1 past them."""
    g = tiny("decode-hca", tp=1)
    idx = runner.layer_inputs(g, 0)["swa_indices"]
    ridx = request_window_rows(idx, g.env["S"])
    short = (idx[:, -1] < 0).reshape(-1, g.env["S"])[:, 0]
    assert short.any() and (ridx[short][:, -1] < 0).all() and (ridx[~short] >= 0).all()


def test_option_toggles_the_one_run_copy():
    result = optimise(tiny("decode-hca", tp=4), f"hca-raw-kv-no-transpose,{NAME}{{contiguous=false}}", 1)
    _check_request_form(result.graph, 2, 19, contiguous=False)
    assert str(result.pipeline).endswith(f"{NAME}{{contiguous=false}}")


def test_explains_why_not():
    transposed = optimise(tiny("decode-hca"), NAME, numerics=False)
    assert statuses(transposed) == {NAME: "no-op"}
    assert "run hca-raw-kv-no-transpose first" in skips(transposed, NAME)["hca.hca_raw_attn"]
    one = optimise(layers.build("decode-hca", config="tiny", tp=1, seq=1, batch=32), BOTH, numerics=False)
    assert skips(one, NAME) == {"hca.hca_raw_attn_direct": "S = 1: one token per request, its window gather is "
                                                            "already the request's"}
    again = optimise(optimise(tiny("decode-hca"), BOTH, numerics=False).graph, NAME, numerics=False)
    assert not again.changed and skips(again, NAME) == {"hca.hca_raw_attn_request": "already reads per-request rows"}


@pytest.mark.parametrize("layer", ["decode-swa", "decode-csa", "moe"])
def test_does_not_apply_to_other_layers(layer):
    result = optimise(tiny(layer), NAME, numerics=False)
    run_, = result.runs
    assert (run_.status, run_.note) == ("not-applicable", f"needs layer decode-hca, graph is {layer}")


def test_fires_at_flash_tp4_with_135_row_requests():
    g = layers.build("decode-hca", config="flash", tp=4)
    result = run_pipeline(g, BOTH, ctx=PassContext(use_env=False, check_numerics=False))
    _check_request_form(result.graph, 16, 128 + 7)          # B = 16 requests of W + S − 1 = 135 rows
    before = g.nodes["hca.hca_gather_kv"].result.type.concrete_shape(g.env)
    after = result.graph.ops("hca_request_kv_gather")[0].result.type.concrete_shape(result.graph.env)
    assert np.prod(before) / np.prod(after) > 7                # 128·128 rows → 16·135 rows

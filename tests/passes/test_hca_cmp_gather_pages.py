"""hca-cmp-gather-pages on the layers: bitwise on tiny HCA at TP1/2/4 (3 seeds) and still within the golden
tolerance; explains itself on CSA (no separate compressed gather); at flash the gather's grid halves (4-page work
items, 2 per block). Before/after cases: tests/passes/hca-cmp-gather-pages/."""
from __future__ import annotations

import pytest

from dspark_ir import layers, parse_graph
from passes import get_pass

from .layer_support import SEEDS, golden_mismatches, optimise, skips, statuses, tiny
from .support import HERE

PASS = "hca-cmp-gather-pages"
GATHER = "hca.hca_cmp_work_gather"


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("tp", (1, 2, 4))
def test_bitwise_on_tiny_hca_and_within_the_golden_tolerance(tp, seed):
    g = tiny("decode-hca", tp)                               # tiny: 2-page work items, so 4 items per block
    result = optimise(g, PASS, seed)
    assert statuses(result) == {PASS: "changed"}
    node = result.graph.nodes[GATHER]
    items = g.env["B"] * node.attrs["works"]
    assert node.attrs["items_per_block"] == min(4, items)
    assert node.attrs["blocks"].value(g.env) == -(-items // 4)
    assert not golden_mismatches(result.graph, seed)


def test_explains_itself_on_csa():
    result = optimise(tiny("decode-csa"), PASS, numerics=False)
    assert statuses(result) == {PASS: "no-op"}
    assert skips(result, PASS) == {"csa.qk_pv": "CSA gathers its compressed rows inside qk_pv (no separate gather "
                                                "task)"}


@pytest.mark.parametrize(("tp", "was", "now"), [(4, 16, 8), (1, 64, 32)])
def test_flash_grid(tp, was, now):
    g = layers.build("decode-hca", config="flash", tp=tp, max_context=8192)
    after = optimise(g, PASS, numerics=False).graph
    assert [x.nodes[GATHER].attrs["blocks"].value(g.env) for x in (g, after)] == [was, now]


def test_skip_reasons():
    case = parse_graph((HERE / PASS / "no_fire.before.dsir").read_text())
    reasons = {s.at: s.reason for s in get_pass(PASS)().match(case)}
    assert reasons == {"a.hca_cmp_work_gather": "a work item already holds 8 pages (pages = 8): nothing to group",
                       "b.hca_cmp_work_gather": "one work item: one block already",
                       "c.hca_cmp_work_gather": "already 2 work items per block"}


def test_explains_itself_on_swa():
    result = optimise(tiny("decode-swa"), PASS, numerics=False)
    assert statuses(result) == {PASS: "no-op"}
    assert skips(result, PASS) == {"swa.qk_pv": "SWA attends over the raw window only: no compressed KV to gather"}

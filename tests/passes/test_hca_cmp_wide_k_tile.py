"""hca-cmp-wide-k-tile on the layers: on tiny decode-hca built with one page per compressed work item (the seed's
TP1 form before pypto-lib #1228), the contract approx(2e-2, 2e-2) holds at TP1 (and, with max_tp = 4, at TP2/TP4)
for 3 seeds, the result is the graph the layer builds with the tiles' pages per item (the goldens' form) and holds
the golden; a no-op that explains itself on the default graphs (items already wide), at TP > max_tp and on the
layers without a compressed branch. Flash TP1 at 8K and 128K context: T·works blocks fewer (2 → 1, 32 → 8). A
planted fault (the per-page mask lost) breaks the contract. Before/after cases: tests/passes/hca-cmp-wide-k-tile/."""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

import runner
from dspark_ir import layers
from dspark_ir.interp import run
from dspark_ir.ops.sparse import HcaCmpQkPv
from passes import PassContext, run_pipeline
from passes.infra.contracts import check_outputs
from passes.infra.pipeline import parse_pipeline
from passes.infra.registry import get_pass

from .layer_support import SEEDS, golden_mismatches, optimise, skips, statuses, tiny

PASS = "hca-cmp-wide-k-tile"
QK = "hca.hca_cmp_qk_pv"


@lru_cache(maxsize=None)
def one_page(tp: int):
    return layers.build("decode-hca", config="tiny", tp=tp, cmp_pages_per_work=1)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_contract_on_tiny_hca_and_equal_to_the_tiles_build(tp, seed):
    spec = PASS if tp == 1 else f"{PASS}{{max_tp=4}}"
    result = optimise(one_page(tp), spec, seed)         # the approx contract is checked on the seed's inputs
    assert statuses(result) == {PASS: "changed"}
    assert result.graph.structurally_equal(tiny("decode-hca", tp))
    assert not golden_mismatches(result.graph, seed)


def test_one_page_before_holds_the_golden_too():
    assert not golden_mismatches(one_page(1), 0)


@pytest.mark.parametrize("tp", [1, 2, 4])
def test_explains_why_not_on_the_default_graphs(tp):
    result = optimise(tiny("decode-hca", tp), PASS, numerics=False)
    assert statuses(result) == {PASS: "no-op"}
    why = skips(result, PASS)[QK]
    assert ("already 16 rows" in why) if tp == 1 else ("max_tp = 1" in why)


@pytest.mark.parametrize("layer", ["decode-swa", "decode-csa", "moe"])
def test_no_op_without_the_compressed_branch(layer):
    result = optimise(tiny(layer, 1), PASS, numerics=False)
    assert statuses(result) == {PASS: "no-op"} and not skips(result, PASS)


def test_options_round_trip():
    for text in (f"{PASS}{{k_tile=64}}", f"{PASS}{{max_tp=4}}", f"{PASS}{{k_tile=32,max_tp=2}}"):
        assert str(parse_pipeline(str(parse_pipeline(text)))) == text
    assert str(parse_pipeline(f"{PASS}{{k_tile=0,max_tp=1}}")) == PASS


def test_planted_fault_lost_page_mask_breaks_the_contract():
    """The same rewrite with a wrong visibility mask (only each request's first compressed row kept, as if the
    per-row mask of the wide tile were the first page's first row) must fail the contract: it is tight enough to
    see a mask error (measured: 45x the allowed difference on x_out)."""
    g = one_page(1)
    after = run_pipeline(g, PASS, ctx=PassContext(use_env=False)).graph.clone()
    node = after.nodes[QK]
    node.attrs = node.opdef.normalize_attrs({**node.attrs, "max_rows": 1})
    inputs = runner.layer_inputs(g, 0)
    before_out, after_out = run(g, inputs), run(after, inputs)
    contract = get_pass(PASS).contract
    assert check_outputs(contract, [[before_out[v.name] for v in g.returns]],
                         [[after_out[v.name] for v in after.returns]],
                         [v.name for v in g.returns], [v.name for v in after.returns]) is not None
    assert not np.array_equal(before_out[g.returns[0].name], after_out[after.returns[0].name])


@pytest.mark.parametrize("context, works", [(4096, (1, 1)), (8192, (2, 1)), (131072, (32, 8))])
def test_fires_at_flash_tp1(context, works):
    """8K context: 64 visible compressed rows per request, 2 one-page items → 1 item of 128 rows (T·2 → T·1
    blocks); at 4K the 32 rows are one item either way (only the K tile changes: 32 → 128 rows); at 128K (the
    caches grown to hold it) 1024 rows: 32 one-page items → 8 (T·32 → T·8 blocks)."""
    g = layers.build("decode-hca", config="flash", tp=1, batch=16, seq=8, max_context=context, cmp_pages_per_work=1)
    T = g.env["T"]
    # the firing and the grids only: the contract is checked on tiny above (flash golden inputs are hundreds of MiB
    # at 8K and GiBs at 128K, minutes per case)
    result = run_pipeline(g, PASS, ctx=PassContext(use_env=False, check_numerics=False))
    assert statuses(result) == {PASS: "changed"}
    for graph, n, rows in ((g, works[0], 32), (result.graph, works[1], 128)):
        qk = graph.nodes[QK]
        assert qk.opdef is HcaCmpQkPv and qk.attrs["work_rows"] == rows
        assert qk.attrs["blocks"].value(graph.env) == T * n

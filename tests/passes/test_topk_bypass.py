"""topk-bypass on the CSA layer (dspark-model.md §6(a)).

Numeric contract on tiny (3 seeds): the pass runs through the pass manager with --check-numerics on, fed inputs of
the regime under test, and the optimised graph matches the golden within the layer tolerances. On top of the
declared contract, the index-level contract of the pass docstring is checked at every intermediate value, per rank:
* per token row, the −1 padding positions are identical and the index set of the valid prefix is identical
  (ascending instead of score order where the bypass fired, bitwise where the guarded form fell back);
* the plan outputs valid_block_mask, sparse_bias and qk_order are bitwise, cmp_sparse_indices are a per-row
  permutation;
* every cache output is bitwise.
Regimes: short_cache and topk_boundary (the bypass fires; topk_boundary has tokens with visible == k exactly), and
long_cache (static: must not fire; guarded: every token falls back, so the graph outputs are bitwise).
"""
from __future__ import annotations

import numpy as np
import pytest

import runner
from dspark_cli.main import main
from dspark_ir import interp, layers
from dspark_ir.semantics.indexer import idx_topk_bounded, visible_lengths
from dspark_ir.semantics.topk_bypass import idx_topk_select
from passes import PassContext, run_pipeline
from passes.infra.contracts import check_outputs
from passes.infra.rewriting import set_attrs
from passes.topk_bypass import TopkBypass

LAYER = "decode-csa"
SEEDS = (0, 1, 2)
K = 16                       # tiny IDX_TOPK
BYPASS_CONTEXT = 4 * K + 3   # the longest kv_seq_len whose visible length is ≤ k (67 // 4 = 16): max_visible = 16
PLAN = "csa.csa_slots_build_valid_qk_plan"
PLAN_ORDER_FREE = ("csa.valid_block_mask", "csa.sparse_bias", "csa.qk_order")
CACHES = ("kv_cache", "cmp_kv", "cmp_state", "idx_kv_cache", "idx_kv_scale", "idx_cmp_state")


def quiet(**settings) -> PassContext:
    return PassContext(use_env=False, **settings)


def per_rank(x):
    return x if isinstance(x, list) else [x]


@pytest.fixture
def regime_inputs(monkeypatch):
    """Make --check-numerics feed layer graphs the inputs of one regime. The numerics instrument always asks for
    the "default" regime, which mixes long-cache requests into a graph whose max_context promises short ones."""
    real = runner.layer_inputs

    def use(regime: str) -> None:
        monkeypatch.setattr(runner, "layer_inputs", lambda g, seed, _regime="default": real(g, seed, regime))
    return use


def optimise(g, pipeline: str, seed: int):
    result = run_pipeline(g, pipeline, ctx=quiet(check_numerics=True, roundtrip_each=True, seed=seed))
    return result, result.graph


def topk_value(g) -> str:
    """The value the plan stage reads as its top-k list."""
    return g.nodes[PLAN].operands[0].name


def assert_index_contract(before, after, inputs) -> None:
    """The pass docstring's contract, per rank, on every intermediate value (module docstring)."""
    env_b, env_a = per_rank(interp.run(before, inputs, keep=True)), per_rank(interp.run(after, inputs, keep=True))
    for rank, (eb, ea, inp) in enumerate(zip(env_b, env_a, per_rank(inputs))):
        where = f"rank {rank}"
        ib, ia = eb[topk_value(before)], ea[topk_value(after)]
        np.testing.assert_array_equal(ia < 0, ib < 0, err_msg=f"{where}: −1 padding positions")
        np.testing.assert_array_equal(np.sort(ia, axis=1), np.sort(ib, axis=1), err_msg=f"{where}: index sets")
        visible = visible_lengths(inp["positions"], inp["kv_seq_len"], ratio=4, seq=before.symbols["S"],
                                  score_len=before.nodes["idx.topk"].attrs["score_len"])
        bypassed = visible <= K
        # bypassed rows are ascending; the others (the guarded fallback) are the top-k rows bit for bit
        bounded = idx_topk_bounded(inp["positions"], inp["kv_seq_len"], k=K, ratio=4, seq=before.symbols["S"],
                                   score_len=ia.shape[1])
        np.testing.assert_array_equal(ia[bypassed], bounded[bypassed], err_msg=f"{where}: bypassed rows")
        np.testing.assert_array_equal(ia[~bypassed], ib[~bypassed], err_msg=f"{where}: long-cache rows")
        for name in PLAN_ORDER_FREE:
            np.testing.assert_array_equal(ea[name], eb[name], err_msg=f"{where}: {name}")
        np.testing.assert_array_equal(np.sort(ea[PLAN], axis=1), np.sort(eb[PLAN], axis=1), err_msg=where)
        outs_b = runner.graph_outputs(before, {v.name: eb[v.name] for v in before.returns})
        outs_a = runner.graph_outputs(after, {v.name: ea[v.name] for v in after.returns})
        for name in CACHES:
            np.testing.assert_array_equal(np.asarray(outs_a[name]), np.asarray(outs_b[name]), err_msg=name)


def assert_matches_golden(g, inputs) -> None:
    comparisons = runner.compare_outputs(g, interp.run(g, inputs), runner.golden_outputs(g, inputs))
    bad = [f"{c.name}: {c.detail}" for c in comparisons if not c.ok]
    assert not bad, "; ".join(bad)


def rules(result) -> list[str]:
    return [r.rule for run in result.runs if run.name == "topk-bypass" for r in run.rewrites]


# ---- the numeric contract on tiny ---------------------------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("regime", ["short_cache", "topk_boundary"])
def test_static_bypass_is_exact(regime_inputs, regime, seed):
    regime_inputs(regime)
    g = layers.build(LAYER, max_context=BYPASS_CONTEXT)
    result, h = optimise(g, "topk-bypass", seed)
    assert rules(result) == ["static"] and "idx.topk" not in h.nodes
    assert h.nodes["idx.topk.bounded"].op == "idx_topk_bounded"
    inputs = runner.layer_inputs(g, seed, regime)
    if regime == "topk_boundary":  # the boundary visible == k is bypassed (and exercised)
        vis = [visible_lengths(i["positions"], i["kv_seq_len"], ratio=4, seq=4, score_len=128)
               for i in per_rank(inputs)]
        assert any((v == K).any() for v in vis)
    assert_index_contract(g, h, inputs)
    assert_matches_golden(h, inputs)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("regime", ["short_cache", "topk_boundary", "long_cache", "default"])
def test_guarded_bypass_is_exact(regime_inputs, regime, seed):
    """The default graph (max_visible = 64 > k): the per-token select bypasses short rows, keeps long ones."""
    regime_inputs(regime)
    g = layers.build(LAYER)
    result, h = optimise(g, "topk-bypass", seed)
    assert rules(result) == ["guarded"]
    assert h.nodes["idx.topk.select"].operands[0] is h.nodes["idx.topk"].result
    inputs = runner.layer_inputs(g, seed, regime)
    assert_index_contract(g, h, inputs)
    assert_matches_golden(h, inputs)
    if regime == "long_cache":  # every token falls back to the top-k: the whole layer is bitwise
        for a, b in zip(per_rank(interp.run(g, inputs)), per_rank(interp.run(h, inputs))):
            for vb, va in zip(g.returns, h.returns):
                np.testing.assert_array_equal(a[vb.name], b[va.name])


@pytest.mark.parametrize("seed", SEEDS)
def test_static_mode_does_not_fire_on_long_cache(regime_inputs, seed):
    regime_inputs("long_cache")
    g = layers.build(LAYER)
    result, h = optimise(g, "topk-bypass{mode=static}", seed)
    assert not result.changed and h.structurally_equal(g)
    (skip,) = result.runs[0].skips
    assert skip.at == "idx.topk" and "max_visible = 64" in skip.reason and "mode=guarded" in skip.reason
    assert_matches_golden(h, runner.layer_inputs(g, seed, "long_cache"))


def test_a_wrong_bound_breaks_the_contract():
    """Non-vacuity: a bounded writer one entry short (k = 15) at the topk_boundary regime fails both the index
    check and the declared contract on the layer outputs."""
    g = layers.build(LAYER, max_context=BYPASS_CONTEXT)
    h = run_pipeline(g, "topk-bypass", ctx=quiet(check_numerics=False)).graph
    set_attrs(h, h.nodes["idx.topk.bounded"], k=K - 1)
    inputs = runner.layer_inputs(g, 0, "topk_boundary")
    with pytest.raises(AssertionError):
        assert_index_contract(g, h, inputs)
    before, after = per_rank(interp.run(g, inputs)), per_rank(interp.run(h, inputs))
    violation = check_outputs(TopkBypass.contract, [[o[v.name] for v in g.returns] for o in before],
                              [[o[v.name] for v in h.returns] for o in after],
                              [v.name for v in g.returns], [v.name for v in h.returns])
    assert violation is not None


# ---- pipeline position: dce removes the indexer query side, never the cache writes ------------------------
def test_default_pipeline_drops_the_dead_indexer_and_keeps_the_cache_writes(regime_inputs):
    regime_inputs("short_cache")
    g = layers.build(LAYER, max_context=64)
    result = run_pipeline(g, ctx=quiet(check_numerics=True))
    h = result.graph
    assert rules(result) == ["static"]
    names = [r.pass_.name for r in result.runs]
    assert names.index("topk-bypass") < names.index("dce")
    dead = {"idx.score", "idx.topk", "idx.qr_hadamard_quant", "idx.weights_proj", "idx.weights_proj_reduce",
            "idx.idx_qr_proj_matmul", "csa.rope_interleave.step"}
    assert not dead & set(h.nodes)
    kept = {"icmp.kv_score_proj", "icmp.scatter_softmax_pool", "icmp.rmsnorm_rope", "icmp.kv_hadamard",
            "icmp.kv_and_cache_write", "idx.topk.bounded"}
    assert kept <= set(h.nodes)
    assert_matches_golden(h, runner.layer_inputs(g, 0, "short_cache"))


# ---- where it must not fire -----------------------------------------------------------------------------
@pytest.mark.parametrize("layer", ["decode-swa", "decode-hca", "moe"])
def test_no_op_on_layers_without_an_indexer(layer):
    result = run_pipeline(layers.build(layer), "topk-bypass", ctx=quiet(check_numerics=False))
    assert result.runs[0].status == "no-op" and not result.runs[0].skips


def test_guarded_form_is_not_guarded_twice():
    once = run_pipeline(layers.build(LAYER), "topk-bypass", ctx=quiet(check_numerics=False)).graph
    again = run_pipeline(once, "topk-bypass", ctx=quiet(check_numerics=False))
    assert not again.changed
    assert [s.reason for s in again.runs[0].skips] == ["already guarded by %idx.topk.select"]


# ---- flash TP4: where the seed PR applied it (graph level only) ---------------------------------------------
def test_flash_tp4_cli_inserts_the_guarded_bypass(capsys):
    """Flash's cache extent allows 2048 entries against k = 512, so only the runtime branch applies: the seed PR's
    CSA TP4 case (positions < ~2048 bypass)."""
    assert main(["opt", LAYER, "--config", "flash", "--tp", "4", "--only", "topk-bypass", "--no-check-numerics",
                 "--no-env"]) == 0
    out = capsys.readouterr().out
    (line,) = [ln.strip() for ln in out.splitlines() if ln.strip().startswith("%idx.topk.select = ")]
    assert line.startswith("%idx.topk.select = idx_topk_select(%idx.topk, %positions, %kv_seq_len)")
    assert "k = 512" in line and "score_len = 4096" in line
    assert "csa_slots_build_valid_qk_plan(%idx.topk.select," in out


def test_flash_tp4_static_when_the_context_fits():
    g = layers.build(LAYER, config="flash", tp=4, max_context=4 * 512)
    result = run_pipeline(g, "topk-bypass,dce", ctx=quiet(check_numerics=False))
    h = result.graph
    assert rules(result) == ["static"]
    writer = h.nodes["idx.topk.bounded"]
    assert writer.op == "idx_topk_bounded" and writer.attrs["k"] == 512 and writer.attrs["score_len"] == 4096
    assert h.nodes[PLAN].operands[0] is writer.result
    assert "idx.score" not in h.nodes and "icmp.kv_and_cache_write" in h.nodes


# ---- options and the select op's reference -----------------------------------------------------------------
def test_mode_option_round_trips():
    from passes.infra.pipeline import parse_pipeline

    assert str(parse_pipeline("topk-bypass{mode=static}")) == "topk-bypass{mode=static}"
    assert str(parse_pipeline("topk-bypass{mode=guarded}")) == "topk-bypass"


def test_select_bypasses_up_to_and_including_k():
    """visible == k takes the bounded row, visible == k + 1 keeps the fallback (ratio 1, seq 1: visible = pos + 1
    when kv_seq_len allows)."""
    k, width = 3, 6
    positions = np.array([0, 2, 3, 5], np.int32)           # visible 1, 3 (= k), 4, 6
    kv_seq_len = np.full(4, 64, np.int32)
    fallback = np.tile(np.array([5, 4, 3, 2, 1, 0], np.int32), (4, 1))
    out = idx_topk_select(fallback, positions, kv_seq_len, k=k, ratio=1, seq=1, score_len=width)
    bounded = idx_topk_bounded(positions, kv_seq_len, k=k, ratio=1, seq=1, score_len=width)
    np.testing.assert_array_equal(out[:2], bounded[:2])
    assert out[1].tolist() == [0, 1, 2, -1, -1, -1]
    np.testing.assert_array_equal(out[2:], fallback[2:])

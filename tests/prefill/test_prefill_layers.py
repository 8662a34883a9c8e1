"""prefill-swa / prefill-hca / prefill-csa: the graph on the reference interpreter against the independent prefill
golden (goldens/prefill.py), chunk T per rank ∈ {1, 7, 512, 1024, 2048}, TP1 and TP4, three seeds; planted faults the
comparison must catch; the CLI's --chunk / --start. prefill-csa's top-k is `idx_topk` with the seed's staged sort:
past a 256-entry score prefix it needs the topk-merge-stage pass (the default pipeline) to match the golden."""
from __future__ import annotations

import numpy as np
import pytest

import runner
from dspark_ir import interp, layers
from dspark_ir.ops.indexer import SEED_PREFILL_SORT_STAGES, IdxTopk
from goldens import config as gc
from goldens import prefill as gp

LAYERS = ("prefill-swa", "prefill-hca", "prefill-csa")
SEEDS = (0, 1, 2)


def _run(layer: str, tp: int, chunk: int, seed: int, start: int = 0, passes=None):
    """The layer (through the default pipeline when `passes` is a PassContext) against the golden."""
    from passes import run_pipeline

    g = layers.build(layer, "tiny", tp=tp, chunk=chunk, start=start)
    inputs = runner.layer_inputs(g, seed)
    golden = runner.golden_outputs(g, inputs)
    if passes is not None:
        g = run_pipeline(g, ctx=passes).graph
    result = interp.run(g, inputs)
    return g, inputs, golden, runner.compare_outputs(g, result, golden, inputs)


def _default(**toggles):
    from passes import PassContext

    return PassContext(use_env=False, **toggles)


def _failed(comparisons) -> list[str]:
    return [f"{c.name}: {c.detail}" for c in comparisons if not c.ok]


@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("tp", (1, 4))
@pytest.mark.parametrize("chunk,start", [(1, 0), (7, 0), (7, 13), (40, 21)])
def test_small_chunks_match_the_golden(layer, tp, chunk, start):
    for seed in SEEDS:
        assert _failed(_run(layer, tp, chunk, seed, start)[3]) == [], (layer, tp, chunk, start, seed)


@pytest.mark.slow
@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("tp", (1, 4))
@pytest.mark.parametrize("chunk", (512, 1024, 2048))
def test_long_chunks_match_the_golden(layer, tp, chunk):
    """prefill-csa through the default pipeline: topk-merge-stage widens the staged top-k sort to its prefix."""
    passes = _default() if layer == "prefill-csa" else None
    for seed in SEEDS:
        assert _failed(_run(layer, tp, chunk, seed, passes=passes)[3]) == [], (layer, tp, chunk, seed)


@pytest.mark.slow
def test_csa_topk_without_a_wide_merge_stage_picks_wrong_keys():
    """TP4, 4·512 tokens: tokens see up to 512 entries; the seed's widest sort stage (256) leaves the prefix sorted
    only in runs of 256, the top-k takes wrong keys and x_out fails, with no passes and with the default pipeline
    minus topk-merge-stage; the default pipeline adds the 1024 stage and gives the right keys."""
    for passes in (None, _default(disabled=("topk-merge-stage",))):
        comps = _run("prefill-csa", 4, 512, 0, passes=passes)[3]
        assert any(c.name == "x_out" and not c.ok for c in comps), passes
    g, _, _, comps = _run("prefill-csa", 4, 512, 0, passes=_default())
    assert _failed(comps) == [] and g.nodes["idx.topk"].attrs["sort_stages"] == (32, 64, 256, 1024)


def test_csa_topk_is_the_staged_idx_topk_the_pass_widens():
    """prefill-csa builds `idx_topk` with the seed's sort stages, capped at the chunk's score prefix; the default
    pipeline appends the 1024 stage exactly where that cap exceeds 256 (TP4: 4·40 tokens, cap 64; 4·512, cap 512)."""
    from passes import run_pipeline

    for chunk, widened in ((40, False), (512, True)):
        g = layers.build("prefill-csa", "tiny", tp=4, chunk=chunk)
        node = g.nodes["idx.topk"]
        assert node.opdef is IdxTopk and node.attrs["sort_stages"] == SEED_PREFILL_SORT_STAGES
        assert node.attrs["max_visible"] == gc.prefill_score_len(layers.graph_config(g), chunk, 0)
        assert (node.attrs["max_visible"] > 256) == widened
        out = run_pipeline(g, ctx=_default()).graph.nodes["idx.topk"].attrs["sort_stages"]
        assert out == (SEED_PREFILL_SORT_STAGES + (1024,) if widened else SEED_PREFILL_SORT_STAGES)
        off = run_pipeline(g, ctx=_default(disabled=("topk-merge-stage",))).graph
        assert off.nodes["idx.topk"].attrs["sort_stages"] == SEED_PREFILL_SORT_STAGES


def test_staged_topk_semantics_show_the_missing_merge_stage():
    """idx_topk's numpy semantics: a prefix of 300 entries, the seed's stages (widest 256) → the best entry past the
    first run is never taken; with the 1024 stage the true top-k (what the golden's full sort gives)."""
    from dspark_ir.semantics.indexer import idx_topk

    rng = np.random.default_rng(0)
    score = rng.standard_normal((1, 300)).astype(np.float32)
    score[0, 280] = 100.0                       # the best key lies past the first 256-run
    args = (score, np.array([1199], np.int32), np.array([1200], np.int32))
    attrs = dict(k=16, ratio=4, seq=1, score_len=300, max_visible=300)
    seed = idx_topk(*args, sort_stages=SEED_PREFILL_SORT_STAGES, **attrs)[0, :16]
    fixed = idx_topk(*args, sort_stages=SEED_PREFILL_SORT_STAGES + (1024,), **attrs)[0, :16]
    assert 280 not in seed and fixed[0] == 280
    assert list(fixed) == list(gp.full_sort_topk(score, np.array([300]), 16)[0])


def test_hca_chunk_pools_every_boundary_and_attends_them():
    """A TP4 chunk of 4·40 tokens closes 10 ratio-16 windows: every one is written (not only the first, as in
    decode), and a wrong compressed row would move x_out (the comparison is not vacuous)."""
    g, inputs, golden, comps = _run("prefill-hca", 4, 40, 0)
    assert _failed(comps) == []
    slots = np.concatenate([d["cmp_slot_mapping"] for d in inputs])
    assert (slots >= 0).sum() == 160 // gc.TINY.hca_ratio
    changed = np.any(golden[0]["cmp_kv"] != inputs[0]["cmp_kv"], axis=1)
    assert changed.sum() == 10
    bad = [dict(d, cmp_norm_w=2 * d["cmp_norm_w"]) for d in inputs]   # the compressed entries change …
    moved = gp.run_prefill("prefill_hca", layers.graph_config(g), bad)
    assert not np.array_equal(moved[3]["x_out"], golden[3]["x_out"])    # … and the queries attending them move


def test_a_planted_window_fault_is_caught():
    """The SWA window shifted by one row on the graph side fails the comparison."""
    g = layers.build("prefill-swa", "tiny", tp=1, chunk=40, start=5)
    inputs = runner.layer_inputs(g, 0)
    golden = runner.golden_outputs(g, inputs)
    shifted = dict(inputs, swa_indices=np.roll(inputs["swa_indices"], 1, axis=1))
    result = interp.run(g, shifted)
    assert _failed(runner.compare_outputs(g, result, golden, inputs))


def test_prefill_compressor_pool_reads_history_from_the_state():
    """A chunk starting inside a window (start 21, R 16): the first entry pools rows 16…20 from the state; a
    graph run whose state history is zeroed differs from the golden."""
    g = layers.build("prefill-hca", "tiny", tp=1, chunk=40, start=21)
    inputs = runner.layer_inputs(g, 0)
    golden = runner.golden_outputs(g, inputs)
    wiped = dict(inputs, cmp_state=np.zeros_like(inputs["cmp_state"]))
    result = interp.run(g, wiped)
    failed = _failed(runner.compare_outputs(g, result, golden, inputs))
    assert any(f.startswith("cmp_kv") for f in failed), failed


def test_chunk_is_checked():
    from dspark_ir.errors import ConfigError

    with pytest.raises(ConfigError, match="chunk"):
        layers.build("prefill-swa", "tiny", chunk=0)
    with pytest.raises(ConfigError, match="chunk"):
        layers.build("prefill-hca", "tiny", chunk=8193)
    with pytest.raises(ConfigError, match="start"):
        layers.build("prefill-hca", "tiny", chunk=8, start=-1)


def test_flash_graphs_build_at_the_range_ends():
    for layer in LAYERS:
        for tp in (1, 4):
            for chunk in (1, 8192):
                g = layers.build(layer, "flash", tp=tp, chunk=chunk)
                assert g.symbols["T"] == chunk and layers.graph_config(g).tokens == chunk


def test_cli_run_chunk(capsys):
    from dspark_cli.main import main

    assert main(["run", "prefill-hca", "--tp", "4", "--chunk", "7", "--start", "9", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "ok: 4/4 outputs within tolerance (all 4 ranks)" in out
    assert main(["run", "decode-swa", "--chunk", "7"]) != 0
    assert "--chunk" in capsys.readouterr().err


@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("tp", (1, 4))
def test_default_pipeline_fires_or_skips_and_keeps_the_numbers(layer, tp):
    """Every pass of the default pipeline either rewrites with its contract holding or skips with a reason (pass
    statistics); the optimised graph still matches the golden. Chunk 8: T % 4 == 0, so split-writeback-bias fires
    on prefill-swa."""
    from passes import PassContext, run_pipeline

    g = layers.build(layer, "tiny", tp=tp, chunk=8, start=9)
    inputs = runner.layer_inputs(g, 0)
    golden = runner.golden_outputs(g, inputs)
    result = run_pipeline(g, ctx=PassContext(use_env=False))
    out = result.graph
    assert _failed(runner.compare_outputs(out, interp.run(out, inputs), golden, inputs)) == []
    if layer == "prefill-swa":
        assert "swa.swa_cache_insert_valid_bias" not in out.nodes    # split into write-back + valid bias

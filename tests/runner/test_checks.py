"""Issue 20's checks: buffers compared on their written rows, x_out per row and channel, the regimes and HC
weights that exercise every branch, and the sub-block checks."""
from __future__ import annotations

import dataclasses

import numpy as np

import runner
from dspark_ir import interp, layers
from goldens import hc as ghc
from goldens import inputs as gi
from goldens import layers as gl
from goldens.config import TINY
from goldens.tolerances import rows_channels


def run(layer, tp=1, seed=0, regime="default"):
    g = layers.build(layer, tp=tp)
    inputs = runner.layer_inputs(g, seed, regime)
    return g, inputs, runner.golden_outputs(g, inputs), runner.graph_outputs(g, interp.run(g, inputs))


def verdicts(g, result, golden, inputs):
    names = list(g.attributes["outputs"])
    values = {n: result[n] for n in names}
    renamed = {v.name: values[n] for n, v in zip(names, g.returns)}
    return {c.name: c.ok for c in runner.compare_outputs(g, renamed, golden, inputs)}


def test_a_rope_sign_in_the_written_rows_fails_though_they_are_few():
    g, inputs, golden, result = run("decode-swa")
    rows = gi.written_rows("swa", layers.graph_config(g), inputs)["kv_cache"]
    assert len(rows) == 32 and len(inputs["kv_cache"]) == 2048
    bad = np.asarray(result["kv_cache"], np.float32).copy()
    bad[rows, -1] *= -1                                     # the last rope element of every written row
    assert not verdicts(g, dict(result, kv_cache=bad), golden, inputs)["kv_cache"]


def test_an_unwritten_row_must_come_back_unchanged():
    g, inputs, golden, result = run("decode-csa")
    cfg = layers.graph_config(g)
    for name, rows in gi.written_rows("csa", cfg, inputs).items():
        other = np.setdiff1d(np.arange(len(inputs[name])), rows)[0]
        bad = np.asarray(result[name]).copy()
        bad[other] = bad[other] + (1 if bad.dtype.kind in "iu" else 0.5)
        assert not verdicts(g, dict(result, **{name: bad}), golden, inputs)[name], name


def test_written_rows_cover_every_change_of_the_golden():
    for kind in ("csa", "hca"):
        for regime in ("default", "cmp_boundary", "empty_cmp"):
            cfg = TINY.with_(tp=1)
            inputs = gi.make_inputs(kind, cfg, 5, regime)
            out = gl.run_layer(kind, cfg, inputs)
            for name, rows in gi.written_rows(kind, cfg, inputs).items():
                changed = np.flatnonzero(np.any((out[name] != inputs[name]).reshape(len(out[name]), -1), axis=1))
                assert set(changed) <= set(rows), (kind, regime, name)


def test_x_out_allows_flipped_rows_but_no_channel():
    rng = np.random.default_rng(0)
    e = rng.standard_normal((32, 4, 256))
    flips = e.copy()
    flips[5:9] *= 1.02                                       # one request's rows moved by a midpoint flip
    assert rows_channels(flips, e, diff=3e-3, row_max=0.04, rows=4)
    channel = e.copy()
    channel[..., 7] *= 1.05                                  # one channel scaled: every token
    assert not rows_channels(channel, e, diff=3e-3, row_max=0.04, rows=4)
    one_row = e.copy()
    one_row[3] *= 1.05                                       # one row beyond what a flip moves
    assert not rows_channels(one_row, e, diff=3e-3, row_max=0.04, rows=4)


def test_the_default_regime_covers_every_regime_at_tp4():
    cfg = TINY.with_(tp=4)
    starts = np.concatenate([r["positions"][:: cfg.seq] for r in gi.make_rank_inputs("csa", cfg, 0)])
    hit = {"empty_cmp": np.any(starts == 0),
           "cmp_boundary": np.any([np.any((s + np.arange(cfg.seq) + 1) % cfg.hca_ratio == 0) for s in starts]),
           "window_boundary": np.any((starts <= cfg.window - 1) & (starts + cfg.seq > cfg.window)),
           "long_cache": np.any((starts + 1) // cfg.csa_ratio > cfg.idx_topk)}
    assert all(hit.values()), hit


def test_hc_weights_keep_sinkhorn_moving_at_iteration_20():
    cfg = TINY.with_(tp=1)
    for kind in ("swa", "moe"):
        inputs = gi.make_inputs(kind, cfg, 0)
        mix = ghc.hc_mix(cfg, inputs["x_hc"], inputs["hc_fn"])
        at = {n: ghc.hc_gates(dataclasses.replace(cfg, sinkhorn_iters=n), mix, inputs["hc_scale"],
                              inputs["hc_base"])[2] for n in (19, 20)}
        assert 3e-4 < np.abs(at[20] - at[19]).max() < 1e-2, kind


def test_subblock_checks_see_what_the_layer_comparison_cannot(monkeypatch):
    from dspark_ir.ops import get_op

    g = layers.build("decode-swa", tp=1)
    inputs = runner.layer_inputs(g, 0)
    assert all(c.ok and c.bitwise for c in runner.subblock_checks(g, interp.run(g, inputs, keep=True)))
    fn = get_op("comb_sinkhorn").reference
    nineteen = staticmethod(lambda *a, **k: fn(*a, **{**k, "iters": 19}))
    monkeypatch.setattr(get_op("comb_sinkhorn"), "reference", nineteen)
    bad = [c.name for c in runner.subblock_checks(g, interp.run(g, inputs, keep=True)) if not c.ok]
    assert bad == ["hc.comb (hc.comb_sinkhorn)"]

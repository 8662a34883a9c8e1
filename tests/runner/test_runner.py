"""runner: a layer graph's golden inputs, the golden's outputs, the comparison, and what --check-numerics runs on."""
from __future__ import annotations

import numpy as np
import pytest

import runner
from dspark_ir import ConfigError, DsparkError, interp, layers, parse_graph, verify
from goldens import inputs as gi
from goldens import layers as gl

G = """graph @s<T = 4>(%x: bf16[T,8]) {
  %a.n = add(%x, %x) : bf16[T,8]
  return %a.n
}"""


def graph_with(attributes: str):
    g = parse_graph(G.replace(") {\n  %a.n", f") attributes {{{attributes}}} {{\n  %a.n"))
    verify(g)
    return g


def test_layer_inputs_are_the_goldens_typed_like_the_graph():
    g = layers.build("decode-swa", tp=1)
    inputs = runner.layer_inputs(g, 3)
    raw = gi.make_inputs("swa", layers.graph_config(g), 3)
    assert list(inputs) == [p.name for p in g.params]
    for p in g.params:
        assert inputs[p.name].shape == p.type.concrete_shape(g.env), p.name
        assert np.array_equal(np.asarray(inputs[p.name], np.float64), np.asarray(raw[p.name], np.float64)), p.name


def test_ranks_give_one_dict_per_rank():
    g = layers.build("decode-swa", tp=4)
    inputs = runner.layer_inputs(g, 0)
    assert isinstance(inputs, list) and len(inputs) == 4
    golden = runner.golden_outputs(g, inputs)
    assert isinstance(golden, list) and len(golden) == 4 and list(golden[0]) == ["x_out", "kv_cache"]


def test_interpreter_matches_the_golden_and_a_wrong_result_fails():
    g = layers.build("decode-swa", tp=1)
    inputs = runner.layer_inputs(g, 0)
    golden = runner.golden_outputs(g, inputs)
    result = interp.run(g, inputs)
    assert all(c.ok for c in runner.compare_outputs(g, result, golden))
    x_out = g.returns[0].name
    broken = dict(result, **{x_out: np.asarray(result[x_out], np.float32) + 1.0})
    verdicts = {c.name: c.ok for c in runner.compare_outputs(g, broken, golden)}
    assert verdicts == {"x_out": False, "kv_cache": True}


def test_graph_outputs_rename_to_the_golden_names():
    g = graph_with('outputs = ["y"]')
    assert runner.graph_outputs(g, {"a.n": 1}) == {"y": 1}
    assert runner.graph_outputs(g, [{"a.n": 1}, {"a.n": 2}]) == [{"y": 1}, {"y": 2}]


def test_regimes_come_from_the_goldens():
    assert runner.regimes("decode-csa") == tuple(gi.regimes_for("csa"))
    with pytest.raises(DsparkError, match="unknown layer 'decode-swx'"):
        runner.regimes("decode-swx")


def test_max_context_picks_a_regime_that_keeps_the_promise():
    g = layers.build("decode-csa", tp=1, max_context=64)
    with pytest.raises(ConfigError, match="beyond this graph's max_context = 64"):
        runner.layer_inputs(g, 0, "long_cache")
    assert runner.layer_inputs(g, 0)  # default: the first regime within max_context


def test_sample_inputs_delegate_layer_graphs_to_layer_inputs(monkeypatch):
    seen = []
    monkeypatch.setattr(layers, "LAYER_NAMES", ("decode-swa",))
    monkeypatch.setattr(runner, "layer_inputs", lambda g, seed: seen.append((g.name, seed)) or {"x": 1})
    assert runner.sample_inputs(graph_with('layer = "decode-swa"'), 7) == {"x": 1} and seen == [("s", 7)]
    other = runner.sample_inputs(graph_with('layer = "example"'), 7)        # not a registered layer
    assert isinstance(other["x"], np.ndarray) and seen == [("s", 7)]


def test_golden_outputs_are_the_goldens_own():
    g = layers.build("moe", tp=1, ep=1)
    inputs = runner.layer_inputs(g, 0)
    want = gl.run_layer(g.attributes["kind"], layers.graph_config(g), dict(inputs))
    got = runner.golden_outputs(g, inputs)
    assert list(got) == list(want) and all(np.array_equal(got[k], want[k]) for k in want)

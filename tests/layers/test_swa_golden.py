"""decode-swa on the reference interpreter matches the independent golden (tiny; TP1, TP2, TP4; 3 seeds;
every input regime, including the window boundary), and the check is not vacuous."""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

import runner
from dspark_ir import layers
from dspark_ir.interp import run
from goldens.inputs import ATTENTION_REGIMES
from goldens.tolerances import compare, compare_layer

from .helpers import per_rank

SEEDS = (0, 1, 2)


@lru_cache(maxsize=None)
def graph(tp: int):
    return layers.build("decode-swa", tp=tp)


def check_layer(g, seed, regime):
    inputs = runner.layer_inputs(g, seed, regime)
    got = per_rank(runner.graph_outputs(g, run(g, inputs)))
    want = per_rank(runner.golden_outputs(g, inputs))
    assert len(got) == len(want) == g.attributes["ranks"]
    assert all(set(res) == set(gold) == {"x_out", "kv_cache"} for res, gold in zip(got, want))
    for c in compare_layer(got, want, "decode-swa", g.symbols["S"]):
        assert c.ok, f"{c.name}: {c.detail} (max abs {c.max_abs:.3g})"


@pytest.mark.parametrize("regime", ATTENTION_REGIMES)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("tp", [1, 4])
def test_swa_matches_golden(tp, seed, regime):
    check_layer(graph(tp), seed, regime)


@pytest.mark.parametrize("seed", SEEDS)
def test_swa_tp2_matches_golden(seed):
    check_layer(graph(2), seed, "window_boundary")


def test_tp4_graph_carries_the_collectives():
    g = graph(4)
    assert g.attributes["ranks"] == 4 and g.attributes["tp"] == 4
    assert [n.name for n in g.ops("o_group_a2a")] == ["o.o_group_a2a"]
    assert [n.name for n in g.ops("tp_o_reduce_scatter")] == ["o.tp_o_reduce_scatter"]
    assert not g.ops("o_group_a2a") or not graph(1).ops("o_group_a2a")


def _perturbed_runs(tp, mutate):
    g = graph(tp)
    inputs = runner.layer_inputs(g, 0, "default")
    base = per_rank(runner.golden_outputs(g, inputs))
    changed = [dict(d) for d in per_rank(inputs)]
    for d in changed:
        mutate(d)
    res = per_rank(runner.graph_outputs(g, run(g, changed if tp > 1 else changed[0])))
    return base, res


@pytest.mark.parametrize("tp", [1, 4])
@pytest.mark.parametrize("what", ["wkv", "wo_b_scale", "attn_sink", "kv_cache"])
def test_perturbing_an_input_breaks_the_match(tp, what):
    """Non-vacuity: change one weight (or the cache rows the window reads) and x_out leaves the tolerance."""
    def mutate(d):
        a = np.array(d[what], copy=True)
        if what == "kv_cache":
            a[...] = (a.astype(np.float32) * 2).astype(a.dtype)
        elif what == "attn_sink":
            a[...] = a + 4
        else:
            a[0] = (a[0].astype(np.float32) * 3 + 1).astype(a.dtype)
        d[what] = a
    base, res = _perturbed_runs(tp, mutate)
    assert not compare("x_out", np.concatenate([r["x_out"] for r in res]),
                       np.concatenate([b["x_out"] for b in base])).ok

"""Small helpers for the layer tests."""
from __future__ import annotations

import numpy as np

from dspark_ir import verify
from dspark_ir.interp import run
from goldens.tolerances import compare_layer


def bitwise(a, b) -> bool:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a.shape == b.shape and np.array_equal(a, b)


def f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def per_rank(x) -> list:
    """Per-rank results as a list (a one-rank run gives its result alone)."""
    return x if isinstance(x, list) else [x]


def run_case(g, inputs):
    """Run layer graph `g` on the reference interpreter: every rank's values, and its outputs by name."""
    envs = per_rank(run(g, inputs, keep=True))
    return envs, [{name: env[v.name] for name, v in zip(g.attributes["outputs"], g.returns)} for env in envs]


def assert_layer_matches(got, want, layer: str, seq: int) -> None:
    """Every rank's outputs within the layer's golden tolerance (goldens.tolerances.compare_layer)."""
    bad = [f"{c.name}: {c.detail}" for c in compare_layer(got, want, layer, seq) if not c.ok]
    assert not bad, "; ".join(bad)


MOE_NO_AER = ("moe.dispatch_gather", "moe.combine", "moe.combine_wait", "moe.shared_routed")


def moe_after_by_hand(g):
    """dspark-model.md §6(g) After, applied by hand to a copy of MoE graph `g` (the form moe-handshake-deps writes):
    a push → dispatch_wait edge, combine_wait = one notify + wait ≥ 1 gated on {combine, dispatch_push}, AER off
    on MOE_NO_AER. The copy, verified."""
    g = g.clone()
    n = g.nodes
    n["moe.dispatch_wait"].deps.append(g.values["moe.dispatch_push"])
    old = n["moe.combine_wait"]
    barrier = g.add_op("signal_barrier", list(old.operands), {"notifier": "moe.combine_wait", "expected": 1},
                       names="moe.combine_wait.after", near=old,
                       deps=[g.values["moe.combine"], g.values["moe.dispatch_push"]])
    g.replace_uses(old.result, barrier.result)
    g.remove_node(old)
    g.rename(barrier.result, "moe.combine_wait")
    n = g.nodes                                          # rename rebuilds the node table
    n["moe.combine"].attrs["notify_per"] = "none"
    for name in MOE_NO_AER:
        n[name].attrs.pop("aer", None)
    g.invalidate()
    verify(g)
    return g

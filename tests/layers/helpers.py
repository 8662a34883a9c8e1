"""Small helpers for the layer tests."""
from __future__ import annotations

import numpy as np

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

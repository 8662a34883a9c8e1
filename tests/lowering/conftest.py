"""Shared fixtures of the lowering tests: the hand-written graphs, seeded inputs, comparisons."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from dspark_ir import parse_file, verify

GRAPHS = Path(__file__).parent / "graphs"
GRAPH_NAMES = sorted(p.stem for p in GRAPHS.glob("*.dsir"))
HAVE_PYPTO = importlib.util.find_spec("pypto") is not None


def load(name: str):
    g = parse_file(GRAPHS / f"{name}.dsir").entry
    verify(g)
    return g


def seeded_inputs(g, seed: int = 0, integers: bool = False) -> dict[str, np.ndarray]:
    """Normal floats (or small integers, so every sum is exact in any order) for each parameter."""
    rng = np.random.default_rng(seed)
    out = {}
    for p in g.params:
        shape = p.type.concrete_shape(g.env)
        if integers or p.type.dtype.is_int:
            out[p.name] = rng.integers(-3, 4, shape).astype(np.float32)
        else:
            out[p.name] = rng.standard_normal(shape).astype(np.float32)
    return out


def same(a, b) -> bool:
    """Bitwise equality of two executor results (dicts, or lists of dicts per rank); NaN equals NaN."""
    a = a if isinstance(a, list) else [a]
    b = b if isinstance(b, list) else [b]
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(np.array_equal(x[k], y[k], equal_nan=True) for k in x) for x, y in zip(a, b))


def pytest_collection_modifyitems(config, items):
    if HAVE_PYPTO:
        return
    skip = pytest.mark.skip(reason="pypto==0.2.0 is not installed")
    for item in items:
        if "pypto" in item.keywords:
            item.add_marker(skip)

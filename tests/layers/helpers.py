"""Small helpers for the layer tests."""
from __future__ import annotations

import numpy as np


def bitwise(a, b) -> bool:
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return a.shape == b.shape and np.array_equal(a, b)


def f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)

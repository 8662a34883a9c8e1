"""Normalisation kernels: numpy references (the pypto templates live beside them)."""
from __future__ import annotations

import numpy as np

from .dtypes import f32, to_bf16


def rmsnorm(x, w, *, eps=1e-6, **_):
    """rb((x · 1/sqrt(mean(x²) + eps)) · w) — x·inv first, one rounding (dsv4-math §3)."""
    xf = f32(x)
    inv = np.float32(1.0) / np.sqrt(np.mean(xf * xf, axis=-1, keepdims=True, dtype=np.float32) + np.float32(eps))
    return to_bf16((xf * inv) * f32(w))

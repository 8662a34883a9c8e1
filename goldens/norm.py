"""RMSNorm (dsv4-math §3)."""
from __future__ import annotations

import numpy as np

from .numerics import f32, rb, rsqrt_mean_sq


def rms_normalize(x, eps: float) -> np.ndarray:
    """x · 1/sqrt(mean(x²) + eps), f32, not rounded: the core of every RMSNorm (§3, §4, §5)."""
    x = f32(x)
    return x * rsqrt_mean_sq(x, eps)


def rms_norm(x, w, eps: float) -> np.ndarray:
    """rb((x · inv_rms) · w): one rounding (§3). Used for the attention x_normed."""
    return rb(rms_normalize(x, eps) * f32(w))

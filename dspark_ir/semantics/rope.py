"""Interleaved RoPE on the last `rope_dim` dims: numpy reference (dsv4-math §1.2)."""
from __future__ import annotations

import numpy as np

from .dtypes import as_dtype, f32


def rope(x, cos, sin, *, rope_dim, inverse=False, out="bf16", **_):
    """Rotate adjacent pairs (2i, 2i+1) of the last `rope_dim` dims; c, s are per row [T, rope_dim/2].

    For a bf16 result the nope part and each rotated half are rounded separately, then interleaved.
    """
    xf = f32(x)
    lead = xf.shape[0]
    c = f32(cos).reshape((lead,) + (1,) * (xf.ndim - 2) + (-1,))
    s = f32(sin).reshape(c.shape)
    r = xf[..., -rope_dim:]
    e, o = r[..., 0::2], r[..., 1::2]
    if inverse:
        first, second = e * c + o * s, o * c - e * s
    else:
        first, second = e * c - o * s, e * s + o * c
    result = np.empty_like(xf)
    result[..., :-rope_dim] = f32(as_dtype(xf[..., :-rope_dim], out))
    result[..., -rope_dim::2] = f32(as_dtype(first, out))
    result[..., -rope_dim + 1::2] = f32(as_dtype(second, out))
    return as_dtype(result, out)

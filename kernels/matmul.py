"""Matmul kernels: numpy references (the pypto templates live beside them)."""
from __future__ import annotations

import numpy as np

from ._np import as_dtype, f32


def matmul(a, b, *, out="f32", trans_b=False, **_):
    a_np, b_np = np.asarray(a), np.asarray(b)
    if trans_b:
        b_np = b_np.T
    if a_np.dtype == np.int8 and b_np.dtype == np.int8:
        return as_dtype(a_np.astype(np.int64) @ b_np.astype(np.int64), out)
    return as_dtype(f32(a_np) @ f32(b_np), out)

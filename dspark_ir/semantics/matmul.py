"""Matmul kernels: numpy references (the pypto templates live beside them)."""
from __future__ import annotations

import numpy as np

from .dtypes import as_dtype, f32


def matmul(a, b, acc=None, *, out="f32", trans_b=False, k_split=1, split_order=None, **_):
    """a @ b. With `acc` (atomic accumulation) each of the `k_split` contiguous K slices is added to
    `acc` in f32, in `split_order` (default ascending: the reference order of an atomic reduction)."""
    a_np, b_np = np.asarray(a), np.asarray(b)
    if trans_b:
        b_np = b_np.T
    if a_np.dtype == np.int8 and b_np.dtype == np.int8:
        return as_dtype(a_np.astype(np.int64) @ b_np.astype(np.int64), out)
    if acc is None:
        return as_dtype(f32(a_np) @ f32(b_np), out)
    total = f32(acc).copy()
    bounds = np.linspace(0, a_np.shape[1], k_split + 1).astype(int)
    for k in (split_order if split_order is not None else range(k_split)):
        lo, hi = bounds[k], bounds[k + 1]
        total = total + f32(a_np[:, lo:hi]) @ f32(b_np[lo:hi])
    return total

"""Ordered split-K for the generic matmul: numpy references of matmul_partials and split_reduce.

Both reuse the existing references: each partial is `kernels.matmul.matmul` of one K slice (the slices and the
f32 product of its atomic form), and the reduction is `kernels.hc.hc_pre_linear_reduce` (the ascending sum of row
blocks). So `split_reduce(matmul_partials(a, b))` has the bits of `matmul(a, b, zeros)` with ascending splits.
"""
from __future__ import annotations

import numpy as np

from .hc import hc_pre_linear_reduce
from .matmul import matmul


def matmul_partials(a, b, *, trans_b=False, k_split=1, **_):
    """f32 [k_split·M, N]: row block s = a[:, K_s] @ b[K_s, :], K_s the s-th np.linspace slice of K."""
    a_np, b_np = np.asarray(a), np.asarray(b)
    if trans_b:
        b_np = b_np.T
    bounds = np.linspace(0, a_np.shape[1], k_split + 1).astype(int)   # kernels.matmul.matmul's cut
    parts = [matmul(a_np[:, lo:hi], b_np[lo:hi]) for lo, hi in zip(bounds[:-1], bounds[1:])]
    return np.concatenate(parts, axis=0).astype(np.float32)


def split_reduce(partials, *, k_split, **_):
    """Σ of the k_split row blocks of partials, in ascending split order (f32)."""
    return hc_pre_linear_reduce(partials, k_split=k_split)

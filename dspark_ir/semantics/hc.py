"""Hyper-connection kernels (hc_pre stages and hc_post): numpy references (dsv4-math §2.1, §2.2).

Every function follows the rounding points of dsv4-math exactly: the residual stream, mixes, pre/post/comb are
f32; x_mixed is rounded once to bf16 after the pairwise stream sum.
"""
from __future__ import annotations

import numpy as np

from .dtypes import f32, to_bf16

F32 = np.float32
MAD_GROUP = 4  # the A2/A3 cube MAD sums 4 consecutive products before rounding (dsv4-math §2.1)


def _rows(x) -> np.ndarray:
    """x_hc [T, N, D] (or already flat [T, K]) as f32 [T, N·D]."""
    x = f32(x)
    return x.reshape(x.shape[0], -1)


def hc_pre_rms(x_hc, *, tile=None, eps=1e-6, **_):
    """inv_rms[t] = 1/sqrt(ss/K + eps); ss = Σ over K-chunks (tile[1] wide, in order) of rowsum(chunk²)."""
    x = _rows(x_hc)
    k = x.shape[1]
    chunk = tile[1] if tile else k
    ss = np.zeros(x.shape[0], dtype=F32)
    for k0 in range(0, k, chunk):
        xc = x[:, k0:k0 + chunk]
        ss = ss + np.sum(xc * xc, axis=1)
    return F32(1.0) / np.sqrt(ss / F32(k) + F32(eps))


def _cube_splits(x, w, k_split: int) -> np.ndarray:
    """Per-split results [k_split, T, N] of x[T,K] @ w[N,K].T in the cube MAD order: inside a split, groups of
    4 consecutive products are summed exactly (f64) and accumulated as acc = f32(acc + group), in k order."""
    x64, w64 = np.asarray(x, np.float64), np.asarray(w, np.float64)
    m, k = x64.shape
    n = w64.shape[0]
    groups = k // (k_split * MAD_GROUP)
    xg = x64.reshape(m, k_split, groups, MAD_GROUP)
    wg = w64.reshape(n, k_split, groups, MAD_GROUP)
    group_sums = np.einsum("msgc,nsgc->gmns", xg, wg)
    acc = np.zeros((m, n, k_split), dtype=F32)
    for g in range(groups):
        acc = (acc + group_sums[g]).astype(F32)
    return np.moveaxis(acc, 2, 0)


def hc_pre_linear(x_hc, hc_fn, acc=None, *, accumulate="atomic", k_split=1, split_order=None, **_):
    """mixes_raw = X @ hc_fn.T (no 1/rms) over `k_split` contiguous K splits in the cube MAD order.

    atomic: each split's result is added in f32 into the seeded `acc` (ascending unless `split_order`);
    ordered: the disjoint partials, row s·T + t for split s; none: the splits summed in ascending order.
    """
    x = _rows(x_hc)
    parts = _cube_splits(x, f32(hc_fn), k_split)
    if accumulate == "ordered":
        return parts.reshape(k_split * x.shape[0], -1)
    total = f32(acc).copy() if acc is not None else None
    for s in (split_order if split_order is not None else range(k_split)):
        total = parts[s].copy() if total is None else total + parts[s]
    return total


def hc_pre_linear_reduce(partials, *, k_split, **_):
    """Σ of the `k_split` row-blocks of partials [k_split·T, N], in ascending split order (f32)."""
    p = f32(partials)
    t = p.shape[0] // k_split
    out = p[:t].copy()
    for s in range(1, k_split):
        out = out + p[s * t:(s + 1) * t]
    return out


def _mix(mixes, inv_rms) -> np.ndarray:
    return f32(mixes) * f32(inv_rms)[:, None]


def _sigmoid(x) -> np.ndarray:
    with np.errstate(over="ignore"):
        return F32(1.0) / (F32(1.0) + np.exp(-f32(x)))


def split_pre_post(mixes, inv_rms, hc_scale, hc_base, *, hc_mult=4, eps=1e-6, **_):
    """pre = sigmoid(mix[:, :n]·s0 + base) + eps;  post = 2·sigmoid(mix[:, n:2n]·s1 + base)  (f32 [T, n] each)."""
    n = hc_mult
    mix, s, base = _mix(mixes, inv_rms), f32(hc_scale), f32(hc_base)
    pre = _sigmoid(mix[:, :n] * s[0] + base[:n]) + F32(eps)
    post = F32(2.0) * _sigmoid(mix[:, n:2 * n] * s[1] + base[n:2 * n])
    return pre, post


def comb_sinkhorn(mixes, inv_rms, hc_scale, hc_base, *, hc_mult=4, iters=20, eps=1e-6, **_):
    """C[t, in, out] = mix[:, 2n:]·s2 + base; softmax over out + eps, column-normalise, then (iters−1) × (row,
    column) normalisations, each with + eps in the denominator (f32 [T, n, n])."""
    n = hc_mult
    mix, s, base = _mix(mixes, inv_rms), f32(hc_scale), f32(hc_base)
    c = (mix[:, 2 * n:] * s[2] + base[2 * n:]).reshape(-1, n, n)
    e = F32(eps)
    x = np.exp(c - np.max(c, axis=2, keepdims=True))
    c = x / np.sum(x, axis=2, keepdims=True) + e
    c = c / (np.sum(c, axis=1, keepdims=True) + e)
    for _ in range(iters - 1):
        c = c / (np.sum(c, axis=2, keepdims=True) + e)
        c = c / (np.sum(c, axis=1, keepdims=True) + e)
    return c


def mix_x(x_hc, pre, **_):
    """x_mixed = rb((x0·pre0 + x1·pre1) + (x2·pre2 + x3·pre3))  (bf16 [T, D])."""
    x, p = f32(x_hc), f32(pre)
    s = [x[:, i, :] * p[:, i:i + 1] for i in range(x.shape[1])]
    return to_bf16((s[0] + s[1]) + (s[2] + s[3]))


def mix_x_rms_norm(x_hc, pre, w, *, eps=1e-6, **_):
    """rmsnorm(mix_x(x_hc, pre), w): x_mixed rounded to bf16 once, then the norm's own rounding (bf16 [T, D])."""
    from .norm import rmsnorm

    return rmsnorm(mix_x(x_hc, pre), w, eps=eps)


def hc_post(x_attn, x_hc, post, comb, **_):
    """y[:, o] = f32(x_attn)·post[:, o], then += x_hc[:, i]·C[:, i, o] for i ascending (f32 [T, n, D])."""
    a, res, post, comb = f32(x_attn), f32(x_hc), f32(post), f32(comb)
    y = a[:, None, :] * post[:, :, None]
    for i in range(res.shape[1]):
        y = y + res[:, i:i + 1, :] * comb[:, i, :, None]
    return y

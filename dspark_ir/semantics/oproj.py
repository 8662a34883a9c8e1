"""Grouped W8A8 output projection kernels (dsv4-math §7): numpy references.

o_r = f32(packed[g]) @ f32(wo_a[g]).T stays f32; per-(token, group) q8; each group's int8 product is dequantised
with its activation scale and summed over the groups in ascending order, then multiplied by wo_b_scale. At TP1
the sum is rounded to bf16 (attn_out); at TP > 1 it is the f32 partial the reduce-scatter sums.
"""
from __future__ import annotations

import numpy as np

from goldens.numerics import q8

from .dtypes import as_dtype, f32

F32 = np.float32


def _mm(a, b) -> np.ndarray:
    """f32 matmul accumulated in f64 and rounded once (the golden convention; order-independent per row)."""
    return (np.asarray(a, np.float64) @ np.asarray(b, np.float64)).astype(F32)


def o_proj_a(heads, wo_a, *, group, **_):
    """o_r = f32(heads[group]) @ f32(wo_a[group]).T → f32 [rows, o_lora]."""
    return _mm(f32(heads[group]), f32(wo_a[group]).T)


def quant_rows(x, *, pad_rows=0, **_):
    """q8 per row (dsv4-math §0): (int8 values, f32 dequant scale [rows]); with pad_rows > 0 the values fill
    pad_rows rows, the rows past x's zero."""
    xi8, scale = q8(f32(x))
    if pad_rows:
        xi8 = np.concatenate([xi8, np.zeros((pad_rows - xi8.shape[0], xi8.shape[1]), xi8.dtype)])
    return xi8, scale[:, 0].astype(F32)


def o_proj_b(x_i8, wo_b, *, group, **_):
    """Exact int8 product x_i8 @ wo_b[:, group·K:(group+1)·K].T → i32 [rows, hidden]."""
    k = np.shape(x_i8)[1]
    w = np.asarray(wo_b)[:, group * k:(group + 1) * k]
    return (np.asarray(x_i8, np.int64) @ np.asarray(w, np.int64).T).astype(np.int32)


def o_proj_b_dequant(wo_b_scale, *parts, out="f32", **_):
    """acc = Σ_g f32(acc_g)·s_g (groups ascending; parts = acc_0, s_0, acc_1, s_1, ...), then acc·wo_b_scale;
    rounded to bf16 when out = bf16 (TP1 attn_out), else the f32 TP partial."""
    acc = None
    for a, s in zip(parts[0::2], parts[1::2]):
        term = f32(a)[:len(s)] * f32(s)[:, None]
        acc = term if acc is None else acc + term
    return as_dtype(acc * f32(wo_b_scale)[None, :], out)

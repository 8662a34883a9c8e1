"""qkv_proj_rope kernels: RoPE tables, the Q-side norm/quant and dequant/norm/RoPE, the KV norm/RoPE.

numpy references following dsv4-math §1.2 and §3. Rounding points: qn (before int8) and the dequantised q stay
f32; q and kv are rounded to bf16 once per element after the rotation (nope part once, each rope half once).
RoPE is the kernel form: out[j] = r[j]·cos_il[j] ± r[j^1]·sin_signed[j], bit-identical to the pair form.
"""
from __future__ import annotations

import numpy as np

from goldens.numerics import q8

from .dtypes import BF16, f32, to_bf16

F32 = np.float32


def rope_tables(rope_cos, rope_sin, positions, *, rope_dim, **_):
    """Per-token interleaved tables from the RoPE tables [P, rope_dim] (half duplicated) or [P, rope_dim/2] at
    `positions`: cos_il[j] = c[j>>1], sin_signed[j] = s[j>>1]·(−1 if j even else +1). bf16 (exact: the tables are
    bf16 values)."""
    half = rope_dim // 2
    pos = np.asarray(positions)
    c, s = f32(rope_cos)[pos, :half], f32(rope_sin)[pos, :half]
    j = np.arange(rope_dim)
    sign = np.where(j % 2 == 0, F32(-1.0), F32(1.0))
    return c[:, j >> 1].astype(BF16), (s[:, j >> 1] * sign).astype(BF16)


def rope_il(x, cos_il, sin_signed, *, inverse=False) -> np.ndarray:
    """Rotate the last rope_dim dims of x (f32) with interleaved tables broadcast over the middle axes."""
    x = f32(x).copy()
    rd = np.shape(cos_il)[-1]
    shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (rd,)
    c, s = f32(cos_il).reshape(shape), f32(sin_signed).reshape(shape)
    r = x[..., -rd:]
    swapped = r[..., np.arange(rd) ^ 1]
    x[..., -rd:] = r * c - swapped * s if inverse else r * c + swapped * s
    return x


def _inv_rms(x, eps) -> np.ndarray:
    return F32(1.0) / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + F32(eps))


def qr_rms_norm_quant(qr_acc, gamma_cq, *, eps=1e-6, **_):
    """qn = qa·rsqrt(mean(qa²) + eps)·gamma (f32, not rounded) → q8 per row: (qr i8 [T, q_lora], qr_scale [T])."""
    qa = f32(qr_acc)
    qn = qa * _inv_rms(qa, eps) * f32(gamma_cq)
    qr, scale = q8(qn)
    return qr, scale[:, 0].astype(F32)


def qproj_dequant_rms_nope_rope(acc, qr_scale, wq_b_scale, cos_il, sin_signed, *, heads, eps=1e-6, **_):
    """q = deq(acc, qr_scale, wq_b_scale) → [T, H, head_dim]; per-head RMSNorm (no gamma); RoPE on the last
    rope_dim dims; one bf16 rounding per element (bf16 [T, H, head_dim])."""
    q = f32(acc) * f32(qr_scale)[:, None] * f32(wq_b_scale)[None, :]
    q = q.reshape(q.shape[0], heads, -1)
    q = q * _inv_rms(q, eps)
    return to_bf16(rope_il(q, cos_il, sin_signed))


def kv_rms_norm_rope(kv_acc, gamma_ckv, cos_il, sin_signed, *, eps=1e-6, **_):
    """kv = rope(ka·rsqrt(mean(ka²) + eps)·gamma), one bf16 rounding per element (bf16 [T, head_dim])."""
    ka = f32(kv_acc)
    kn = ka * _inv_rms(ka, eps) * f32(gamma_ckv)
    return to_bf16(rope_il(kn, cos_il, sin_signed))

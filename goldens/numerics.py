"""Numeric helpers shared by every golden (dsv4-math §0, §1, §2.1).

Everything is f32 unless a rounding step is written. `kernels/` may import `rb` and `q8` from here (design.md).

Matmul convention: `matmul` accumulates in f64 and rounds the result to f32 once. The kernels accumulate in f32
in some tile order; the f64 form is order-independent, so a token's row never depends on which other rows share
the call (the TP/EP consistency checks rely on that). The one place the golden reproduces the kernel's f32 order
exactly is hc_pre's mix (`cube_mad_matmul`, dsv4-math §2.1).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

F32 = np.float32
INT8_SCALE_MAX = 127.0
INT8_AMAX_EPS = 1e-4
NEG_INF_ATTN = np.float32(-1.0e20)
FP32_NEG_INF = np.float32(-3.4028234663852886e38)
CUBE_MAD_GROUP = 4


def f32(x) -> np.ndarray:
    return np.asarray(x, dtype=np.float32)


def rb(x) -> np.ndarray:
    """Round f32 → bf16 (nearest, ties to even) and return it as f32 (dsv4-math §0)."""
    return f32(x).astype(ml_dtypes.bfloat16).astype(np.float32)


def q8(x, axis: int = -1) -> tuple[np.ndarray, np.ndarray]:
    """The single int8 rule (dsv4-math §0): k = 127/max(amax, 1e-4) in f32, round half even, scale 1/k.

    Returns (int8 values, f32 dequant scale with the reduced axis kept as size 1).
    """
    x = f32(x)
    amax = np.maximum(np.max(np.abs(x), axis=axis, keepdims=True), F32(INT8_AMAX_EPS))
    k = F32(INT8_SCALE_MAX) / amax
    return np.rint(x * k).astype(np.int8), F32(1.0) / k


def deq(acc, sa, sw) -> np.ndarray:
    """f32(acc) · activation scale (per row) · weight scale (per output channel), in that order (§0)."""
    return f32(acc) * f32(sa) * f32(sw)


def imatmul(a_i8, b_i8) -> np.ndarray:
    """Exact int8 × int8 matmul (the int32 accumulator), returned as f32(acc)."""
    acc = np.asarray(a_i8, dtype=np.float64) @ np.asarray(b_i8, dtype=np.float64)
    return acc.astype(np.float32)


def matmul(a, b) -> np.ndarray:
    """f32 matmul, accumulated in f64 and rounded once (see the module docstring)."""
    return (np.asarray(a, dtype=np.float64) @ np.asarray(b, dtype=np.float64)).astype(np.float32)


def einsum(spec: str, *operands) -> np.ndarray:
    """f32 einsum accumulated in f64, rounded once."""
    return np.einsum(spec, *(np.asarray(o, dtype=np.float64) for o in operands)).astype(np.float32)


def rsqrt_mean_sq(x, eps: float) -> np.ndarray:
    """1/sqrt(mean(x², -1) + eps) in f32, keepdims (the RMS factor of every RMSNorm, §3)."""
    x = f32(x)
    return F32(1.0) / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + F32(eps))


def sigmoid(x) -> np.ndarray:
    x = f32(x)
    with np.errstate(over="ignore"):
        return F32(1.0) / (F32(1.0) + np.exp(-x))


def cube_mad_matmul(x, w, k_splits: int) -> np.ndarray:
    """x[M,K] @ w[N,K].T in the A2/A3 cube order of hc_pre (dsv4-math §2.1, dspark-model.md §6(f)).

    K is cut into `k_splits` contiguous splits. Inside a split, products are summed in groups of 4 consecutive k
    in f64; the running sum is acc = f32(acc + group), sequential over the groups. The split results are then
    added in ascending split order, in f32.
    """
    x64 = np.asarray(x, dtype=np.float64)
    w64 = np.asarray(w, dtype=np.float64)
    m, k = x64.shape
    n = w64.shape[0]
    groups = k // (k_splits * CUBE_MAD_GROUP)
    xg = x64.reshape(m, k_splits, groups, CUBE_MAD_GROUP)
    wg = w64.reshape(n, k_splits, groups, CUBE_MAD_GROUP)
    group_sums = np.einsum("msgc,nsgc->gmns", xg, wg)
    acc = np.zeros((m, n, k_splits), dtype=np.float32)
    for g in range(groups):
        acc = (acc.astype(np.float64) + group_sums[g]).astype(np.float32)
    out = acc[..., 0]
    for s in range(1, k_splits):
        out = out + acc[..., s]
    return out


# ---- RoPE (dsv4-math §1) -------------------------------------------------------------------------------------

ROPE_PROFILES = ("base", "compress")


def rope_profile(kind: str) -> str:
    """SWA layers use the base table; CSA and HCA use the compress (YaRN) table for everything (§1.1)."""
    return "base" if kind == "swa" else "compress"


def rope_inv_freq(cfg, profile: str) -> np.ndarray:
    """inv[i] = θ^(-2i/rope_dim), with the YaRN ramp for the compress profile (§1.1). f32 [rope_dim/2]."""
    if profile not in ROPE_PROFILES:
        raise ValueError(f"profile: expected one of {ROPE_PROFILES}, got {profile!r}")
    dim = cfg.rope_dim
    theta = cfg.rope_theta if profile == "base" else cfg.compress_rope_theta
    inv = F32(1.0) / (F32(theta) ** (np.arange(0, dim, 2, dtype=np.float32) / F32(dim)))
    if profile == "base" or cfg.yarn_orig <= 0:
        return inv
    ramp = _yarn_ramp(cfg, theta)
    return inv / F32(cfg.yarn_factor) * ramp + inv * (F32(1.0) - ramp)


def _yarn_ramp(cfg, theta: float) -> np.ndarray:
    dim = cfg.rope_dim

    def corr(r: float) -> float:
        return dim * np.log(cfg.yarn_orig / (2 * np.pi * r)) / (2 * np.log(theta))

    lo = max(int(np.floor(corr(cfg.yarn_beta_fast))), 0)
    hi = min(int(np.ceil(corr(cfg.yarn_beta_slow))), dim - 1)
    span = (hi - lo) if hi != lo else 0.001
    i = np.arange(dim // 2, dtype=np.float32)
    return np.clip((i - F32(lo)) / F32(span), 0.0, 1.0).astype(np.float32)


def rope_tables(cfg, profile: str) -> tuple[np.ndarray, np.ndarray]:
    """(cos_tab, sin_tab), each f32 [max_pos, rope_dim], bf16-rounded; the half is duplicated (§1.1).

    Consumers use columns [:rope_dim/2].
    """
    inv = rope_inv_freq(cfg, profile)
    angle = np.arange(cfg.max_pos, dtype=np.float32)[:, None] * inv[None, :]
    cos = rb(np.cos(angle))
    sin = rb(np.sin(angle))
    return np.concatenate([cos, cos], axis=1), np.concatenate([sin, sin], axis=1)


def rope_half(table: np.ndarray, pos) -> np.ndarray:
    """The [.., rope_dim/2] half-rows of a duplicated table at positions `pos`."""
    return table[np.asarray(pos)][..., : table.shape[-1] // 2]


def rope_fwd(r, c, s) -> np.ndarray:
    """Rotate interleaved pairs (2i, 2i+1) forward (§1.2). f32, not rounded."""
    r = f32(r)
    e, o = r[..., 0::2], r[..., 1::2]
    out = np.empty_like(r)
    out[..., 0::2] = e * c - o * s
    out[..., 1::2] = e * s + o * c
    return out


def rope_inv(r, c, s) -> np.ndarray:
    """Rotate interleaved pairs backward (§1.2). f32, not rounded."""
    r = f32(r)
    e, o = r[..., 0::2], r[..., 1::2]
    out = np.empty_like(r)
    out[..., 0::2] = e * c + o * s
    out[..., 1::2] = o * c - e * s
    return out


def rope_last(x, c, s, inverse: bool = False) -> np.ndarray:
    """Apply RoPE to the last `2·c.shape[-1]` dims of x (layout [nope | rope]); f32, not rounded."""
    x = f32(x)
    width = 2 * np.shape(c)[-1]
    rotate = rope_inv if inverse else rope_fwd
    return np.concatenate([x[..., :-width], rotate(x[..., -width:], c, s)], axis=-1)

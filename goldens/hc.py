"""Hyper-connections (mHC): hc_pre with Sinkhorn, and hc_post (dsv4-math §2.1, §2.2)."""
from __future__ import annotations

import numpy as np

from .config import ModelConfig, tiles_for
from .numerics import F32, cube_mad_matmul, f32, rb, sigmoid


def hc_inv_rms(cfg: ModelConfig, x_hc: np.ndarray) -> np.ndarray:
    """r = 1/sqrt(ss/hc_dim + eps), ss summed over RMS_K_CHUNK-wide column chunks in order (§2.1). [T, 1]."""
    x = f32(x_hc).reshape(x_hc.shape[0], cfg.hc_dim)
    chunk = tiles_for(cfg).RMS_K_CHUNK
    ss = np.zeros(x.shape[0], dtype=np.float32)
    for k0 in range(0, cfg.hc_dim, chunk):
        xc = x[:, k0 : k0 + chunk]
        ss = ss + np.sum(xc * xc, axis=1)
    return (F32(1.0) / np.sqrt(ss / F32(cfg.hc_dim) + F32(cfg.hc_eps)))[:, None]


def hc_mix(cfg: ModelConfig, x_hc: np.ndarray, hc_fn: np.ndarray) -> np.ndarray:
    """mix = (X @ hc_fn.T) · r in the cube split-K order (§2.1). [T, mix_hc]."""
    x = f32(x_hc).reshape(x_hc.shape[0], cfg.hc_dim)
    raw = cube_mad_matmul(x, f32(hc_fn), tiles_for(cfg).LINEAR_OK)
    return raw * hc_inv_rms(cfg, x_hc)


def sinkhorn(cfg: ModelConfig, c: np.ndarray) -> np.ndarray:
    """Sinkhorn on C[t, in, out] (§2.1): softmax over out + eps, then column, then (iters-1) × (row, column)."""
    eps = F32(cfg.hc_eps)
    c = f32(c)
    e = np.exp(c - np.max(c, axis=2, keepdims=True))
    c = e / np.sum(e, axis=2, keepdims=True) + eps
    c = c / (np.sum(c, axis=1, keepdims=True) + eps)
    for _ in range(cfg.sinkhorn_iters - 1):
        c = c / (np.sum(c, axis=2, keepdims=True) + eps)
        c = c / (np.sum(c, axis=1, keepdims=True) + eps)
    return c


def hc_gates(cfg: ModelConfig, mix, hc_scale, hc_base) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(pre [T,4], post [T,4], comb [T,4,4]) from mix [T, mix_hc] (§2.1)."""
    n = cfg.hc_mult
    mix, s, base = f32(mix), f32(hc_scale), f32(hc_base)
    pre = sigmoid(mix[:, :n] * s[0] + base[:n]) + F32(cfg.hc_eps)
    post = F32(2.0) * sigmoid(mix[:, n : 2 * n] * s[1] + base[n : 2 * n])
    comb = sinkhorn(cfg, (mix[:, 2 * n :] * s[2] + base[2 * n :]).reshape(-1, n, n))
    return pre, post, comb


def hc_collapse(x_hc, pre) -> np.ndarray:
    """x_mixed = rb((x0·pre0 + x1·pre1) + (x2·pre2 + x3·pre3)) (§2.1). [T, D] bf16-valued."""
    x_hc, pre = f32(x_hc), f32(pre)
    streams = [x_hc[:, i, :] * pre[:, i : i + 1] for i in range(x_hc.shape[1])]
    return rb((streams[0] + streams[1]) + (streams[2] + streams[3]))


def hc_pre(cfg: ModelConfig, x_hc, hc_fn, hc_scale, hc_base) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(x_mixed [T,D] bf16-valued, post [T,4], comb [T,4,4] in [in, out] layout) (§2.1)."""
    pre, post, comb = hc_gates(cfg, hc_mix(cfg, f32(x_hc), hc_fn), hc_scale, hc_base)
    return hc_collapse(x_hc, pre), post, comb


def hc_post(x_attn, res, post, comb) -> np.ndarray:
    """y[:, o] = x_attn·post[:, o], then += res[:, i]·C[:, i, o] for i ascending (§2.2). f32 [T, 4, D]."""
    x_attn, res, post, comb = f32(x_attn), f32(res), f32(post), f32(comb)
    y = x_attn[:, None, :] * post[:, :, None]
    for i in range(res.shape[1]):
        y = y + res[:, i : i + 1, :] * comb[:, i, :, None]
    return y

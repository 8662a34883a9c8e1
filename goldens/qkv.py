"""qkv_proj_rope: the Q side (with the qr int8 outputs reused by the indexer) and the shared KV head (dsv4-math §3)."""
from __future__ import annotations

import numpy as np

from .config import ModelConfig
from .norm import rms_normalize
from .numerics import deq, f32, imatmul, matmul, q8, rb, rope_last


def rope_round(x, c, s) -> np.ndarray:
    """[nope | rope] → rb(nope) and rb of each rotated half (§3; rounding is elementwise, so one rb suffices)."""
    return rb(rope_last(x, c, s))


def q_proj(cfg: ModelConfig, x_normed, wq_a, gamma_cq, wq_b, wq_b_scale, c, s):
    """(q [T,H,head_dim] bf16-valued, qr int8 [T,q_lora], qr_scale f32 [T,1]) (§3).

    c, s: per-token RoPE half rows [T, rope_dim/2] at each token's own position.
    """
    qa = matmul(f32(x_normed), f32(wq_a))
    qn = rms_normalize(qa, cfg.rms_eps) * f32(gamma_cq)
    qr, qr_scale = q8(qn)
    q = deq(imatmul(qr, wq_b), qr_scale, wq_b_scale).reshape(-1, cfg.heads, cfg.head_dim)
    q = rms_normalize(q, cfg.rms_eps)
    return rope_round(q, c[:, None, :], s[:, None, :]), qr, qr_scale


def kv_proj(cfg: ModelConfig, x_normed, wkv, gamma_ckv, c, s) -> np.ndarray:
    """kv [T, head_dim] bf16-valued: one shared K=V head (§3)."""
    ka = matmul(f32(x_normed), f32(wkv))
    kn = rms_normalize(ka, cfg.rms_eps) * f32(gamma_ckv)
    return rope_round(kn, c, s)


def qkv_proj_rope(cfg: ModelConfig, x_normed, inputs: dict, c, s) -> dict[str, np.ndarray]:
    """{q, kv, qr, qr_scale} from the weights wq_a, gamma_cq, wq_b, wq_b_scale, wkv, gamma_ckv (§3)."""
    q, qr, qr_scale = q_proj(cfg, x_normed, inputs["wq_a"], inputs["gamma_cq"], inputs["wq_b"],
                             inputs["wq_b_scale"], c, s)
    kv = kv_proj(cfg, x_normed, inputs["wkv"], inputs["gamma_ckv"], c, s)
    return {"q": q, "kv": kv, "qr": qr, "qr_scale": qr_scale}

"""The wire form of the CP compressor payloads (dspark_ir/ops/wire.py): numpy references.

A wire row is [values bits | scores bits | kv]: each f32 carried as two bf16 whose bits are its low and high
16 bits (little-endian order), then the bf16 kv row. Both directions are bit reinterpretations: lossless.
"""
from __future__ import annotations

import numpy as np

from .dtypes import BF16


def f32_bits(x) -> np.ndarray:
    """f32[R, W] → bf16[R, 2·W]: each f32's low and high 16 bits as two bf16."""
    x = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    pairs = x.view(np.uint16).reshape(x.shape[0], 2 * x.shape[1])
    lo_hi = pairs.reshape(x.shape[0], x.shape[1], 2)
    if np.little_endian is False:           # keep the wire order (low half first) on any host
        lo_hi = lo_hi[..., ::-1]
    return np.ascontiguousarray(lo_hi.reshape(x.shape[0], -1)).view(BF16)


def bits_f32(w) -> np.ndarray:
    """bf16[R, 2·W] bit pairs (low half first) → f32[R, W]."""
    w = np.ascontiguousarray(np.asarray(w, dtype=BF16)).view(np.uint16)
    lo_hi = w.reshape(w.shape[0], -1, 2)
    if np.little_endian is False:
        lo_hi = lo_hi[..., ::-1]
    return np.ascontiguousarray(lo_hi).view(np.float32).reshape(w.shape[0], -1)


def cp_wire_pack(values, scores, *kv, **_):
    """[values bits | scores bits | kv] per row."""
    parts = [f32_bits(values), f32_bits(scores)] + [np.asarray(k, dtype=BF16) for k in kv]
    return np.concatenate(parts, axis=1)


def cp_wire_unpack(wire, *, width, kv=0, **_):
    """The inverse of cp_wire_pack: (values, scores[, kv])."""
    w = np.asarray(wire, dtype=BF16)
    values, scores = bits_f32(w[:, :2 * width]), bits_f32(w[:, 2 * width:4 * width])
    return (values, scores) + ((np.array(w[:, 4 * width:4 * width + kv]),) if kv else ())

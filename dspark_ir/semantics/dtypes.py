"""Tiny numpy helpers shared by the op semantics (dtype handling only, no semantics)."""
from __future__ import annotations

import ml_dtypes
import numpy as np

BF16 = ml_dtypes.bfloat16
NP_DTYPES = {"bf16": BF16, "fp16": np.float16, "f32": np.float32, "i8": np.int8, "i32": np.int32,
             "i64": np.int64, "bool": np.bool_, "fp8": ml_dtypes.float8_e4m3fn}


def f32(x) -> np.ndarray:
    return np.asarray(x).astype(np.float32)


def to_bf16(x) -> np.ndarray:
    """Round f32 → bf16 (nearest, ties to even): the kernels' `rint` cast."""
    return np.asarray(x, dtype=np.float32).astype(BF16)


def as_dtype(x, name: str) -> np.ndarray:
    return np.asarray(x).astype(NP_DTYPES[name])

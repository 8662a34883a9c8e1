"""Numeric contracts: what a pass promises about the values its output graph computes.

Outputs are compared by position (a rewrite may rename a returned value), on the same seeded inputs.

* `bitwise`             every returned array is identical bit for bit (NaN matches NaN).
* `exact-indices`       integer and bool outputs identical; float outputs within `rtol`/`atol` (default 0: bitwise).
* `bounded-reassoc(u)`  integer and bool outputs identical; each float element within `u` ulp, where
                        err_ulp = |after - before| / spacing(dtype, max(|before|, |after|, smallest_normal)),
                        spacing(dtype, m) = eps(dtype) * 2**floor(log2(m)): the gap between neighbouring values
                        of the output's dtype in the binade of the larger magnitude (bf16 eps 2**-7, f32 2**-23).
* `approx(rtol, atol)`  integer and bool outputs identical; floats |after - before| <= atol + rtol * |before|.

Infinities must match exactly, a NaN must stay a NaN. The worst element is the one with the largest error
relative to what the contract allows.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import ml_dtypes
import numpy as np

KINDS = ("bitwise", "exact-indices", "bounded-reassoc", "approx")


@dataclass(frozen=True)
class Contract:
    kind: str
    ulp: float = 0.0
    rtol: float = 0.0
    atol: float = 0.0

    def __post_init__(self):
        assert self.kind in KINDS, self.kind
        assert self.ulp >= 0 and self.rtol >= 0 and self.atol >= 0

    def __str__(self) -> str:
        if self.kind == "bounded-reassoc":
            return f"bounded-reassoc({self.ulp:g})"
        if self.kind == "approx" or (self.kind == "exact-indices" and (self.rtol or self.atol)):
            return f"{self.kind}(rtol={self.rtol:g}, atol={self.atol:g})"
        return self.kind


BITWISE = Contract("bitwise")
EXACT_INDICES = Contract("exact-indices")


def exact_indices(rtol: float = 0.0, atol: float = 0.0) -> Contract:
    return Contract("exact-indices", rtol=rtol, atol=atol)


def bounded_reassoc(ulp: float) -> Contract:
    return Contract("bounded-reassoc", ulp=ulp)


def approx(rtol: float, atol: float = 0.0) -> Contract:
    return Contract("approx", rtol=rtol, atol=atol)


@dataclass(frozen=True)
class Violation:
    """The worst element of the first output that breaks the contract."""

    position: int          # index in the return list
    before_name: str
    after_name: str
    rank: int | None
    index: tuple[int, ...]
    before: Any
    after: Any
    measure: str           # e.g. "|diff| 0.5 > allowed 0", "3.2 ulp > 1 ulp", "shape (4,) != (8,)"

    def describe(self) -> str:
        name = f"%{self.after_name}" if self.after_name == self.before_name \
            else f"%{self.after_name} (was %{self.before_name})"
        rank = f" on rank {self.rank}" if self.rank is not None else ""
        if not self.index and self.before is None:
            return f"output #{self.position} {name}{rank}: {self.measure}"
        return (f"output #{self.position} {name}{rank}, worst element {list(self.index)}: "
                f"before {self.before!r}, after {self.after!r} ({self.measure})")


def check_outputs(contract: Contract, before: Sequence[Sequence[Any]], after: Sequence[Sequence[Any]],
                  before_names: Sequence[str], after_names: Sequence[str]) -> Violation | None:
    """`before`/`after`: one list of returned arrays per rank (positional). None when the contract holds."""
    ranks = len(before)
    for r, (outs_b, outs_a) in enumerate(zip(before, after)):
        rank = r if ranks > 1 else None
        if len(outs_b) != len(outs_a):
            return Violation(0, "", "", rank, (), None, None,
                             f"the graph returns {len(outs_a)} values, it returned {len(outs_b)}")
        for pos, (b, a) in enumerate(zip(outs_b, outs_a)):
            found = _compare(contract, b, a)
            if found is not None:
                index, vb, va, measure = found
                return Violation(pos, before_names[pos], after_names[pos], rank, index, vb, va, measure)
    return None


def _compare(contract: Contract, b: Any, a: Any):
    if b is None or a is None:
        return None if b is None and a is None else ((), None, None, "a token became a tensor or back")
    b, a = np.asarray(b), np.asarray(a)
    if b.shape != a.shape:
        return (), None, None, f"shape {a.shape} != {b.shape}"
    if b.dtype != a.dtype:
        return (), None, None, f"dtype {a.dtype} != {b.dtype}"
    if b.size == 0:
        return None
    if not _is_float(b.dtype) or contract.kind == "bitwise":
        return _exact(b, a)
    if contract.kind == "exact-indices" and not (contract.rtol or contract.atol):
        return _exact(b, a)
    if contract.kind == "bounded-reassoc":
        return _ulp(b, a, contract.ulp)
    return _tolerance(b, a, contract.rtol, contract.atol)


def _is_float(dt: np.dtype) -> bool:
    return dt.kind == "f" or dt in (np.dtype(ml_dtypes.bfloat16), np.dtype(ml_dtypes.float8_e4m3fn))


def _exact(b: np.ndarray, a: np.ndarray):
    if _is_float(b.dtype):
        bits = np.dtype(f"u{b.dtype.itemsize}")
        same = (b.view(bits) == a.view(bits)) | (np.isnan(_f64(b)) & np.isnan(_f64(a)))
    else:
        same = b == a
    if same.all():
        return None
    with np.errstate(invalid="ignore"):  # inf - inf
        diff = np.abs(_f64(a) - _f64(b))
    diff = np.where(same, -1.0, np.nan_to_num(diff, nan=np.inf, posinf=np.inf))
    i = _argmax(diff)
    return i, _item(b[i]), _item(a[i]), "not bitwise identical" if diff[i] in (0.0, np.inf) \
        else f"|diff| {diff[i]:g}, bitwise required"


def _tolerance(b: np.ndarray, a: np.ndarray, rtol: float, atol: float):
    fb, fa = _f64(b), _f64(a)
    with np.errstate(invalid="ignore"):
        err = np.abs(fa - fb)
    allowed = atol + rtol * np.abs(fb)
    ratio = _ratio(err, allowed, fb, fa)
    i = _argmax(ratio)
    if ratio[i] <= 1.0:
        return None
    return i, _item(b[i]), _item(a[i]), f"|diff| {err[i]:g} > allowed {allowed[i]:g}"


def _ulp(b: np.ndarray, a: np.ndarray, ulp: float):
    fb, fa = _f64(b), _f64(a)
    info = ml_dtypes.finfo(b.dtype)
    magnitude = np.maximum(np.maximum(np.abs(fb), np.abs(fa)), float(info.smallest_normal))
    with np.errstate(invalid="ignore", over="ignore"):
        spacing = float(info.eps) * np.exp2(np.floor(np.log2(np.where(np.isfinite(magnitude), magnitude, 1.0))))
        err_ulp = np.abs(fa - fb) / spacing
    ratio = _ratio(err_ulp, np.full_like(err_ulp, ulp), fb, fa)
    i = _argmax(ratio)
    if ratio[i] <= 1.0:
        return None
    return i, _item(b[i]), _item(a[i]), f"{err_ulp[i]:.3g} ulp > {ulp:g} ulp"


def _ratio(err: np.ndarray, allowed: np.ndarray, fb: np.ndarray, fa: np.ndarray) -> np.ndarray:
    """err/allowed per element; 0 where equal (incl. both NaN or the same infinity), inf where not allowed."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(allowed > 0, err / np.where(allowed > 0, allowed, 1.0), np.where(err > 0, np.inf, 0.0))
    same = (fb == fa) | (np.isnan(fb) & np.isnan(fa))
    ratio = np.where(same, 0.0, ratio)
    return np.nan_to_num(ratio, nan=np.inf)


def _f64(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float64)


def _argmax(x: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.unravel_index(int(np.argmax(x)), x.shape))


def _item(x: Any) -> Any:
    v = np.asarray(x)
    return float(v) if _is_float(v.dtype) else v.item()

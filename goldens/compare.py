"""Tolerances and comparators for checking an implementation against the goldens.

TOLERANCES collects the per-tensor bounds of dsv4-math (§2-§8) and dspark-model.md §7; entries marked "ours" are
our choice. Comparators return a `Verdict` (truthy when the check passes) whose `message` says what failed.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# name → (kind, parameters)
TOLERANCES = {
    "x_mixed": ("allclose", {"atol": 1e-4, "rtol": 1 / 128}),          # §2.1
    "post": ("allclose", {"atol": 2.5e-5, "rtol": 5e-3}),               # §2.1
    "comb": ("allclose", {"atol": 2.5e-5, "rtol": 5e-3}),               # §2.1
    "hc_post": ("allclose", {"atol": 1e-3, "rtol": 1e-3}),              # §2.2 (1e-3)
    "x_normed": ("allclose", {"atol": 1e-4, "rtol": 1 / 128}),          # §3
    "q": ("allclose", {"atol": 1e-4, "rtol": 1 / 128}),                 # §3
    "kv": ("allclose", {"atol": 1e-4, "rtol": 1 / 128}),                # §3
    "qr": ("lsb", {"max_lsb": 1, "max_fraction": 1.0}),                 # §3: ±1 LSB everywhere
    "qr_scale": ("allclose", {"atol": 2.5e-5, "rtol": 5e-3}),           # §3
    "kv_cache": ("allclose", {"atol": 1e-4, "rtol": 1 / 128}),          # §4
    "cmp_kv": ("allclose", {"atol": 1e-4, "rtol": 1 / 128}),            # §4
    "cmp_state": ("allclose", {"atol": 1e-3, "rtol": 1e-3}),            # §4
    "idx_cmp_state": ("allclose", {"atol": 1e-3, "rtol": 1e-3}),        # §4
    "idx_kv_cache": ("lsb", {"max_lsb": 1, "max_fraction": 0.01}),      # §5: ±1 LSB on ≤ 1 %
    "idx_kv_scale": ("allclose", {"atol": 2.5e-5, "rtol": 5e-3}),       # ours (like qr_scale)
    "score": ("allclose", {"atol": 1e-4, "rtol": 1 / 128}),             # §5.3, valid region only
    "packed": ("allclose", {"atol": 1e-4, "rtol": 1 / 128}),            # §6.3, valid rows
    "attn_out": ("allclose", {"atol": 1e-4, "rtol": 1 / 128}),          # ours (bf16 output, 1 ulp)
    "recv_y": ("reldiff", {"diff": 2e-3, "pct": 0.01}),                 # §8.2
    "x_out": ("reldiff", {"diff": 3e-3, "pct": 0.008}),                 # model §7, decode x_out
    "x_out_csa": ("reldiff", {"diff": 4e-3, "pct": 0.008}),             # model §7, CSA
}


@dataclass(frozen=True)
class Verdict:
    ok: bool
    message: str

    def __bool__(self) -> bool:
        return self.ok


def ratio_allclose(actual, expected, atol: float, rtol: float, max_bad: float = 0.005) -> Verdict:
    """|a − e| ≤ atol + rtol·|e| on all but `max_bad` of the points (pypto-lib ratio_allclose: 0.5 %)."""
    a, e = _pair(actual, expected)
    bad = np.abs(a - e) > atol + rtol * np.abs(e)
    frac = float(bad.mean()) if bad.size else 0.0
    return Verdict(frac <= max_bad, f"{frac:.4%} of points outside atol={atol}, rtol={rtol} (allowed {max_bad:.2%})")


def ratio_reldiff(actual, expected, diff: float, pct: float, max_rel: float = 1.0) -> Verdict:
    """Relative error |a − e| / max(|e|, 1) above `diff` on at most `pct` of the points, and nowhere above
    `max_rel` (our reading of pypto-lib ratio_reldiff; the |e| floor of 1 keeps near-zero points absolute)."""
    a, e = _pair(actual, expected)
    rel = np.abs(a - e) / np.maximum(np.abs(e), 1.0)
    frac = float((rel > diff).mean()) if rel.size else 0.0
    worst = float(rel.max(initial=0.0))
    ok = frac <= pct and worst <= max_rel
    return Verdict(ok, f"{frac:.4%} of points with reldiff > {diff} (allowed {pct:.2%}); max {worst:.3g}")


def lsb_close(actual, expected, max_lsb: int = 1, max_fraction: float = 1.0) -> Verdict:
    """Integer tensors: no point differs by more than max_lsb, and at most max_fraction of points differ."""
    a = np.asarray(actual, dtype=np.int64)
    e = np.asarray(expected, dtype=np.int64)
    d = np.abs(a - e)
    worst = int(d.max(initial=0))
    frac = float((d > 0).mean()) if d.size else 0.0
    return Verdict(worst <= max_lsb and frac <= max_fraction, f"max diff {worst} LSB, {frac:.4%} of points differ")


def topk_pair_compare(actual, expected, score, atol: float = 1e-4, rtol: float = 1 / 128) -> Verdict:
    """Top-k rows agree up to tie swaps: same −1 tail, and where indices differ their scores are equal within
    tolerance (pypto-lib topk_pair_compare)."""
    a, e, s = np.asarray(actual), np.asarray(expected), np.asarray(score)
    if not np.array_equal(a < 0, e < 0):
        return Verdict(False, "valid/−1 layout differs")
    for t in range(a.shape[0]):
        diff = np.flatnonzero(a[t] != e[t])
        sa, se = s[t, a[t, diff]], s[t, e[t, diff]]
        if not np.all(np.abs(sa - se) <= atol + rtol * np.abs(se)):
            return Verdict(False, f"token {t}: indices differ beyond a tie")
    return Verdict(True, "top-k equal up to ties")


def check(name: str, actual, expected) -> Verdict:
    """Compare with the TOLERANCES entry `name`."""
    kind, params = TOLERANCES[name]
    fn = {"allclose": ratio_allclose, "reldiff": ratio_reldiff, "lsb": lsb_close}[kind]
    return fn(actual, expected, **params)


def _pair(actual, expected):
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    if a.shape != e.shape:
        raise ValueError(f"shape mismatch: actual {a.shape} vs expected {e.shape}")
    return a, e

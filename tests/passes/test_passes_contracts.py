"""Numeric contracts: the comparisons behind --check-numerics, and what a violation reports."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from passes.infra.contracts import BITWISE, approx, bounded_reassoc, check_outputs, exact_indices

BF16 = ml_dtypes.bfloat16


def check(contract, before, after):
    return check_outputs(contract, [before], [after], [f"b{i}" for i in range(len(before))],
                         [f"a{i}" for i in range(len(after))])


def test_bitwise_is_nan_aware_and_sign_exact():
    x = np.array([1.0, np.nan, -0.0, np.inf], np.float32)
    assert check(BITWISE, [x], [x.copy()]) is None
    v = check(BITWISE, [x], [np.array([1.0, np.nan, 0.0, np.inf], np.float32)])
    assert (v.position, v.index, v.before, v.after) == (0, (2,), -0.0, 0.0)
    v = check(BITWISE, [x, x], [x, np.array([1.0, 2.0, -0.0, np.inf], np.float32)])
    assert v.position == 1 and v.index == (1,) and v.describe().startswith("output #1 %a1 (was %b1), worst element [1]")


def test_bitwise_reports_the_worst_element():
    b = np.zeros((3, 4), BF16)
    a = b.copy()
    a[0, 1], a[2, 3] = 0.5, 4.0
    v = check(BITWISE, [b], [a])
    assert v.index == (2, 3) and v.after == 4.0 and v.measure == "|diff| 4, bitwise required"


def test_exact_indices_ints_exact_floats_within_tolerance():
    idx, val = np.array([3, 1, 2], np.int32), np.array([1.0, 2.0], np.float32)
    assert check(exact_indices(rtol=1e-3), [idx, val], [idx, val * np.float32(1.0005)]) is None
    v = check(exact_indices(rtol=1e-3), [idx, val], [np.array([3, 2, 1], np.int32), val])
    assert v.position == 0 and v.index == (1,) and (v.before, v.after) == (1, 2)
    assert check(exact_indices(), [val], [val * np.float32(1.0000001)]) is not None  # default: floats bitwise


@pytest.mark.parametrize("dtype, eps", [(np.float32, 2.0**-23), (BF16, 2.0**-7), (np.float16, 2.0**-10)])
def test_bounded_reassoc_counts_ulps_of_the_dtype(dtype, eps):
    b = np.array([1.0, 3.0, -100.0], dtype)
    spacing = np.array([1.0, 2.0, 64.0]) * eps          # the binade of each value
    a = (b.astype(np.float64) + 2 * spacing).astype(dtype)
    assert check(bounded_reassoc(2), [b], [a]) is None
    v = check(bounded_reassoc(1), [b], [a])
    assert v is not None and v.measure.endswith("ulp > 1 ulp")
    assert check(bounded_reassoc(1), [np.array([7], np.int32)], [np.array([8], np.int32)]) is not None


def test_approx():
    b = np.array([100.0, 0.0], np.float32)
    assert check(approx(rtol=1e-2, atol=1e-6), [b], [np.array([100.9, 1e-7], np.float32)]) is None
    v = check(approx(rtol=1e-2, atol=1e-6), [b], [np.array([100.9, 1e-5], np.float32)])
    assert v.index == (1,) and "allowed 1e-06" in v.measure
    assert check(approx(rtol=1.0), [np.array([np.inf])], [np.array([-np.inf])]) is not None


def test_shape_dtype_and_count_mismatches():
    f = np.zeros(3, np.float32)
    assert check(BITWISE, [f], [np.zeros(4, np.float32)]).measure == "shape (4,) != (3,)"
    assert "dtype" in check(BITWISE, [f], [f.astype(BF16)]).measure
    assert "returns 2 values" in check(BITWISE, [f], [f, f]).measure
    assert check(BITWISE, [None], [None]) is None


def test_ranks_are_named():
    f = np.zeros(2, np.float32)
    v = check_outputs(BITWISE, [[f], [f]], [[f], [f + 1]], ["y"], ["y"])
    assert v.rank == 1 and "on rank 1" in v.describe()


def test_contract_text():
    assert [str(c) for c in (BITWISE, exact_indices(), exact_indices(rtol=0.01), bounded_reassoc(4),
                             approx(1e-3, 1e-5))] == \
        ["bitwise", "exact-indices", "exact-indices(rtol=0.01, atol=0)", "bounded-reassoc(4)",
         "approx(rtol=0.001, atol=1e-05)"]

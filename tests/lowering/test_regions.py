"""Views and regions: strided transforms of a buffer and element-exact overlap."""
from __future__ import annotations

import numpy as np
import pytest

from lowering.regions import Region, View, materialize


def test_whole_view_is_one_interval():
    v = View.whole("b", (4, 8))
    assert v.region().intervals == ((0, 32),)
    assert v.contiguous


def test_column_slice_is_one_interval_per_row():
    v = View.whole("b", (4, 8)).slice(1, 2, 3)
    assert v.region().intervals == ((2, 5), (10, 13), (18, 21), (26, 29))
    assert v.label() == "b[:, 2:5]"


def test_row_slice_then_reshape_stays_a_view():
    v = View.whole("b", (4, 8)).slice(0, 1, 2).reshape((16,))
    assert v is not None and v.offset == 8 and v.region().intervals == ((8, 24),)


def test_reshape_of_a_column_slice_is_not_a_view():
    assert View.whole("b", (4, 8)).slice(1, 0, 4).reshape((16,)) is None


def test_reshape_that_keeps_the_strided_axis_is_a_view():
    v = View.whole("b", (4, 8)).slice(1, 0, 4).reshape((4, 2, 2))
    assert v is not None and v.strides == (8, 2, 1)


@pytest.mark.parametrize("a, b, overlap", [
    (((0, 4),), ((4, 8),), False),
    (((0, 5),), ((4, 8),), True),
    (((0, 2), (10, 12)), ((2, 10),), False),
    (((0, 2), (10, 12)), ((11, 20),), True),
])
def test_overlap(a, b, overlap):
    assert Region("b", a).overlaps(Region("b", b)) is overlap
    assert Region("b", b).overlaps(Region("b", a)) is overlap
    assert not Region("b", a).overlaps(Region("c", a))


def test_regions_match_numpy_element_sets():
    base = np.arange(6 * 10).reshape(6, 10)
    views = [View.whole("b", (6, 10)).slice(1, 3, 4).slice(0, 1, 3),
             View.whole("b", (6, 10)).reshape((3, 20)).slice(1, 5, 10),
             View.whole("b", (6, 10)).slice(0, 2, 2).reshape((4, 5))]
    for v in views:
        elements = set(materialize(base.reshape(-1), v).reshape(-1).tolist())
        covered = {i for lo, hi in v.region().intervals for i in range(lo, hi)}
        assert elements == covered

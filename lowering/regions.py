"""Buffer views and the storage regions they touch.

A `View` is numpy's strided view over one buffer's flat, row-major storage: an element offset, a shape
and element strides. Pure view ops (reshape, slice, concat placement) transform views instead of
running a task. The `Region` of a view is the set of storage elements it covers, kept as sorted,
disjoint half-open intervals, so two accesses conflict exactly when their regions overlap: reshaped and
sliced views of one buffer are compared element for element, not by name.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

Interval = tuple[int, int]


def row_major_strides(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for extent in reversed(shape):
        strides.append(step)
        step *= max(int(extent), 1)
    return tuple(reversed(strides))


@dataclass(frozen=True)
class View:
    """A strided window (`offset`, `shape`, `strides`, all in elements) of buffer `buffer`.

    `text` is a readable description kept up to date by the transforms (`kv_cache[0:4, :]`).
    """

    buffer: str
    offset: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    text: str = ""

    @staticmethod
    def whole(buffer: str, shape: Sequence[int]) -> "View":
        shape = tuple(int(s) for s in shape)
        return View(buffer, 0, shape, row_major_strides(shape), buffer)

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def contiguous(self) -> bool:
        return self.strides == row_major_strides(self.shape) or self.numel <= 1

    def label(self) -> str:
        return self.text or self.buffer

    # ---- transforms (None: not expressible as a view) -------------------------------------------
    def slice(self, axis: int, start: int, size: int) -> "View":
        shape = list(self.shape)
        shape[axis] = size
        return View(self.buffer, self.offset + start * self.strides[axis], tuple(shape), self.strides,
                    _slice_text(self, axis, start, size))

    def reshape(self, shape: Sequence[int]) -> "View | None":
        shape = tuple(int(s) for s in shape)
        if self.contiguous:
            return View(self.buffer, self.offset, shape, row_major_strides(shape),
                        f"{self.label()}.reshape{list(shape)}")
        probe = np.lib.stride_tricks.as_strided(np.empty(1, np.uint8), self.shape, self.strides, writeable=False)
        try:  # numpy's own no-copy reshape rule; the probe's data is never read
            reshaped = np.reshape(probe, shape, copy=False)
        except ValueError:
            return None
        return View(self.buffer, self.offset, shape, tuple(int(s) for s in reshaped.strides),
                    f"{self.label()}.reshape{list(shape)}")

    def region(self) -> "Region":
        return Region.of(self)

    def to_json(self) -> dict:
        return {"buffer": self.buffer, "offset": self.offset, "shape": list(self.shape),
                "strides": list(self.strides), "text": self.text}

    @staticmethod
    def from_json(d: dict) -> "View":
        return View(d["buffer"], int(d["offset"]), tuple(d["shape"]), tuple(d["strides"]), d.get("text", ""))


def _slice_text(v: View, axis: int, start: int, size: int) -> str:
    base = v.label()
    index = [":"] * len(v.shape)
    index[axis] = f"{start}:{start + size}"
    if base.endswith("]") and "[" in base and ".reshape" not in base:  # refine an existing box
        head, _, inner = base[:-1].partition("[")
        parts = [p.strip() for p in inner.split(",")]
        if len(parts) == len(index) and parts[axis] == ":":
            parts[axis] = index[axis]
            return f"{head}[{', '.join(parts)}]"
    return f"{base}[{', '.join(index)}]"


@dataclass(frozen=True)
class Region:
    """Storage elements of one buffer: sorted, disjoint, non-adjacent half-open intervals."""

    buffer: str
    intervals: tuple[Interval, ...]

    @staticmethod
    def of(v: View) -> "Region":
        return Region(v.buffer, _intervals(v.offset, v.shape, v.strides))

    @property
    def size(self) -> int:
        return sum(b - a for a, b in self.intervals)

    def overlaps(self, other: "Region") -> bool:
        if self.buffer != other.buffer:
            return False
        a, b = self.intervals, other.intervals
        i = j = 0
        while i < len(a) and j < len(b):
            if a[i][0] < b[j][1] and b[j][0] < a[i][1]:
                return True
            if a[i][1] <= b[j][1]:
                i += 1
            else:
                j += 1
        return False


def _intervals(offset: int, shape: Sequence[int], strides: Sequence[int]) -> tuple[Interval, ...]:
    if any(s == 0 for s in shape):
        return ()
    dims = [(int(n), int(s)) for n, s in zip(shape, strides) if n != 1]
    run, outer = 1, list(dims)
    while outer and outer[-1][1] == run:  # the contiguous innermost block
        run *= outer.pop()[0]
    if not outer:
        return ((offset, offset + run),)
    starts = np.zeros(1, dtype=np.int64) + offset
    for n, s in outer:
        starts = (starts[:, None] + np.arange(n, dtype=np.int64)[None, :] * s).reshape(-1)
    starts.sort()
    merged: list[list[int]] = []
    for a in starts.tolist():
        if merged and a <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], a + run)
        else:
            merged.append([a, a + run])
    return tuple((a, b) for a, b in merged)


def materialize(storage: np.ndarray, v: View) -> np.ndarray:
    """The numpy view of `v` over a buffer's flat storage (writes go through to the storage)."""
    item = storage.itemsize
    return np.lib.stride_tricks.as_strided(storage[v.offset:], v.shape, tuple(s * item for s in v.strides))


"""Paged-cache addressing shared by the goldens (dsv4-math §10 "Paged metadata").

A block table row maps a request's logical pages to physical pages; −1 is an unmapped page. Physical row =
table[b, i // BS]·BS + i % BS. Compressor state uses ring tables: page (pos // BS) % pages.
"""
from __future__ import annotations

import numpy as np


def request_of_tokens(tokens: int, seq: int) -> np.ndarray:
    """b(t) = t // S: requests own S consecutive token rows."""
    return np.arange(tokens) // seq


def page_rows(table: np.ndarray, logical, block_size: int) -> np.ndarray:
    """Physical rows for logical rows `logical` (any shape, last dims broadcast against table rows).

    table: [..., W] per-row block tables aligned with logical's leading dims. −1 where the logical row is
    negative, beyond the table, or on an unmapped page.
    """
    logical = np.asarray(logical, dtype=np.int64)
    width = table.shape[-1]
    page = logical // block_size
    inside = (logical >= 0) & (page < width)
    block = np.take_along_axis(table, np.where(inside, page, 0).reshape(table.shape[:-1] + (-1,)), axis=-1)
    block = block.reshape(logical.shape)
    ok = inside & (block >= 0)
    return np.where(ok, block * block_size + logical % block_size, -1)


def ring_rows(table: np.ndarray, pos, block_size: int) -> np.ndarray:
    """Physical state rows for positions `pos` through ring tables [..., pages]; −1 for pos < 0 or unmapped."""
    pos = np.asarray(pos, dtype=np.int64)
    pages = table.shape[-1]
    ring_pos = (pos // block_size) % pages * block_size + pos % block_size
    return np.where(pos >= 0, page_rows(table, np.where(pos >= 0, ring_pos, 0), block_size), -1)


def write_rows(pool: np.ndarray, rows, values) -> np.ndarray:
    """A copy of `pool` with values[i] stored at rows[i]; rows −1 are skipped (later rows win)."""
    out = pool.copy()
    rows = np.asarray(rows)
    keep = rows >= 0
    out[rows[keep]] = np.asarray(values)[keep]
    return out


def gather_rows(pool: np.ndarray, rows) -> tuple[np.ndarray, np.ndarray]:
    """(pool[rows] with −1 rows read as zeros, valid mask)."""
    rows = np.asarray(rows)
    valid = rows >= 0
    data = pool[np.where(valid, rows, 0)]
    zero_shape = valid.shape + (1,) * (data.ndim - valid.ndim)
    return np.where(valid.reshape(zero_shape), data, 0).astype(pool.dtype), valid

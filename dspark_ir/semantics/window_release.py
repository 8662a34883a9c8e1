"""numpy reference of window_release (dspark_ir/ops/window_release.py): a barrier plus a credit reset, no data.

Collective reference: `per_rank[r] = [window]`; returns one token (None) per rank.
"""
from __future__ import annotations


def window_release(per_rank, *, ranks, **_):
    """Barrier 2 and the credit reset of an exchange window whose consumers are done: no value changes."""
    return [None] * ranks

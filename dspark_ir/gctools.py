"""`paused_gc()`: run a compile step without Python's cyclic garbage collector.

Graphs are webs of reference cycles (a Value points at its producer Node, the Node at its results), and a
pass pipeline allocates many of them (a clone per pass for the change record). With the collector on, every
few thousand allocations trigger a collection that walks every live object, so a compile of a large graph
spends a growing share of its time there (about 30 % of the 43-layer model's compile). Pausing it for the
duration of parse / pipeline / lowering changes no result; the garbage is collected when it resumes.
Nested use is fine: only the outermost pause turns the collector back on.
"""
from __future__ import annotations

import gc
from contextlib import contextmanager
from typing import Iterator


@contextmanager
def paused_gc() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()

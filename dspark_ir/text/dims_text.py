"""Parse a dim expression on its own (e.g. from a CLI flag or a Python string)."""
from __future__ import annotations

from functools import lru_cache

from ..dims import Dim


@lru_cache(maxsize=4096)
def parse_dim(text: str) -> Dim:
    from .parser import parse_dim_text

    return parse_dim_text(text)

"""Parsed graph-attribute values as plain Python values, shared by the lark parser and its fast path."""
from __future__ import annotations

from typing import Any

from .. import dims as D


def plain(value: Any) -> Any:
    """Graph attributes are plain Python values: integers, booleans, names as strings, lists."""
    if isinstance(value, list):
        return [plain(v) for v in value]
    if isinstance(value, D.Const):
        return value.n
    if isinstance(value, D.Sym):
        return {"true": True, "false": False}.get(value.name, value.name)
    return value

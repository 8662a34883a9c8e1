"""Op kinds. Modules are imported lazily the first time an op is looked up."""
from __future__ import annotations

import importlib
import pkgutil

from .base import OP_REGISTRY, REQUIRED, Attr, OpDef, get_op, register_op  # noqa: F401

_loaded = False


def load_all() -> None:
    global _loaded
    if _loaded:
        return
    _loaded = True
    for info in sorted(pkgutil.iter_modules(__path__), key=lambda m: m.name):
        if info.name != "base":
            importlib.import_module(f"{__name__}.{info.name}")

"""The DSpark graph IR: types, dims, ops, graphs, text form, verifier, DOT and interpreter.

The names below load their modules on first use (PEP 562), so `import dspark_ir.errors` or a CLI that only
prints its help does not import the parser, networkx or numpy."""
from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

_HOME = {
    "Dim": "dims", "ceildiv": "dims", "dim": "dims",
    "ConfigError": "errors", "DsparkError": "errors", "ParseError": "errors", "ShapeError": "errors",
    "VerifyError": "errors",
    "Graph": "graph", "Module": "graph", "Node": "graph", "Value": "graph",
    "parse_file": "text.parser", "parse_graph": "text.parser", "parse_module": "text.parser",
    "print_graph": "text.printer", "print_module": "text.printer",
    "TOKEN": "types", "DType": "types", "TensorType": "types",
    "check": "verifier", "verify": "verifier",
}

__all__ = [*_HOME, "__version__"]


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module 'dspark_ir' has no attribute '{name}'")
    value = getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:
    from .dims import Dim, ceildiv, dim  # noqa: F401
    from .errors import ConfigError, DsparkError, ParseError, ShapeError, VerifyError  # noqa: F401
    from .graph import Graph, Module, Node, Value  # noqa: F401
    from .text.parser import parse_file, parse_graph, parse_module  # noqa: F401
    from .text.printer import print_graph, print_module  # noqa: F401
    from .types import TOKEN, DType, TensorType  # noqa: F401
    from .verifier import check, verify  # noqa: F401

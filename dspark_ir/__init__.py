"""The DSpark graph IR: types, dims, ops, graphs, text form, verifier, DOT and interpreter."""
from __future__ import annotations

from .dims import Dim, ceildiv, dim
from .errors import ConfigError, DsparkError, ParseError, ShapeError, VerifyError
from .graph import Graph, Module, Node, Value
from .text.parser import parse_file, parse_graph, parse_module
from .text.printer import print_graph, print_module
from .types import TOKEN, DType, TensorType
from .verifier import check, verify

__version__ = "0.1.0"

__all__ = [
    "Dim", "ceildiv", "dim", "ConfigError", "DsparkError", "ParseError", "ShapeError", "VerifyError",
    "Graph", "Module", "Node", "Value", "TOKEN", "DType", "TensorType", "parse_file", "parse_graph",
    "parse_module", "print_graph", "print_module", "check", "verify", "__version__",
]

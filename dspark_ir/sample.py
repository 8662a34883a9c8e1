"""Seeded random inputs for any graph: what the numeric checks (passes --check-numerics) run on, unless the
graph is a registered layer's (then runner.sample_inputs gives it the golden's inputs instead).

`sample_inputs(g, seed)` returns a name → array dict, or a list of them (one per rank) when the graph runs
on several ranks (attribute `ranks`, else `tp`). Each parameter gets, independently of the other parameters
(the generator is keyed by seed, rank and name):
* floats: standard normal values, rounded to the parameter's dtype (bf16, fp16, fp8 round-to-nearest);
* bool: fair coin flips;
* i8: integers in [-8, 8);
* i32/i64: indices in [0, extent) when an op using the parameter declares which operand axis it indexes
  (`OpDef.index_operands = {operand_position: (indexed_operand_position, axis)}`), else in [0, 8);
* token parameters get no value (the interpreter binds them to None).
Every dim of every parameter must be bound (`<T = 16>`), else a one-line DsparkError says which.
"""
from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from dspark_ir.semantics.dtypes import NP_DTYPES

from .errors import DsparkError
from .graph import Graph, Value
from .interp import rank_count

SMALL_INDEX = 8


class SampleError(DsparkError):
    """Inputs cannot be generated for a graph (an unbound symbol)."""


def sample_inputs(g: Graph, seed: int = 0) -> dict[str, Any] | list[dict[str, Any]]:
    ranks = rank_count(g)
    per_rank = [_rank_inputs(g, seed, r) for r in range(ranks)]
    return per_rank if ranks > 1 else per_rank[0]


def _rank_inputs(g: Graph, seed: int, rank: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for p in g.params:
        if p.type.is_token:
            continue
        rng = np.random.default_rng([seed, rank, zlib.crc32(p.name.encode())])
        out[p.name] = _sample(g, p, _shape(g, p), rng)
    return out


def _shape(g: Graph, p: Value) -> tuple[int, ...]:
    shape = p.type.concrete_shape(g.env)
    if shape is not None:
        return shape
    free = sorted(set().union(*(d.symbols() for d in p.type.shape)) - set(g.env))
    raise SampleError(f"cannot sample %{p.name}: {p.type} uses unbound symbol {', '.join(free)} "
                      f"(bind it in the graph header, e.g. <{free[0]} = 16>)",
                      f"graph '@{g.name}'")


def _sample(g: Graph, p: Value, shape: tuple[int, ...], rng: np.random.Generator) -> np.ndarray:
    dt = p.type.dtype
    np_dtype = NP_DTYPES[dt.value]
    if dt.is_float:
        return rng.standard_normal(shape, dtype=np.float32).astype(np_dtype)
    if dt.value == "bool":
        return rng.random(shape) < 0.5
    if dt.value == "i8":
        return rng.integers(-8, 8, shape).astype(np_dtype)
    return rng.integers(0, _index_extent(g, p), shape).astype(np_dtype)


def _index_extent(g: Graph, p: Value) -> int:
    """The smallest extent an op indexes with `p` (see OpDef.index_operands), else SMALL_INDEX."""
    extents = []
    for node in g.users(p):
        declared = getattr(node.opdef, "index_operands", None) or {}
        for position, (target, axis) in declared.items():
            if position < len(node.operands) and node.operands[position] is p and target < len(node.operands):
                n = node.operands[target].type.shape[axis].value(g.env)
                if n:
                    extents.append(n)
    return min(extents) if extents else SMALL_INDEX

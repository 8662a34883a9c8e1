"""Seeded random inputs for any graph: what the numeric checks (passes --check-numerics) run on, unless the
graph is a registered layer's (then runner.sample_inputs gives it the golden's inputs instead).

`sample_inputs(g, seed)` returns a name → array dict, or a list of them (one per rank) when the graph runs
on several ranks (attribute `ranks`, else `tp`). Each parameter gets, independently of the other parameters
(the generator is keyed by seed, rank and name):
* floats: standard normal values, rounded to the parameter's dtype (bf16, fp16, fp8 round-to-nearest);
* bool: fair coin flips;
* i8: integers in [-8, 8);
* i32/i64: indices in [0, extent) when an op using the parameter declares which operand axis it indexes
  (`OpDef.index_operands = {operand_position: (indexed_operand_position, axis)}`; a page table adds the attribute
  naming its page size, `(position, axis, "block_size")`, and indexes extent // page size pages), else in [0, 8);
* token parameters get no value (the interpreter binds them to None).
Every dim of every parameter must be bound (`<T = 16>`), else a one-line DsparkError says which. A graph whose
values (parameters and every op result, on every rank) would take more than VALUES_LIMIT_BYTES gets no inputs:
a one-line SampleError says how much they would need (T = 2**24 verifies, but cannot run in numpy).
"""
from __future__ import annotations

import math
import zlib
from typing import Any

import numpy as np

from dspark_ir.semantics.dtypes import NP_DTYPES

from .errors import DsparkError
from .graph import Graph, Value
from .interp import rank_count

SMALL_INDEX = 8
VALUES_LIMIT_BYTES = 8 << 30   # what the reference interpreter may hold for one run (all ranks)


class SampleError(DsparkError):
    """Inputs cannot be generated for a graph (an unbound symbol, or values too large to hold)."""


def sample_inputs(g: Graph, seed: int = 0) -> dict[str, Any] | list[dict[str, Any]]:
    check_size(g)
    ranks = rank_count(g)
    per_rank = [_rank_inputs(g, seed, r) for r in range(ranks)]
    return per_rank if ranks > 1 else per_rank[0]


def check_size(g: Graph) -> None:
    """Refuse (SampleError) a graph whose values would not fit what a numerics run may hold."""
    total = 0
    for v in [*g.params, *(r for node in g.nodes.values() for r in node.results)]:
        shape = None if v.type.is_token else v.type.concrete_shape(g.env)
        if shape is not None:
            total += math.prod(shape) * np.dtype(NP_DTYPES[v.type.dtype.value]).itemsize
    total *= rank_count(g)
    if total > VALUES_LIMIT_BYTES:
        raise SampleError(f"its values would need {total / 2**30:.3g} GiB over {rank_count(g)} rank(s) "
                          f"(T = {g.symbols.get('T')}), more than the {VALUES_LIMIT_BYTES >> 30} GiB a numerics "
                          "check may hold", f"graph '@{g.name}'")


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
        for position, (target, axis, *page) in node.opdef.index_operands.items():
            if position < len(node.operands) and node.operands[position] is p and target < len(node.operands):
                n = node.operands[target].type.shape[axis].value(g.env)
                if n and page:
                    n //= int(node.attrs[page[0]])
                if n:
                    extents.append(n)
    return min(extents) if extents else SMALL_INDEX

"""The reference interpreter: runs a verified graph op by op on numpy.

Each op's meaning is the numpy function its definition names (`OpDef.reference`), shared with the
lowering's numpy executor. A graph with `tp`/`ranks` > 1 runs once per rank in lockstep, with one
buffer set per rank; collective ops receive every rank's operands and return every rank's results.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from dspark_ir.semantics.dtypes import NP_DTYPES

from .dims import Dim
from .errors import DsparkError
from .graph import Graph, Node
from .types import TensorType


class InterpError(DsparkError):
    """An op failed or produced a value that does not match its declared type."""


def rank_count(g: Graph) -> int:
    return int(g.attributes.get("ranks", g.attributes.get("tp", 1)) or 1)


def run(g: Graph, inputs: Mapping[str, Any] | Sequence[Mapping[str, Any]], *,
        order: Sequence[Node] | None = None, keep: bool = False) -> Any:
    """Run `g`. Single rank: `inputs` is a name→array dict and the result is the returns dict.
    Several ranks: `inputs` is a list of dicts (one per rank) and the result is a list of dicts.
    `keep=True` returns every value (for per-node comparisons) instead of only the returns."""
    ranks = rank_count(g)
    per_rank = [inputs] if isinstance(inputs, Mapping) else list(inputs)
    if len(per_rank) != ranks:
        raise InterpError(f"graph runs on {ranks} ranks, got inputs for {len(per_rank)}", f"graph '@{g.name}'")
    envs = [_bind_params(g, r) for r in per_rank]
    for node in order or g.topo_order():
        _execute(g, node, envs)
    if keep:
        return envs[0] if isinstance(inputs, Mapping) else envs
    outs = [{v.name: env[v.name] for v in g.returns} for env in envs]
    return outs[0] if isinstance(inputs, Mapping) else outs


def _bind_params(g: Graph, given: Mapping[str, Any]) -> dict[str, Any]:
    env: dict[str, Any] = {}
    for p in g.params:
        if p.type.is_token:
            env[p.name] = None
            continue
        if p.name not in given:
            raise InterpError(f"missing input %{p.name}", f"graph '@{g.name}'")
        value = np.asarray(given[p.name]).astype(NP_DTYPES[p.type.dtype.value])
        _check_shape(value, p.type, g, f"input %{p.name}")
        env[p.name] = value.copy() if p.inout else value
    return env


def _execute(g: Graph, node: Node, envs: list[dict[str, Any]]) -> None:
    opdef = node.opdef
    fn = opdef.reference_fn()
    attrs = {k: _concrete(v, g) for k, v in node.attrs.items()}
    try:
        if opdef.collective:
            per_rank = fn([[env[v.name] for v in node.operands] for env in envs], ranks=len(envs), **attrs)
        else:
            per_rank = [fn(*[env[v.name] for v in node.operands], **attrs) for env in envs]
    except DsparkError:
        raise
    except Exception as e:  # a reference raising is a bug in the op or its inputs: name the node
        raise InterpError(f"{node.op} failed: {type(e).__name__}: {e}", node.where) from e
    for env, out in zip(envs, per_rank):
        outs = out if isinstance(out, tuple) else (out,)
        if len(outs) != len(node.results):
            raise InterpError(f"{node.op} returned {len(outs)} values for {len(node.results)} results", node.where)
        for v, value in zip(node.results, outs):
            if not v.type.is_token:
                _check_value(value, v.type, g, node, v.name)
            env[v.name] = value


def _concrete(value: Any, g: Graph) -> Any:
    if isinstance(value, Dim):
        n = value.value(g.env)
        if n is None:
            raise InterpError(f"attribute value {value} is not bound", f"graph '@{g.name}'")
        return n
    if isinstance(value, tuple):
        return tuple(_concrete(v, g) for v in value)
    if hasattr(value, "value") and not isinstance(value, (int, float, str, bool)):
        return getattr(value, "value")  # DType → its name
    return value


def _check_value(value: Any, t: TensorType, g: Graph, node: Node, name: str) -> None:
    if not isinstance(value, np.ndarray) or value.dtype != np.dtype(NP_DTYPES[t.dtype.value]):
        got = getattr(value, "dtype", type(value).__name__)
        raise InterpError(f"%{name}: {node.op} produced {got}, declared {t}", node.where)
    _check_shape(value, t, g, f"%{name}", node.where)


def _check_shape(value: np.ndarray, t: TensorType, g: Graph, what: str, where: str = "") -> None:
    shape = t.concrete_shape(g.env)
    if shape is not None and tuple(value.shape) != shape:
        raise InterpError(f"{what} has shape {tuple(value.shape)}, declared {t}", where or f"graph '@{g.name}'")

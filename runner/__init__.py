"""The runner: a layer graph beside its independent golden.

`dspark_ir.layers` builds graphs only and `goldens/` knows nothing of graphs; this package joins them.

Public API
----------
``layer_inputs(g, seed, regime="default")``
    Seeded inputs for the layer graph ``g`` from ``goldens.inputs.make_inputs`` / ``make_rank_inputs``, selected
    by the graph attributes ``kind``/``config``/``tp`` (and the bound ``B``/``S``): a name→array dict typed like
    ``g``'s parameters (exactly its parameter names), or a list of them (one per rank) when
    ``g.attributes["ranks"] > 1``.
``regimes(name)``
    The input regimes of layer ``name`` (``goldens.inputs.regimes_for`` of its golden kind).
``sample_inputs(g, seed)``
    What ``passes --check-numerics`` runs on: ``layer_inputs(g, seed)`` for a graph of a registered layer,
    else ``dspark_ir.sample.sample_inputs`` (per-dtype random values).
``golden_outputs(g, inputs)``
    The golden (``goldens.layers.run_layer`` / ``run_layer_ranks``) on the same inputs, as a
    golden-output-name→array dict (a list of dicts per rank).
``graph_outputs(g, result)``
    An executor's result (returned value name→array) under the golden output names.
``compare_outputs(g, result, golden, inputs=None)``
    ``graph_outputs`` then ``goldens.tolerances.compare_layer``: one ``Comparison`` per golden output; with the
    run's ``inputs``, buffers are compared on their written rows (``goldens.inputs.written_rows``) and every
    other row must equal the input.

``subblock_checks(g, values)``
    Stages of the graph (Sinkhorn comb, hc gates, hc collapse, hc_post, rmsnorm) against the golden's stage on
    the graph's own stage operands, from a run that kept every value (``runner/subblocks.py``): what a
    layer-level tolerance cannot see.

It executes nothing but the golden: callers bring the executor (``dspark_ir.interp.run`` or a lowering
backend), so the runner sits right above ``dspark_ir`` and below ``passes`` (docs/design.md).
"""
from __future__ import annotations

from typing import Any, Mapping

import numpy as np

from dspark_ir import layers
from dspark_ir.errors import ConfigError
from dspark_ir.graph import Graph
from dspark_ir.sample import check_size
from dspark_ir.sample import sample_inputs as random_inputs
from dspark_ir.semantics.dtypes import NP_DTYPES
from goldens import inputs as gi
from goldens import layers as gl
from goldens import prefill as gp
from goldens.tolerances import Comparison, compare_layer, prefill_flip_rows

from .subblocks import subblock_checks

__all__ = ["INPUT_LIMIT_BYTES", "compare_outputs", "golden_outputs", "graph_outputs", "layer_inputs", "regimes",
           "sample_inputs", "subblock_checks"]


def layer_inputs(g: Graph, seed: int, regime: str = "default") -> Any:
    """Seeded golden inputs for `g` (one dict, or one per rank when the graph runs on several ranks), typed
    like the graph's parameters and restricted to them."""
    cfg = layers.graph_config(g)
    kind = g.attributes["kind"]
    _check_input_size(g)
    regime = _regime_within_context(g, cfg, kind, regime)
    try:
        if kind in gp.KINDS:
            _check_prefill_regime(regime)
            per_rank = gp.make_prefill_inputs(kind, cfg, int(g.symbols["T"]), int(g.attributes.get("start", 0)),
                                              seed)
        elif _ranks(g) > 1:
            per_rank = gi.make_rank_inputs(kind, cfg, seed, regime=regime)
        else:
            per_rank = [gi.make_inputs(kind, cfg, seed, regime=regime)]
    except ValueError as e:
        raise ConfigError(str(e)) from None
    typed = [_typed(g, d) for d in per_rank]
    return typed if _ranks(g) > 1 else typed[0]


PREFILL_REGIMES = ("default",)   # a prefill chunk's inputs are set by its layer parameters (chunk, start)


def regimes(name: str) -> tuple[str, ...]:
    """The input regimes of a layer (goldens.inputs.regimes_for; prefill layers: only "default")."""
    kind = layers.layer_spec(name).golden
    return PREFILL_REGIMES if kind in gp.KINDS else tuple(gi.regimes_for(kind))


def _check_prefill_regime(regime: str) -> None:
    if regime not in PREFILL_REGIMES:
        raise ValueError(f"regime: a prefill layer has only the default regime (chunk and start set its inputs), "
                         f"got {regime!r}")


def sample_inputs(g: Graph, seed: int = 0) -> Any:
    """Golden inputs for a graph of a registered layer, random ones (dspark_ir.sample) for any other graph."""
    if g.attributes.get("layer") in layers.LAYER_NAMES:
        check_size(g)
        return layer_inputs(g, seed)
    return random_inputs(g, seed)


def golden_outputs(g: Graph, inputs: Any) -> Any:
    """The golden layer on `inputs`: golden-output-name → array (a list of dicts, one per rank)."""
    cfg = layers.graph_config(g)
    kind = g.attributes["kind"]
    if kind in gp.KINDS:
        outs = gp.run_prefill(kind, cfg, [dict(d) for d in (inputs if isinstance(inputs, list) else [inputs])])
        return outs if _ranks(g) > 1 else outs[0]
    if _ranks(g) > 1:
        return gl.run_layer_ranks(kind, cfg, [dict(d) for d in inputs])
    return gl.run_layer(kind, cfg, dict(inputs))


def graph_outputs(g: Graph, result: Any) -> Any:
    """Rename an executor's result (returned value name → array) to golden output names."""
    names = list(g.attributes.get("outputs") or [v.name for v in g.returns])

    def one(r: Mapping[str, Any]) -> dict[str, Any]:
        return {n: r[v.name] for n, v in zip(names, g.returns)}

    return [one(r) for r in result] if isinstance(result, list) else one(result)


def compare_outputs(g: Graph, result: Any, golden: Any, inputs: Any = None) -> list[Comparison]:
    """Every golden output against the executor's `result` for `g`, under the documented tolerances. With the
    run's `inputs`, every cache and state buffer is compared on the rows the step writes (their slots, from
    the inputs) and its other rows must come back equal to the input."""
    written = None
    if inputs is not None:
        cfg, kind = layers.graph_config(g), g.attributes["kind"]
        per_rank = inputs if isinstance(inputs, list) else [inputs]
        if kind in gp.KINDS:
            written = gp.written_rows(kind, cfg, [{k: np.asarray(v) for k, v in d.items()} for d in per_rank])
        else:
            written = [gi.written_rows(kind, cfg, {k: np.asarray(v) for k, v in d.items()}) for d in per_rank]
        written = written if isinstance(inputs, list) else written[0]
    rows = int(g.symbols.get("S") or 1)
    if g.attributes["kind"] in gp.KINDS:
        rows = prefill_flip_rows(int(g.symbols["T"]) * _ranks(g), layers.graph_config(g).window)
    return compare_layer(graph_outputs(g, result), golden, g.attributes["layer"], rows, inputs, written)


INPUT_LIMIT_BYTES = 8 << 30  # golden inputs above this (all ranks together) are refused instead of allocated


def _check_input_size(g: Graph) -> None:
    """A graph with T = 2**40 builds, verifies and lowers, but its inputs cannot exist: say so in one line."""
    total = 0
    for p in g.params:
        shape = None if p.type.is_token else p.type.concrete_shape(g.env)
        if shape is not None:
            total += int(np.prod(shape, dtype=object)) * np.dtype(NP_DTYPES[p.type.dtype.value]).itemsize
    total *= _ranks(g)
    if total > INPUT_LIMIT_BYTES:
        raise ConfigError(f"the inputs need {total / 2**30:.3g} GiB over {_ranks(g)} rank(s) (T = "
                          f"{g.symbols.get('T')}), more than the {INPUT_LIMIT_BYTES >> 30} GiB limit",
                          f"graph '@{g.name}'")


def _regime_within_context(g: Graph, cfg: Any, kind: str, regime: str) -> str:
    """A graph built with `max_context` promises kv_seq_len <= max_context; the default regime mixes long
    caches in, so pick the first regime that keeps that promise (an explicit regime must keep it too)."""
    limit = g.attributes.get("max_context")
    if limit is None or kind not in ("csa", "hca", "swa"):
        return regime
    ranges = gi.start_ranges(cfg)
    fits = [r for r in ("short_cache", "topk_boundary", "window_boundary", "empty_cmp")
            if r in ranges and ranges[r][1] + cfg.seq <= limit]
    if regime == "default" and fits:
        return fits[0]
    if regime in ranges and ranges[regime][1] + cfg.seq > limit:
        raise ConfigError(f"regime '{regime}' reaches kv_seq_len {ranges[regime][1] + cfg.seq}, beyond this "
                          f"graph's max_context = {limit}")
    return regime


def _typed(g: Graph, given: Mapping[str, Any]) -> dict[str, Any]:
    out = {}
    for p in g.params:
        if p.name not in given:
            raise layers.LayerError(f"goldens.inputs has no input '{p.name}' for layer '{g.attributes['layer']}'")
        out[p.name] = np.asarray(given[p.name]).astype(NP_DTYPES[p.type.dtype.value])
    return out


def _ranks(g: Graph) -> int:
    return int(g.attributes.get("ranks", 1) or 1)

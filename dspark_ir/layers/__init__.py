"""Layer builders: one graph per DSpark decode layer kind, in the seed's *before* (unoptimised) structure.

Public API
----------
``LAYER_NAMES``
    ``("decode-swa", "decode-csa", "decode-hca", "moe")``: every registered layer kind, in order.
``build(name, config="tiny", tp=None, batch=None, seq=None, **params) -> Graph``
    Build and verify a layer graph. ``config`` is a config name ("tiny", "flash") or a
    ``goldens.config.ModelConfig``; ``tp`` is 1 or 4 (or 2 for tiny), default the config's; ``batch`` is requests
    per rank (B), ``seq`` tokens per request (S). ``params`` are the layer's own keyword parameters (cache extents,
    ...; see the builder function's signature). An unknown layer raises ``DsparkError`` with a did-you-mean, an
    impossible combination a one-line ``ConfigError``.
``summary(name) -> str``
    One line describing the layer (``dspark list``).
``layer_inputs(g, seed, regime="default")``
    Seeded inputs for ``g`` from ``goldens.inputs.make_inputs`` / ``make_rank_inputs``, selected by the graph
    attributes ``kind``/``config``/``tp`` (and the bound ``B``/``S``): a name→array dict typed like ``g``'s
    parameters (exactly its parameter names), or a list of them (one per rank) when ``g.attributes["ranks"] > 1``.
    ``regimes(name)`` lists the regimes.
``golden_outputs(g, inputs)``
    The independent golden (``goldens.layers``) on the same inputs, as a golden-output-name→array dict (a list of
    dicts per rank). ``graph_outputs(g, result)`` maps an interpreter result to the same names.
``register_layer(name, builder, summary, golden)``
    The registry: one line per layer kind (see the bottom of this module). ``builder`` is
    ``"module:function"`` (imported lazily, so a missing module only fails that layer); ``golden`` is the
    goldens layer kind (``goldens.layers.run_layer`` / ``run_layer_ranks``) a graph of this layer is checked
    against. A builder may change it per graph (``b.kind = "moe_hash"``) and the rank count (``b.ranks = cfg.ep``).
``layer_params(name)``, ``graph_config(g)``, ``resolve_config(config, tp, batch, seq)``
    A layer's own parameters with defaults; the ModelConfig a layer graph was built for; config resolution.
Comparison with the golden: ``goldens/tolerances.py`` (``compare_layer(result, golden, layer, seq)``, one
documented tolerance per output name).

Writing a builder
-----------------
A builder is ``def build_xxx(b: GraphBuilder, *, <layer params with defaults>) -> None``. It declares the graph
parameters with ``b.param`` (named like the ``goldens.inputs`` keys), adds ops with ``b.op`` and ends with
``b.ret(golden_name=value, ...)`` in the golden's output order. Shared sub-blocks are in ``layers/common.py``::

    def build_swa(b: GraphBuilder) -> None:                      # layers/swa.py, abridged
        p = common.attention_params(b)                            # common inputs, named like goldens.inputs
        pre, x_normed, late, qkv = common.attention_prefix(b, p)  # hc_pre → rms_norm + late_dep → qkv_proj_rope
        kv_cache, bias = b.op("swa_cache_insert_valid_bias", qkv.kv, p.kv_cache, p.swa_slot_mapping, p.swa_lens,
                              name="swa.swa_cache_insert_valid_bias", window=b.cfg.window, blocks=1)
        ...
        attn_out = common.o_proj(b, packed, p.wo_a, p.wo_b, p.wo_b_scale)   # TP1 form, or a2a + O + RS at TP > 1
        x_out = common.hc_post(b, attn_out, p.x_hc, pre)
        b.ret(x_out=x_out, kv_cache=kv_cache)

The finer builders (``hc_pre``, ``attn_norm``, ``qkv_proj_rope``, ``o_proj``, ``hc_post``) are documented in
``layers/common.py``; MoE uses ``hc_pre(b, ..., block="hc")`` and ``hc_post`` directly.

``GraphBuilder`` (``b``) gives: ``b.cfg`` (ModelConfig, already ``with_(tp=, batch=, seq=)``), ``b.tiles``
(TileConfig), ``b.geo`` (CacheGeometry), ``b.tp``, the dims ``b.T``, ``b.B``, ``b.S`` (symbols, bound in the
header), ``b.dim(expr)``, ``b.bind(symbol, value)`` for extra extents, ``b.param(name, dtype, shape, inout=False)``,
``b.op(kind, *operands, name=..., deps=(), **attrs)`` (returns a ``Value``, or a tuple of them for multi-result
ops; result names are ``name``, ``name.<result>``...; pass ``names=[...]`` to choose them; attributes that are
``None`` are dropped), ``b.clamp(extent, tile)`` (``{"tail": "clamp"}`` when the tile does not divide the bound
extent, to splat into ``b.op``), ``b.ranks`` / ``b.kind`` (graph attributes) and ``b.ret(**outs)``.
Node names are provenance ``block.stage[.suffix]`` with the seed's stage names (``%qkv.kv_proj_matmul``).

Graph attributes: ``layer``, ``config``, ``tp``, ``ranks`` (rank instances running the graph; collectives exchange
between them), ``kind`` (the goldens layer kind) and ``outputs`` (the golden output name of each returned value,
in return order).
Bound symbols: ``T`` (tokens per rank), ``B``, ``S`` and the layer's cache extents (``KV`` = original-KV rows).
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from ..dims import Dim, Sym, dim
from ..errors import ConfigError, DsparkError, did_you_mean
from ..graph import Graph, Value
from ..types import TensorType
from ..verifier import verify

__all__ = [
    "LAYER_NAMES", "GraphBuilder", "LayerSpec", "build", "summary", "layer_inputs", "golden_outputs",
    "graph_outputs", "register_layer", "resolve_config", "layer_spec", "layer_params", "regimes", "graph_config",
]


class LayerError(DsparkError):
    """An unknown or unavailable layer."""


@dataclass(frozen=True)
class LayerSpec:
    name: str
    builder: str          # "module:function"
    summary: str
    golden: str           # goldens layer kind: run_layer / run_layer_ranks(kind, ...) ("swa", "moe", ...)

    def builder_fn(self) -> Callable[..., None]:
        return _import(self.builder, f"layer '{self.name}'")



_REGISTRY: dict[str, LayerSpec] = {}
LAYER_NAMES: tuple[str, ...] = ()


def register_layer(name: str, builder: str, summary: str, golden: str) -> None:
    """Add a layer kind. One line per kind, at the bottom of this module."""
    global LAYER_NAMES
    _REGISTRY[name] = LayerSpec(name, builder, summary, golden)
    LAYER_NAMES = tuple(_REGISTRY)


def layer_spec(name: str) -> LayerSpec:
    if name not in _REGISTRY:
        raise LayerError(f"unknown layer '{name}'{did_you_mean(name, _REGISTRY)} (known: {', '.join(_REGISTRY)})")
    return _REGISTRY[name]


def summary(name: str) -> str:
    return layer_spec(name).summary


def _import(ref: str, what: str) -> Any:
    module, _, fn = ref.partition(":")
    try:
        return getattr(importlib.import_module(module), fn)
    except ModuleNotFoundError as e:
        if e.name and module.startswith(e.name):
            raise LayerError(f"{what} is not available yet ({module} is missing)") from None
        raise
    except AttributeError:
        raise LayerError(f"{what} is not available yet ({ref} is missing)") from None


# ---- configs ------------------------------------------------------------------------------------------------
TP_CHOICES = {"tiny": (1, 2, 4), "flash": (1, 4)}


MAX_SYMBOL_VALUE = 2**62  # dims print as int64 literals; keep products of two symbols' bounds apart


def resolve_config(config: Any = "tiny", tp: int | None = None, batch: int | None = None,
                   seq: int | None = None):
    """A validated ModelConfig from a name or a config, with tp/batch/seq overrides. Raises ConfigError."""
    from goldens import config as gc

    try:
        cfg = gc.config_by_name(config) if isinstance(config, str) else config
        if not isinstance(cfg, gc.ModelConfig):
            raise ConfigError(f"config: expected a config name or a ModelConfig, got {type(config).__name__}")
        choices = TP_CHOICES.get(cfg.name, (1, 4))
        if tp is not None and tp not in choices:
            raise ConfigError(f"tp: {tp} is not supported for config '{cfg.name}' (choose {_or(choices)})")
        overrides = {k: v for k, v in (("tp", tp), ("seq", seq)) if v is not None}
        if batch is not None:
            if batch <= 0:
                raise ConfigError(f"batch: must be positive, got {batch}")
            overrides["batch"] = batch
        if overrides:
            cfg = cfg.with_(**overrides)
        if cfg.tokens * cfg.tp > MAX_SYMBOL_VALUE:
            raise ConfigError(f"batch: {cfg.tokens} tokens per rank is beyond what a dim can hold (2^62)")
        if cfg.tp not in choices:
            raise ConfigError(f"tp: {cfg.tp} is not supported for config '{cfg.name}' (choose {_or(choices)})")
        gc.tiles_for(cfg)
        return cfg
    except gc.ConfigError as e:
        raise ConfigError(str(e)) from None


def _or(choices: Sequence[int]) -> str:
    return ", ".join(map(str, choices[:-1])) + f" or {choices[-1]}" if len(choices) > 1 else str(choices[0])


# ---- the builder helper -------------------------------------------------------------------------------------
class GraphBuilder:
    """Builds one layer graph: parameters, ops with provenance names, returns and the graph attributes."""

    def __init__(self, layer: str, cfg, kind: str = "", graph_name: str | None = None):
        from goldens.config import cache_geometry, tiles_for

        self.layer = layer
        self.cfg = cfg
        self.tiles = tiles_for(cfg)
        self.geo = cache_geometry(cfg)
        self.tp = cfg.tp
        symbols = {"T": cfg.tokens, "B": cfg.batch, "S": cfg.seq}
        attributes = {"layer": layer, "config": cfg.name, "tp": cfg.tp, "ranks": cfg.tp, "kind": kind}
        self.graph = Graph(graph_name or layer.replace("-", "_"), symbols, attributes)
        self.T, self.B, self.S = Sym("T"), Sym("B"), Sym("S")

    @property
    def ranks(self) -> int:
        return int(self.graph.attributes["ranks"])

    @ranks.setter
    def ranks(self, n: int) -> None:
        self.graph.attributes["ranks"] = int(n)

    @property
    def kind(self) -> str:
        return str(self.graph.attributes["kind"])

    @kind.setter
    def kind(self, kind: str) -> None:
        self.graph.attributes["kind"] = kind

    def clamp(self, extent, tile: int) -> dict[str, str]:
        """{"tail": "clamp"} when `tile` does not divide `extent` (a dim over the bound symbols), else {}."""
        return {} if self.value(extent) % tile == 0 else {"tail": "clamp"}

    # dims and symbols
    def dim(self, x) -> Dim:
        return dim(x)

    def bind(self, symbol: str, value: int) -> Dim:
        """Declare an extra bound symbol (a cache extent) and return it as a dim."""
        self.graph.symbols[symbol] = int(value)
        return Sym(symbol)

    def value(self, d) -> int:
        """The integer value of a dim under the bound symbols."""
        n = dim(d).value(self.graph.env)
        assert n is not None, f"{d} is not bound"
        return n

    # parameters, ops, returns
    def param(self, name: str, dtype: str, shape: Sequence[Any], inout: bool = False) -> Value:
        return self.graph.add_param(name, TensorType.of(dtype, shape), inout=inout)

    def op(self, kind: str, *operands: Value, name: str | None = None, names: Sequence[str] | None = None,
           deps: Sequence[Value] = (), **attrs: Any) -> Any:
        """Add one node. Returns its Value, or a tuple of Values for a multi-result op."""
        assert (name is None) != (names is None), "give name= or names="
        attrs = {k: v for k, v in attrs.items() if v is not None}
        node = self.graph.add_op(kind, list(operands), attrs, names=name if names is None else list(names),
                                 deps=[d for d in deps if d is not None])
        return node.results[0] if len(node.results) == 1 else tuple(node.results)

    def ret(self, **outputs: Value) -> Graph:
        """Return `outputs` (golden output name → value) in the given order and record their names."""
        self.graph.set_returns(list(outputs.values()))
        self.graph.attributes["outputs"] = list(outputs)
        return self.graph


# ---- build --------------------------------------------------------------------------------------------------
def build(name: str, config: Any = "tiny", tp: int | None = None, batch: int | None = None,
          seq: int | None = None, **params: Any) -> Graph:
    """Build and verify the graph of layer `name` (see the module docstring)."""
    spec = layer_spec(name)
    cfg = resolve_config(config, tp, batch, seq)
    fn = spec.builder_fn()
    _check_params(name, fn, params)
    b = GraphBuilder(name, cfg, spec.golden)
    fn(b, **params)
    if not b.graph.returns:
        raise LayerError(f"layer '{name}': the builder returned nothing (call b.ret)")
    verify(b.graph)
    return b.graph


def _check_params(name: str, fn: Callable[..., None], params: Mapping[str, Any]) -> None:
    sig = inspect.signature(fn)
    accepted = [p for p in list(sig.parameters)[1:] if sig.parameters[p].kind is inspect.Parameter.KEYWORD_ONLY]
    for key in params:
        if key not in accepted:
            known = f" (parameters: {', '.join(accepted)})" if accepted else " (it takes no parameters)"
            raise ConfigError(f"{key}: not a parameter of layer '{name}'{did_you_mean(key, accepted)}{known}")


def layer_params(name: str) -> dict[str, Any]:
    """The layer's own parameters and their defaults."""
    sig = inspect.signature(layer_spec(name).builder_fn())
    return {k: p.default for k, p in list(sig.parameters.items())[1:] if p.kind is inspect.Parameter.KEYWORD_ONLY}


# ---- inputs and goldens -------------------------------------------------------------------------------------
def graph_config(g: Graph):
    """The ModelConfig a layer graph was built for (from its attributes and bound B/S)."""
    attrs = g.attributes
    for key in ("layer", "config", "tp"):
        if key not in attrs:
            raise LayerError(f"graph '@{g.name}' has no '{key}' attribute; it is not a layer graph")
    cfg = resolve_config(attrs["config"], int(attrs["tp"]), g.symbols.get("B"), g.symbols.get("S"))
    ep = attrs.get("ep")
    if ep is not None and int(ep) != cfg.ep:
        from goldens.config import ConfigError as GoldenConfigError

        try:
            cfg = cfg.with_(ep=int(ep))
        except GoldenConfigError as e:
            raise ConfigError(str(e)) from None
    return cfg


def layer_inputs(g: Graph, seed: int, regime: str = "default") -> Any:
    """Seeded golden inputs for `g` (one dict, or one per rank when the graph runs on several ranks), typed
    like the graph's parameters and restricted to them."""
    from goldens import inputs as gi

    cfg = graph_config(g)
    kind = g.attributes["kind"]
    _check_input_size(g)
    regime = _regime_within_context(g, cfg, kind, regime)
    try:
        if _ranks(g) > 1:
            per_rank = gi.make_rank_inputs(kind, cfg, seed, regime=regime)
        else:
            per_rank = [gi.make_inputs(kind, cfg, seed, regime=regime)]
    except ValueError as e:
        raise ConfigError(str(e)) from None
    typed = [_typed(g, d) for d in per_rank]
    return typed if _ranks(g) > 1 else typed[0]


INPUT_LIMIT_BYTES = 8 << 30  # golden inputs above this (all ranks together) are refused instead of allocated


def _check_input_size(g: Graph) -> None:
    """A graph with T = 2**40 builds, verifies and lowers, but its inputs cannot exist: say so in one line."""
    import numpy as np

    from dspark_ir.semantics.dtypes import NP_DTYPES

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
    from goldens import inputs as gi

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
    import numpy as np

    from dspark_ir.semantics.dtypes import NP_DTYPES

    out = {}
    for p in g.params:
        if p.name not in given:
            raise LayerError(f"goldens.inputs has no input '{p.name}' for layer '{g.attributes['layer']}'")
        out[p.name] = np.asarray(given[p.name]).astype(NP_DTYPES[p.type.dtype.value])
    return out


def regimes(name: str) -> tuple[str, ...]:
    """The input regimes of a layer (goldens.inputs.regimes_for)."""
    from goldens import inputs as gi

    return tuple(gi.regimes_for(layer_spec(name).golden))


def _ranks(g: Graph) -> int:
    return int(g.attributes.get("ranks", 1) or 1)


def golden_outputs(g: Graph, inputs: Any) -> Any:
    """The golden layer on `inputs`: golden-output-name → array (a list of dicts, one per rank)."""
    from goldens import layers as gl

    cfg = graph_config(g)
    kind = g.attributes["kind"]
    if _ranks(g) > 1:
        return gl.run_layer_ranks(kind, cfg, [dict(d) for d in inputs])
    return gl.run_layer(kind, cfg, dict(inputs))


def graph_outputs(g: Graph, result: Any) -> Any:
    """Rename an interpreter result (returned value name → array) to golden output names."""
    names = list(g.attributes.get("outputs") or [v.name for v in g.returns])

    def one(r: Mapping[str, Any]) -> dict[str, Any]:
        return {n: r[v.name] for n, v in zip(names, g.returns)}

    return [one(r) for r in result] if isinstance(result, list) else one(result)


# ---- the registry: one line per layer kind ------------------------------------------------------------------
register_layer("decode-swa", "dspark_ir.layers.swa:build_swa",
               "SWA decode attention (ratio 0): window attention, fused cache insert + valid bias", "swa")
register_layer("decode-csa", "dspark_ir.layers.csa:build_csa",
               "CSA decode attention (ratio 4): compressor, lightning indexer, top-k sparse attention", "csa")
register_layer("decode-hca", "dspark_ir.layers.hca:build_hca",
               "HCA decode attention (ratio 128/16): compressor, window + all compressed rows", "hca")
register_layer("moe", "dspark_ir.layers.moe:build_moe",
               "MoE sublayer: hc_pre, gate/route, shared + routed experts, dispatch/combine, hc_post", "moe")

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
``register_layer(name, builder, summary, golden)``
    The registry: one line per layer kind (see the bottom of this module). ``builder`` is the builder function
    itself; ``golden`` is the goldens layer kind (``goldens.layers.run_layer`` / ``run_layer_ranks``) a graph of
    this layer is checked against, recorded as the graph attribute ``kind``. A builder may change it per graph
    (``b.kind = "moe_hash"``) and the rank count (``b.ranks = cfg.ep``).
``layer_params(name)``, ``graph_config(g)``, ``resolve_config(config, tp, batch, seq)``
    A layer's own parameters with defaults; the ModelConfig a layer graph was built for; config resolution.

This package builds graphs only. Their seeded inputs, the golden's outputs and the comparison under the
documented tolerances are the runner's (``runner/``: ``layer_inputs``, ``golden_outputs``, ``compare_outputs``)
and the goldens' (``goldens/tolerances.py``). Of ``goldens`` it imports only ``goldens.config`` (ModelConfig,
TileConfig, CacheGeometry: the goldens compute with the same tiles) and, in ``dspark_ir/semantics``,
``goldens.numerics`` (docs/design.md).

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

``GraphBuilder`` (``b``, ``layers/builder.py``) gives: ``b.cfg`` (ModelConfig, already ``with_(tp=, batch=,
seq=)``), ``b.tiles`` (TileConfig), ``b.geo`` (CacheGeometry), ``b.tp``, the dims ``b.T``, ``b.B``, ``b.S`` (symbols,
bound in the header), ``b.dim(expr)``, ``b.bind(symbol, value)`` for extra extents,
``b.param(name, dtype, shape, inout=False)``, ``b.op(kind, *operands, name=..., deps=(), **attrs)`` (returns a
``Value``, or a tuple of them for multi-result ops; result names are ``name``, ``name.<result>``...; pass
``names=[...]`` to choose them; attributes that are ``None`` are dropped), ``b.clamp(extent, tile)``
(``{"tail": "clamp"}`` when the tile does not divide the bound extent, to splat into ``b.op``), ``b.ranks`` /
``b.kind`` (graph attributes) and ``b.ret(**outs)``.
Node names are provenance ``block.stage[.suffix]`` with the seed's stage names (``%qkv.kv_proj_matmul``).

Graph attributes: ``layer``, ``config``, ``tp``, ``ranks`` (rank instances running the graph; collectives exchange
between them), ``kind`` (the goldens layer kind) and ``outputs`` (the golden output name of each returned value,
in return order).
Bound symbols: ``T`` (tokens per rank), ``B``, ``S`` and the layer's cache extents (``KV`` = original-KV rows).
"""
from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from goldens import config as gc

from ..errors import ConfigError, DsparkError, did_you_mean
from ..graph import Graph
from ..verifier import verify
from .builder import GraphBuilder
from .csa import build_csa
from .hca import build_hca
from .moe import build_moe
from .prefill import build_prefill_csa, build_prefill_hca, build_prefill_swa
from .swa import build_swa

__all__ = [
    "LAYER_NAMES", "GraphBuilder", "LayerError", "LayerSpec", "build", "summary", "register_layer", "resolve_config",
    "layer_spec", "layer_params", "graph_config",
]


class LayerError(DsparkError):
    """An unknown layer, or a builder that returned nothing."""


@dataclass(frozen=True)
class LayerSpec:
    name: str
    builder: Callable[..., None]   # build_xxx(b: GraphBuilder, *, <layer params>)
    summary: str
    golden: str           # goldens layer kind: run_layer / run_layer_ranks(kind, ...) ("swa", "moe", ...)


_REGISTRY: dict[str, LayerSpec] = {}
LAYER_NAMES: tuple[str, ...] = ()


def register_layer(name: str, builder: Callable[..., None], summary: str, golden: str) -> None:
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


# ---- configs ------------------------------------------------------------------------------------------------
TP_CHOICES = {"tiny": (1, 2, 4), "flash": (1, 4)}


MAX_SYMBOL_VALUE = 2**62  # dims print as int64 literals; keep products of two symbols' bounds apart


def resolve_config(config: Any = "tiny", tp: int | None = None, batch: int | None = None,
                   seq: int | None = None):
    """A validated ModelConfig from a name or a config, with tp/batch/seq overrides. Raises ConfigError."""
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


# ---- build --------------------------------------------------------------------------------------------------
def build(name: str, config: Any = "tiny", tp: int | None = None, batch: int | None = None,
          seq: int | None = None, **params: Any) -> Graph:
    """Build and verify the graph of layer `name` (see the module docstring)."""
    spec = layer_spec(name)
    cfg = resolve_config(config, tp, batch, seq)
    fn = spec.builder
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
    sig = inspect.signature(layer_spec(name).builder)
    return {k: p.default for k, p in list(sig.parameters.items())[1:] if p.kind is inspect.Parameter.KEYWORD_ONLY}


# ---- the config of a graph ----------------------------------------------------------------------------------
def graph_config(g: Graph):
    """The ModelConfig a layer graph was built for (from its attributes and bound B/S)."""
    attrs = g.attributes
    for key in ("layer", "config", "tp"):
        if key not in attrs:
            raise LayerError(f"graph '@{g.name}' has no '{key}' attribute; it is not a layer graph")
    cfg = resolve_config(attrs["config"], int(attrs["tp"]), g.symbols.get("B"), g.symbols.get("S"))
    if attrs.get("max_context"):
        cfg = gc.with_context(cfg, int(attrs["max_context"]))
    ep = attrs.get("ep")
    if ep is not None and int(ep) != cfg.ep:
        try:
            cfg = cfg.with_(ep=int(ep))
        except gc.ConfigError as e:
            raise ConfigError(str(e)) from None
    return cfg


# ---- the registry: one line per layer kind ------------------------------------------------------------------
register_layer("decode-swa", build_swa,
               "SWA decode attention (ratio 0): window attention, fused cache insert + valid bias", "swa")
register_layer("decode-csa", build_csa,
               "CSA decode attention (ratio 4): compressor, lightning indexer, top-k sparse attention", "csa")
register_layer("decode-hca", build_hca,
               "HCA decode attention (ratio 128/16): compressor, window + all compressed rows", "hca")
register_layer("moe", build_moe,
               "MoE sublayer: hc_pre, gate/route, shared + routed experts, dispatch/combine, hc_post", "moe")
register_layer("prefill-swa", build_prefill_swa,
               "SWA prefill attention: one request's chunk (T = chunk per rank, context-parallel at TP > 1)",
               "prefill_swa")
register_layer("prefill-hca", build_prefill_hca,
               "HCA prefill attention: the chunk's every ratio-R boundary pooled, window + compressed rows",
               "prefill_hca")
register_layer("prefill-csa", build_prefill_csa,
               "CSA prefill attention: both ratio-4 compressors over the chunk, prefill indexer, staged top-k",
               "prefill_csa")

"""A whole decode step as one graph: the FLASH model's decoder layers chained (benchmarks, scaling).

`model_graph(config, layers=None, moe=True)` builds one graph with a decoder layer per entry of
`goldens.config.layer_kinds(cfg)` (FLASH: 2 SWA, then CSA/HCA alternating, 43 layers): the attention
layer of that kind followed by the MoE sublayer (hash routing for the first `n_hash_layers`), each
layer's `x_out` feeding the next layer's `x_hc`. Weights and caches are per layer (names prefixed
`L<i>.`); the step inputs every layer reads (positions, tables, slot mappings, RoPE tables, token ids)
are shared graph parameters. Layer-specific cache extents (CMP, STATE, NL) are folded to constants so
the layers' symbols do not clash; T, B, S and KV stay symbols.
`repeat=2` chains the layer sequence twice (the "doubled graph" of the compile-speed scaling check).
`prefill=T` builds the prefill step instead: the prefill attention layers (prefill-swa/csa/hca, a chunk of T
tokens per rank at position 0) and the MoE sublayer on the chunk's T tokens (batch T, seq 1).
"""
from __future__ import annotations

from typing import Any, Mapping

from dspark_ir import dims as D
from dspark_ir.graph import Graph, Value

SHARED_SYMBOLS = ("T", "B", "S", "KV")
STEP_INPUTS = frozenset({
    "rope_cos", "rope_sin", "positions", "kv_seq_len", "kv_block_table", "swa_slot_mapping", "swa_indices",
    "swa_lens", "cmp_block_table", "cmp_slot_mapping", "cmp_state_block_table", "idx_block_table",
    "idx_slot_mapping", "idx_cmp_state_block_table", "input_ids", "tid2eid",
})
_KIND_LAYER = {"swa": "decode-swa", "csa": "decode-csa", "hca": "decode-hca"}
_PREFILL_LAYER = {"swa": "prefill-swa", "csa": "prefill-csa", "hca": "prefill-hca"}


def _fold(value: Any, env: Mapping[str, int]) -> Any:
    if isinstance(value, D.Dim):
        return value.evaluate(env) if value.symbols() - set(SHARED_SYMBOLS) else value
    if isinstance(value, tuple):
        return tuple(_fold(v, env) for v in value)
    if isinstance(value, list):
        return [_fold(v, env) for v in value]
    return value


def _fold_type(t, env):
    if t.is_token:
        return t
    local = {k: v for k, v in env.items() if k not in SHARED_SYMBOLS}
    return t.with_shape([_fold(d, local) for d in t.shape]) if local else t


def splice_layer(model: Graph, g: Graph, prefix: str, x_in: Value | None, shared: dict[str, Value]) -> Value:
    """Copy `g` into `model` with names prefixed; returns the copy of g's first return (x_out)."""
    env = {k: v for k, v in g.env.items() if k not in SHARED_SYMBOLS}
    mapping: dict[str, Value] = {}
    for p in g.params:
        if p.name == "x_hc" and x_in is not None:
            mapping[p.name] = x_in
        elif p.name in STEP_INPUTS:
            if p.name not in shared:
                shared[p.name] = model.add_param(p.name, _fold_type(p.type, env), p.inout)
            mapping[p.name] = shared[p.name]
        else:
            mapping[p.name] = model.add_param(f"{prefix}{p.name}", _fold_type(p.type, env), p.inout)
    for node in g.topo_order():
        attrs = {k: _fold(v, env) for k, v in node.attrs.items()}
        if isinstance(attrs.get("notifier"), str) and attrs["notifier"] in g.nodes:
            attrs["notifier"] = prefix + attrs["notifier"]      # signal links name their notifier node
        new = model.add_op(node.op, [mapping[v.name] for v in node.operands], attrs,
                           names=[f"{prefix}{v.name}" for v in node.results],
                           deps=[mapping[v.name] for v in node.deps],
                           types=[_fold_type(v.type, env) for v in node.results])
        for old, v in zip(node.results, new.results):
            mapping[old.name] = v
    model.returns.extend(mapping[v.name] for v in g.returns[1:])  # updated caches stay live
    return mapping[g.returns[0].name]


def model_graph(config: str = "flash", *, tp: int | None = None, batch: int | None = None, seq: int | None = None,
                layers: int | None = None, moe: bool = True, repeat: int = 1, prefill: int | None = None) -> Graph:
    """The decode step (or with `prefill` = T, the prefill step) of `config` as one graph (module docstring)."""
    from dspark_ir import layers as L
    from goldens.config import config_by_name, layer_kinds

    cfg = config_by_name(config)
    kinds = list(layer_kinds(cfg))[:layers] * max(1, repeat)
    built: dict[tuple, Graph] = {}

    names = _KIND_LAYER
    if prefill is not None:
        names, batch, seq = _PREFILL_LAYER, prefill, 1

    def layer(name: str, **kw) -> Graph:
        if prefill is not None and name.startswith("prefill-"):
            kw["chunk"] = prefill
        key = (name, tuple(sorted(kw.items())))
        if key not in built:
            built[key] = L.build(name, config=config, tp=tp, batch=batch, seq=seq, **kw)
        return built[key]

    first = layer(names[kinds[0]])
    symbols = {k: v for k, v in first.symbols.items() if k in SHARED_SYMBOLS}
    attrs = {k: v for k, v in first.attributes.items() if k in ("config", "tp", "ranks")}
    if moe:   # one die runs TP attention and EP MoE: signal windows have a cell per EP rank
        attrs["ranks"] = max(int(attrs.get("ranks", 1)), int(layer("moe", layer_id=0).attributes.get("ranks", 1)))
    step = "decode" if prefill is None else "prefill"
    model = Graph(f"{config}_{step}_step", symbols, {**attrs, "layer": "model", "layers": len(kinds)})
    shared: dict[str, Value] = {}
    x: Value | None = None
    for i, kind in enumerate(kinds):
        x = splice_layer(model, layer(names[kind]), f"L{i}.", x, shared)
        if moe:
            x = splice_layer(model, layer("moe", layer_id=i % len(layer_kinds(cfg))), f"L{i}.moe.", x, shared)
    model.returns.insert(0, x)
    model.set_returns(model.returns)
    return model


def moe_rounds_graph(config: Any = "tiny", *, ep: int | None = None, batch: int | None = None,
                     seq: int | None = None, rounds: int = 2) -> Graph:
    """`rounds` MoE sublayers chained (each one all-to-all round: dispatch → experts → combine), each round's
    x_out feeding the next round's x_hc, at a prefill chunk of T = batch·seq tokens per rank: how a long prefill
    request meets the EP handshake round after round (dspark-model.md §6(g): EP8 prefill deadlocked "once a
    request ran enough all-to-all rounds"). Weights and signal windows are per round (prefix `R<i>.`), as the
    model graph's per layer; positions and routing inputs are shared. Sort routing (layer n_hash_layers)."""
    from dspark_ir import layers as L
    from dspark_ir.errors import ConfigError
    from goldens.config import config_by_name

    if rounds < 1:
        raise ConfigError(f"rounds: must be >= 1, got {rounds}")
    cfg = config_by_name(config) if isinstance(config, str) else config
    one = L.build("moe", config=cfg, batch=batch, seq=seq, layer_id=cfg.n_hash_layers,
                  **({} if ep is None else {"ep": ep}))
    symbols = {k: v for k, v in one.symbols.items() if k in SHARED_SYMBOLS}
    attrs = {k: v for k, v in one.attributes.items() if k in ("config", "tp", "ranks", "ep")}
    model = Graph(f"{cfg.name}_moe_rounds", symbols, {**attrs, "rounds": rounds})
    shared: dict[str, Value] = {}
    x: Value | None = None
    for i in range(rounds):
        x = splice_layer(model, one, f"R{i}.", x, shared)
    model.returns.insert(0, x)
    model.set_returns(model.returns)
    return model

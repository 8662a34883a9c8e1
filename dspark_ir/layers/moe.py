"""The MoE sublayer in the seed's *before* form (dspark-model.md §3.6, §6(g) "Before"; dsv4-math §8).

    hc_pre (ffn weights) → gate: ffn_norm → x_norm_quant → gate → route_hash | route_sort
    → expert_shared ∥ [dispatch_meta → dispatch_push ⇢ dispatch_wait → dispatch_gather → expert_routed
    → combine ⇢ combine_wait] → shared_routed → hc_post

The graph runs on `ranks = ep` rank instances (EP1 is the same graph on one rank: every route is local and the
signals have no peers). `⇢` marks the two handshakes that are *not* edges in this form:

* `dispatch_push` has no result the wait reads: `dispatch_wait` is anchored only by a read of `indices`, and
  waits for `data_arrived ≥ epoch·NL` because every one of push's NL blocks notifies every peer.
* `combine` folds one notify into each of its NL scatter blocks; `combine_wait` (no anchor at all) waits for
  `combine_arrived ≥ epoch·NL`.
* AER (`aer = true`) is on every gate, dispatch and combine stage.

The `moe-handshake-deps` pass (§6(g) "After") finds both waits through their `notifier` attribute: it adds
`deps(%moe.dispatch_push)` to dispatch_wait, gates combine_wait on {combine, dispatch_push}, turns it into one
notify + wait (`signal_barrier`, combine's `notify_per = none`, expected = epoch) and drops `aer` from
dispatch_gather, combine, combine_wait and shared_routed (and, unless `drop_aer_on_waits=false`, from the
cross-rank waits dispatch_meta and dispatch_wait). `ops.signal.check_signals` keeps every expected count
equal to epoch × its notifier's per-epoch count.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..dims import Dim, Sym, ceildiv, dim
from ..errors import ConfigError
from ..graph import Value
from ..ops.signal import check_signals
from .builder import GraphBuilder

# seed tiles (gate.py): x_norm_quant token tile, gate M×N tile, route token tile
QUANT_T_TILE = 8
GATE_M_TILE = 16
GATE_N_TILE = 16
ROUTE_T_TILE = 8


@dataclass(frozen=True)
class Routing:
    x_i8: Value
    x_scale: Value
    indices: Value
    weights: Value


def build_moe(b: GraphBuilder, *, layer_id: int | None = None, ep: int | None = None, epoch: int = 1) -> None:
    """MoE layer `layer_id` (default: the first sort-routed layer, n_hash_layers) over `ep` ranks (default: the
    config's). Hash routing iff layer_id < n_hash_layers. `epoch` is the 1-based MoE call id of the signal waits."""
    from . import common

    hash_routing = configure(b, layer_id, ep, epoch)
    cfg = b.cfg
    x_hc = b.param("x_hc", "f32", [b.T, cfg.hc_mult, cfg.hidden])
    hc_fn = b.param("hc_fn", "f32", [cfg.mix_hc, cfg.hc_dim])
    hc_scale = b.param("hc_scale", "f32", [3])
    hc_base = b.param("hc_base", "f32", [cfg.mix_hc])
    pre = common.hc_pre(b, x_hc, hc_fn, hc_scale, hc_base)
    ffn_out = moe_ffn(b, pre.x_mixed, hash_routing=hash_routing, epoch=epoch)
    x_out = common.hc_post(b, ffn_out, x_hc, pre)
    b.ret(x_out=x_out)
    for error in check_signals(b.graph):   # the verifier does not run op-family graph checks (yet)
        raise error


def configure(b: GraphBuilder, layer_id: int | None, ep: int | None, epoch: int) -> bool:
    """Apply ep to the builder (ranks = ep), pick the goldens kind (moe_hash | moe) and record `ep` and `layer_id`
    as graph attributes. Returns whether the layer routes by hash."""
    cfg = b.cfg
    ep = cfg.ep if ep is None else ep
    layer_id = cfg.n_hash_layers if layer_id is None else layer_id
    if ep < 1 or cfg.n_experts % ep:
        raise ConfigError(f"ep: {ep} does not divide n_experts={cfg.n_experts}")
    if layer_id < 0:
        raise ConfigError(f"layer_id: must be >= 0, got {layer_id}")
    if epoch < 1:
        raise ConfigError(f"epoch: must be >= 1 (a 1-based MoE call id), got {epoch}")
    b.cfg = cfg.with_(ep=ep)
    b.ranks = ep
    hash_routing = layer_id < cfg.n_hash_layers
    b.kind = "moe_hash" if hash_routing else "moe"
    b.graph.attributes.update({"ep": ep, "layer_id": layer_id})
    return hash_routing


def moe_ffn(b: GraphBuilder, x_mixed: Value, *, hash_routing: bool, epoch: int = 1) -> Value:
    """gate → shared ∥ (dispatch → routed → combine) → shared_routed: ffn_out bf16[T, D]."""
    nl = b.bind("NL", b.cfg.local_experts)
    routing = gate(b, x_mixed, hash_routing)
    sh = expert_shared(b, routing)
    routed_y, combine_wait = dispatch_experts_combine(b, routing, nl, epoch)
    return b.op("moe_shared_routed", sh, routed_y, name="moe.shared_routed", deps=[combine_wait], blocks=b.T,
                aer=True)


# ---- gate (dsv4-math §8.1) --------------------------------------------------------------------------------------
def gate(b: GraphBuilder, x_mixed: Value, hash_routing: bool) -> Routing:
    cfg, T = b.cfg, b.T
    norm_w = b.param("norm_w", "bf16", [cfg.hidden])
    gate_w = b.param("gate_w", "f32", [cfg.n_experts, cfg.hidden])
    gate_bias = b.param("gate_bias", "f32", [cfg.n_experts])   # read by route_sort only (the seed passes it always)
    xg, inv_rms, x_scale, q_scale = b.op("moe_ffn_norm", x_mixed, norm_w, name="moe.ffn_norm", eps=cfg.rms_eps,
                                         blocks=T, aer=True)
    seed = b.op("join", name="moe.gate_seed")
    x_i8 = b.op("moe_x_norm_quant", xg, q_scale, name="moe.x_norm_quant", deps=[seed], aer=True,
                **_tiled(b, [(T, QUANT_T_TILE)]))
    m, n = GATE_M_TILE, min(GATE_N_TILE, cfg.n_experts)
    scores = b.op("moe_gate", xg, inv_rms, gate_w, name="moe.gate", aer=True,
                  **_tiled(b, [(T, m), (dim(cfg.n_experts), n)]))
    route_tiles = _tiled(b, [(T, ROUTE_T_TILE)])
    if hash_routing:
        tid2eid = b.param("tid2eid", "i32", [cfg.vocab, cfg.topk_experts])
        input_ids = b.param("input_ids", "i32", [T])
        indices, weights = b.op("moe_route_hash", scores, tid2eid, input_ids, name="moe.route_hash",
                                routed_scale=cfg.routed_scale, aer=True, **route_tiles)
    else:
        indices, weights = b.op("moe_route_sort", scores, gate_bias, name="moe.route_sort", topk=cfg.topk_experts,
                                routed_scale=cfg.routed_scale, aer=True, **route_tiles)
    return Routing(x_i8, x_scale, indices, weights)


def _tiled(b: GraphBuilder, axes: list[tuple[Dim, int]]) -> dict:
    """tile / blocks (product of the per-axis ceil-divisions) and tail = clamp when a tile does not divide."""
    blocks: Dim = dim(1)
    ragged = False
    for extent, size in axes:
        blocks = blocks * ceildiv(extent, size)
        ragged = ragged or b.value(extent) % size != 0
    return {"tile": [size for _, size in axes], "blocks": blocks, "tail": "clamp" if ragged else None}


# ---- experts (§8.2) ---------------------------------------------------------------------------------------------
def _expert_params(b: GraphBuilder, prefix: str, lead: list, inter: int) -> list[Value]:
    """w1, w3 i8[*lead, inter, D] and w2 i8[*lead, D, inter], each with its per-output-channel f32 scale."""
    d = b.cfg.hidden
    return [
        b.param(f"{prefix}w1", "i8", lead + [inter, d]), b.param(f"{prefix}w1_scale", "f32", lead + [inter]),
        b.param(f"{prefix}w3", "i8", lead + [inter, d]), b.param(f"{prefix}w3_scale", "f32", lead + [inter]),
        b.param(f"{prefix}w2", "i8", lead + [d, inter]), b.param(f"{prefix}w2_scale", "f32", lead + [d]),
    ]


def expert_shared(b: GraphBuilder, r: Routing) -> Value:
    ws = _expert_params(b, "sh_", [], b.cfg.n_shared * b.cfg.moe_inter)
    return b.op("moe_expert_shared", r.x_i8, r.x_scale, *ws, name="moe.expert_shared",
                swiglu_limit=b.cfg.swiglu_limit)


# ---- EP exchange (dspark-model.md §3.6 stages 4-5, §5) ------------------------------------------------------------
def dispatch_experts_combine(b: GraphBuilder, r: Routing, nl: Sym, epoch: int) -> tuple[Value, Value]:
    """dispatch_meta → dispatch_push ⇢ dispatch_wait → dispatch_gather → expert_routed → combine ⇢ combine_wait.
    Returns (routed_y, the combine_wait token)."""
    cfg, T, ranks = b.cfg, b.T, b.ranks
    rm = ranks * T                                      # RECV_MAX: every source may send all T rows to one expert
    k = cfg.topk_experts

    def window(name: str, dtype: str, shape: list) -> Value:
        return b.op("window", name=f"moe.{name}", shape=shape, dtype=dtype)

    arrived = window("arrived", "i32", [ranks, 1])
    data_arrived = window("data_arrived", "i32", [ranks, 1])
    combine_arrived = window("combine_arrived", "i32", [ranks, 1])
    recv_meta = window("recv_meta", "i32", [ranks, nl])
    recv_x = window("recv_x", "i8", [nl, rm, cfg.hidden])
    recv_aux = window("recv_aux", "f32", [nl, rm, 2])
    recv_route = window("recv_route", "i32", [nl, rm])
    routed_y_buf = window("routed_y_buf", "bf16", [T * k, cfg.hidden])

    meta, count = b.op("moe_dispatch_meta", r.indices, recv_meta, arrived, name="moe.dispatch_meta",
                       notifier="moe.dispatch_meta", epoch=epoch, expected=epoch, aer=True)
    lanes_x, lanes_aux, lanes_route = b.op(
        "moe_dispatch_push", r.indices, r.weights, r.x_i8, r.x_scale, recv_x, recv_aux, recv_route, data_arrived,
        name="moe.dispatch_push", notify_per="block", blocks=nl, aer=True)
    wait = b.op("signal_wait", data_arrived, r.indices, name="moe.dispatch_wait", notifier="moe.dispatch_push",
                epoch=epoch, expected=epoch * nl, aer=True)
    x, scale, weight, route = b.op("moe_dispatch_gather", lanes_x, lanes_aux, lanes_route, meta,
                                   name="moe.dispatch_gather", deps=[wait], blocks=nl, aer=True)
    recv_y = b.op("moe_expert_routed", x, scale, weight, count, *_expert_params(b, "", [nl], cfg.moe_inter),
                  name="moe.expert_routed", swiglu_limit=cfg.swiglu_limit)
    routed_y = b.op("moe_combine", recv_y, route, meta, routed_y_buf, combine_arrived, name="moe.combine",
                    notify_per="block", blocks=nl, aer=True)
    combine_wait = b.op("signal_wait", combine_arrived, name="moe.combine_wait", notifier="moe.combine",
                        epoch=epoch, expected=epoch * nl, aer=True)
    return routed_y, combine_wait

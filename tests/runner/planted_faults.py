"""Planted faults: mutation testing of the layer checks (issue 20).

Each fault changes the *graph side* only (an op's numpy reference, through `OpDef.reference`, or a node
attribute), never the goldens. A fault is caught in a run when `dspark run`'s comparison
(runner.compare_outputs on the written rows) or a sub-block check (runner.subblock_checks) fails.
A fault is *killed* when it is caught in every run it applies to (each layer whose graph has the op, at
TP 1 and 4, per seed). `kill_table()` runs the lot; `python -m tests.runner.planted_faults` prints it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import ml_dtypes
import numpy as np
import pytest

import runner
from dspark_ir import DsparkError, interp, layers
from dspark_ir.ops import get_op

LAYERS = ("decode-swa", "decode-csa", "decode-hca", "moe")
TPS = (1, 4)
SEEDS = (0, 1, 2)


@dataclass(frozen=True)
class Fault:
    family: str
    name: str
    op: str                                   # the op kind it plants into (selects the layers)
    plant: Callable[[pytest.MonkeyPatch], None]
    must: bool = False                        # an acceptance fault: must be caught in every run
    regime: str = "default"                   # the input regime whose branch the fault sits in


def _like(new, old):
    return np.asarray(new).astype(np.asarray(old).dtype)


def outputs(op: str, change: Callable[..., tuple], result: int = 0):
    """Plant `change(out, *operands)` → new out into result `result` of every `op` node."""
    def plant(mp):
        fn = get_op(op).reference

        def faulty(*args, **attrs):
            out = fn(*args, **attrs)
            many = isinstance(out, tuple)
            outs = list(out if many else (out,))
            outs[result] = _like(change(np.asarray(outs[result]).astype(np.float64), *args), outs[result])
            return tuple(outs) if many else outs[0]
        mp.setattr(get_op(op), "reference", staticmethod(faulty))
    return plant


def operand(op: str, index: int, change: Callable[[np.ndarray], np.ndarray]):
    """Plant `change(operand)` into operand `index` of every `op` node."""
    def plant(mp):
        fn = get_op(op).reference

        def faulty(*args, **attrs):
            args = list(args)
            args[index] = _like(change(np.asarray(args[index]).astype(np.float64)), args[index])
            return fn(*args, **attrs)
        mp.setattr(get_op(op), "reference", staticmethod(faulty))
    return plant


def attribute(op: str, **changes):
    """Plant attribute values into every `op` node (as if the builder had set them)."""
    def plant(mp):
        fn = get_op(op).reference

        def faulty(*args, **attrs):
            return fn(*args, **{**attrs, **changes})
        mp.setattr(get_op(op), "reference", staticmethod(faulty))
    return plant


def channel(factor: float, c: int = 0):
    def change(x, *_):
        x = x.copy()
        x[..., c] *= factor
        return x
    return change


def row(factor: float, r: int = 1):
    def change(x, *_):
        x = x.copy()
        x[r] *= factor
        return x
    return change


def swap_rows(r: int = 0):
    def change(x, *_):
        x = x.copy()
        x[[r, r + 1]] = x[[r + 1, r]]
        return x
    return change


def truncating_bf16(module: str):
    """The bf16 rounding of the ops in `module` (dspark_ir.semantics.<module>) rounds toward zero instead of to
    nearest even (a wrong rounding mode: a cast without mode="rint")."""
    def plant(mp):
        def to_bf16(x):
            bits = np.ascontiguousarray(np.asarray(x, np.float32)).view(np.uint32) & np.uint32(0xFFFF0000)
            return bits.view(np.float32).astype(ml_dtypes.bfloat16)
        mp.setattr(f"dspark_ir.semantics.{module}.to_bf16", to_bf16)
    return plant


def scaled(factor):
    return lambda x: x * factor


def negate_sin(x):
    return -x


def rope_sign_rows(op: str, index_sin: int, rows: Callable[..., np.ndarray]):
    """A RoPE sign error (sin negated) in the rows `rows(*operands)` of `op`'s output only: the written cache
    rows (a fault confined to what the step writes)."""
    def plant(mp):
        fn = get_op(op).reference

        def faulty(*args, **attrs):
            good = fn(*args, **attrs)
            bad_args = list(args)
            bad_args[index_sin] = _like(-np.asarray(args[index_sin], np.float64), args[index_sin])
            bad = fn(*bad_args, **attrs)
            pick = rows(*args)
            if isinstance(good, tuple):
                return tuple(np.where(_mask(pick, g), b, g) for g, b in zip(good, bad))
            return np.where(_mask(pick, good), bad, good)
        mp.setattr(get_op(op), "reference", staticmethod(faulty))
    return plant


def _mask(rows, like):
    m = np.zeros(np.asarray(like).shape[0], dtype=bool)
    m[np.asarray(rows, np.int64)] = True
    return m.reshape((-1,) + (1,) * (np.asarray(like).ndim - 1))


def _written_kv_rows(kv, kv_cache, slot_mapping, *rest):
    return np.flatnonzero(np.asarray(slot_mapping) >= 0)


def _neighbour_slot(x):
    """Off by one slot (to the neighbouring row of the same page: stays inside the pool)."""
    return np.where(x >= 0, x.astype(np.int64) ^ 1, x)


def _minus_one(x):
    return x - 1


def _plus_one(x):
    return x + 1


def _transpose_comb(x):
    return np.swapaxes(x, -1, -2)


def _zero(x):
    return np.zeros_like(x)


def _truncating_q8(out, x_f32, *_):
    """q8 that truncates toward zero instead of rounding half-even (an int cast without rounding), recomputed
    from the op's f32 input."""
    x = np.asarray(x_f32, np.float32)
    amax = np.maximum(np.abs(x).max(axis=-1, keepdims=True), np.float32(1e-4))
    return np.trunc(x * (np.float32(127.0) / amax))


def _drop_newest(indices):
    """The window one row short: its newest column (the token itself once the window is full) masked."""
    x = indices.copy()
    x[:, -1] = -1
    return x


FAULTS: list[Fault] = [
    # hc: hc_pre (rms, linear, gates, Sinkhorn, collapse) and hc_post
    Fault("hc", "Sinkhorn 19 iterations", "comb_sinkhorn", attribute("comb_sinkhorn", iters=19), must=True),
    Fault("hc", "Sinkhorn 10 iterations", "comb_sinkhorn", attribute("comb_sinkhorn", iters=10), must=True),
    Fault("hc", "Sinkhorn eps 1e-3", "comb_sinkhorn", attribute("comb_sinkhorn", eps=1e-3)),
    Fault("hc", "comb transposed (out, in)", "comb_sinkhorn",
          outputs("comb_sinkhorn", lambda x, *_: _transpose_comb(x))),
    Fault("hc", "post without the factor 2", "split_pre_post", outputs("split_pre_post", lambda x, *_: x / 2, 1)),
    Fault("hc", "pre gate of stream 0 x1.05", "split_pre_post", outputs("split_pre_post", channel(1.05), 0),
          must=True),
    Fault("hc", "hc_pre_rms eps 1e-2", "hc_pre_rms", attribute("hc_pre_rms", eps=1e-2)),
    Fault("hc", "hc_pre_rms one row x1.05", "hc_pre_rms", outputs("hc_pre_rms", row(1.05))),
    Fault("hc", "x_mixed channel 0 x1.05", "mix_x", outputs("mix_x", channel(1.05)), must=True),
    Fault("hc", "x_mixed rounded toward zero (wrong rounding)", "mix_x", truncating_bf16("hc")),
    Fault("hc", "hc_post channel 0 x1.05", "hc_post", outputs("hc_post", channel(1.05)), must=True),
    Fault("hc", "hc_post one row x1.05", "hc_post", outputs("hc_post", row(1.05))),
    Fault("hc", "hc_post comb transposed", "hc_post", operand("hc_post", 3, _transpose_comb)),
    # norm
    Fault("norm", "rmsnorm channel 0 x1.05", "rmsnorm", outputs("rmsnorm", channel(1.05)), must=True),
    Fault("norm", "rmsnorm eps 1e-1", "rmsnorm", attribute("rmsnorm", eps=1e-1)),
    Fault("norm", "rmsnorm weight shifted one channel", "rmsnorm", operand("rmsnorm", 1, lambda w: np.roll(w, 1))),
    Fault("norm", "rmsnorm rounded toward zero (wrong rounding)", "rmsnorm", truncating_bf16("norm")),
    Fault("norm", "rmsnorm rows swapped", "rmsnorm", outputs("rmsnorm", swap_rows())),
    # qkv and RoPE
    Fault("qkv", "q RoPE sign", "qproj_dequant_rms_nope_rope", operand("qproj_dequant_rms_nope_rope", 4, negate_sin)),
    Fault("qkv", "kv RoPE sign", "kv_rms_norm_rope", operand("kv_rms_norm_rope", 3, negate_sin)),
    Fault("qkv", "RoPE position off by one", "rope_tables", operand("rope_tables", 2, _plus_one)),
    Fault("qkv", "q head 0 dim 0 x1.05", "qproj_dequant_rms_nope_rope",
          outputs("qproj_dequant_rms_nope_rope", channel(1.05))),
    Fault("qkv", "kv channel 0 x1.05", "kv_rms_norm_rope", outputs("kv_rms_norm_rope", channel(1.05)), must=True),
    Fault("qkv", "q/kv rounded toward zero (wrong rounding)", "kv_rms_norm_rope", truncating_bf16("qkv")),
    Fault("qkv", "qr gamma channel 0 x1.05", "qr_rms_norm_quant", operand("qr_rms_norm_quant", 1, channel(1.05))),
    Fault("qkv", "qr q8 truncating (wrong rounding)", "qr_rms_norm_quant",
          outputs("qr_rms_norm_quant", lambda out, acc, gamma, *_: _truncating_q8(out, _qr_normed(acc, gamma)))),
    Fault("qkv", "q one token row x1.05", "qproj_dequant_rms_nope_rope",
          outputs("qproj_dequant_rms_nope_rope", row(1.05))),
    # attention: cache writes, windows, masks, softmax, sink, de-rotation
    Fault("attention", "kv RoPE sign in the written cache rows", "swa_cache_insert_valid_bias",
          rope_sign_rows("kv_rms_norm_rope", 3, lambda kv_acc, *_: np.arange(len(kv_acc))), must=True),
    Fault("attention", "SWA window off by one (lens - 1)", "swa_cache_insert_valid_bias",
          operand("swa_cache_insert_valid_bias", 3, _minus_one), must=True),
    Fault("attention", "SWA window off by one (one row older)", "swa_gather_kv",
          operand("swa_gather_kv", 1, lambda i: np.where(i > 0, i - 1, i)), must=True),
    Fault("attention", "kv written one slot off (swa)", "swa_cache_insert_valid_bias",
          operand("swa_cache_insert_valid_bias", 2, _neighbour_slot)),
    Fault("attention", "kv written one slot off (sparse)", "kv_cache_writeback",
          operand("kv_cache_writeback", 2, _neighbour_slot)),
    Fault("attention", "window gather off by one row", "swa_gather_kv", operand("swa_gather_kv", 1, _neighbour_slot)),
    Fault("attention", "softmax scale x1.05 (swa)", "qk_pv", attribute("qk_pv", scale=0.125 * 1.05)),
    Fault("attention", "wrong sink: zero (swa)", "merge_norm", operand("merge_norm", 3, _zero), must=True),
    Fault("attention", "wrong sink: negated (csa)", "csa_merge_norm", operand("csa_merge_norm", 3, lambda s: -s),
          must=True),
    Fault("attention", "wrong sink: zero (hca)", "hca_stream_merge", operand("hca_stream_merge", 6, _zero), must=True),
    Fault("attention", "de-rotation sign (swa)", "merge_norm", operand("merge_norm", 5, negate_sin)),
    Fault("attention", "de-rotation sign (csa)", "csa_merge_norm", operand("csa_merge_norm", 5, negate_sin)),
    Fault("attention", "merge_norm channel 0 x1.05", "merge_norm", outputs("merge_norm", channel(1.05)), must=True),
    Fault("attention", "hca raw window one row short", "hca_raw_attn", operand("hca_raw_attn", 3, _drop_newest)),
    # compressor
    Fault("compressor", "compressed-entry RoPE sign", "cmp_rmsnorm_rope_cache_write",
          operand("cmp_rmsnorm_rope_cache_write", 3, negate_sin), must=True),
    Fault("compressor", "compressed entry one slot off", "cmp_rmsnorm_rope_cache_write",
          operand("cmp_rmsnorm_rope_cache_write", 5, _neighbour_slot)),
    Fault("compressor", "ape rows rolled by one", "cmp_scatter_softmax_pool",
          operand("cmp_scatter_softmax_pool", 2, lambda a: np.roll(a, 1, axis=0))),
    Fault("compressor", "cmp norm weight channel 0 x1.05", "cmp_rmsnorm_rope_cache_write",
          operand("cmp_rmsnorm_rope_cache_write", 1, channel(1.05)), must=True),
    Fault("compressor", "kv projection channel 0 x1.05", "cmp_kv_score_proj",
          outputs("cmp_kv_score_proj", channel(1.05)), must=True),
    Fault("compressor", "indexer key RoPE sign", "cmp_rmsnorm_rope", operand("cmp_rmsnorm_rope", 3, negate_sin)),
    # indexer
    Fault("indexer", "indexer q RoPE sign", "idx_qr_rope", operand("idx_qr_rope", 2, negate_sin)),
    Fault("indexer", "top-k k - 1", "idx_topk", attribute("idx_topk", k=15)),
    Fault("indexer", "head weights negated", "idx_weights_reduce", outputs("idx_weights_reduce", lambda x, *_: -x)),
    Fault("indexer", "visible one entry short", "idx_topk", operand("idx_topk", 2, lambda k: k - 4)),
    Fault("indexer", "index key scale x1.05 (written)", "idx_kv_cache_write",
          outputs("idx_kv_cache_write", lambda x, *_: x * 1.05, 1)),
    # o projection
    Fault("o_proj", "wo_b_scale channel 0 x1.05", "o_proj_b_dequant", operand("o_proj_b_dequant", 0, channel(1.05)),
          must=True),
    Fault("o_proj", "wo_b_scale channel 0 x2", "o_proj_b_dequant", operand("o_proj_b_dequant", 0, channel(2.0)),
          must=True),
    Fault("o_proj", "o_r q8 truncating (wrong rounding)", "quant_rows",
          outputs("quant_rows", lambda out, x, *_: _truncating_q8(out, x))),
    Fault("o_proj", "o_proj_a one token row x1.05", "o_proj_a", outputs("o_proj_a", row(1.05))),
    # moe
    Fault("moe", "gate bias ignored", "moe_route_sort", operand("moe_route_sort", 1, _zero)),
    Fault("moe", "routed scale 1.0", "moe_route_sort", attribute("moe_route_sort", routed_scale=1.0)),
    Fault("moe", "shared expert channel 0 x1.05", "moe_expert_shared", outputs("moe_expert_shared", channel(1.05)),
          must=True),
    Fault("moe", "shared + routed channel 0 x1.05", "moe_shared_routed", outputs("moe_shared_routed", channel(1.05)),
          must=True),
    Fault("moe", "SwiGLU limit ignored", "moe_expert_shared", attribute("moe_expert_shared", swiglu_limit=0.0),
          regime="swiglu_clip"),
    Fault("moe", "ffn norm weight channel 0 x1.05", "moe_ffn_norm", operand("moe_ffn_norm", 1, channel(1.05)),
          must=True),
]


def _qr_normed(acc, gamma):
    a = np.asarray(acc, np.float32)
    inv = 1.0 / np.sqrt(np.mean(a * a, axis=-1, keepdims=True) + np.float32(1e-6))
    return (a * inv.astype(np.float32)) * np.asarray(gamma, np.float32)


# ---- running ------------------------------------------------------------------------------------------------

_GRAPHS: dict = {}


def graph(layer: str, tp: int):
    if (layer, tp) not in _GRAPHS:
        _GRAPHS[layer, tp] = layers.build(layer, tp=tp)
    return _GRAPHS[layer, tp]


def layers_with(op: str) -> list[str]:
    return [name for name in LAYERS if any(n.op == op for n in graph(name, 1).nodes.values())]


def failures(layer: str, tp: int, seed: int, regime: str = "default") -> list[str]:
    """What `dspark run` and the sub-block checks report as failing for one run (empty: passes)."""
    g = graph(layer, tp)
    inputs = runner.layer_inputs(g, seed, regime)
    golden = runner.golden_outputs(g, inputs)
    try:
        values = interp.run(g, inputs, keep=True)
    except DsparkError as e:                # dspark run stops with this error (exit 2): caught, loudly
        return [f"error: {e}"]
    result = [{v.name: env[v.name] for v in g.returns} for env in values] if isinstance(values, list) else \
        {v.name: values[v.name] for v in g.returns}
    bad = [c.name for c in runner.compare_outputs(g, result, golden, inputs) if not c.ok]
    return bad + [f"sub-block {c.name}" for c in runner.subblock_checks(g, values) if not c.ok]


def runs_of(fault: Fault, tps=TPS, seeds=SEEDS):
    return [(layer, tp, seed) for layer in layers_with(fault.op) for tp in tps for seed in seeds]


def caught_runs(fault: Fault, tps=TPS, seeds=SEEDS) -> tuple[int, int, list[str]]:
    """(runs caught, runs, what caught it) for one fault."""
    caught, total, by = 0, 0, set()
    with pytest.MonkeyPatch.context() as mp:
        fault.plant(mp)
        for layer, tp, seed in runs_of(fault, tps, seeds):
            bad = failures(layer, tp, seed, fault.regime)
            total += 1
            caught += bool(bad)
            by.update(bad)
    return caught, total, sorted(by)


def kill_table(tps=TPS, seeds=SEEDS, faults=FAULTS) -> tuple[str, dict]:
    """The kill table: per family, faults killed (caught in every run) / planted, and the runs caught."""
    rows, results = [], {}
    for f in faults:
        results[f] = caught_runs(f, tps, seeds)
    lines = [f"{'family':<11} {'killed':>7} {'runs caught':>12}   not killed"]
    families = dict.fromkeys(f.family for f in faults)
    for fam in families:
        fs = [f for f in faults if f.family == fam]
        killed = [f for f in fs if results[f][1] and results[f][0] == results[f][1]]
        runs = sum(results[f][1] for f in fs)
        caught = sum(results[f][0] for f in fs)
        missing = ", ".join(f"{f.name} ({results[f][0]}/{results[f][1]})" for f in fs if f not in killed)
        lines.append(f"{fam:<11} {len(killed):>3}/{len(fs):<3} {caught:>5}/{runs:<6}   {missing}")
        rows.append((fam, len(killed), len(fs)))
    total_killed = sum(k for _, k, _ in rows)
    total = sum(n for _, _, n in rows)
    lines.append(f"{'all':<11} {total_killed:>3}/{total:<3} ({100 * total_killed / total:.1f} % killed)")
    return "\n".join(lines), results


if __name__ == "__main__":
    print(kill_table()[0])

"""deterministic-split-k on the layers: within its contract on tiny (3 seeds, every layer: each has hc_pre) and
still within the golden tolerance; a no-op on its own output and on qkv's atomics by default; fires on hc_pre at
flash TP4; the shuffled executor's split orders no longer change any bit. Before/after cases:
tests/passes/deterministic-split-k/."""
from __future__ import annotations

import numpy as np
import pytest

import runner
from dspark_ir import layers, parse_graph
from dspark_ir.semantics import hc as khc
from dspark_ir.semantics import matmul as kmm
from dspark_ir.semantics import splitk as ksk
from lowering import build_task_graph, run_numpy, run_shuffled
from lowering.splitk import is_atomic_split
from passes import Skip, get_pass

from .layer_support import ATTENTION, SEEDS, flash_opt, golden_mismatches, optimise, skips, statuses, tiny
from .support import HERE

PASS = "deterministic-split-k"
LAYERS = ATTENTION + ("moe",)
LINEAR, REDUCE, SEED = "hc.hc_pre_linear", "hc.hc_pre_linear_reduce", "hc.hc_pre_linear_seed"
QKV = ("qkv.qr_proj_matmul", "qkv.kv_proj_matmul")
SHUFFLE_SEEDS = range(20)


def _assert_hc_rewritten(g, k_split: int, row_tile: int) -> None:
    linear, reduce = g.nodes[LINEAR], g.nodes[REDUCE]
    assert SEED not in g.nodes
    assert linear.attrs["accumulate"] == "ordered" and len(linear.operands) == 2
    assert str(linear.result.type.shape[0]) == f"{k_split}*T"
    assert [v.name for v in reduce.operands] == [LINEAR]
    assert reduce.attrs["k_split"] == k_split and reduce.attrs["tile"] == (row_tile,)
    assert str(reduce.attrs["blocks"]) == f"ceil(T/{row_tile})"
    users = {n.name for n in g.nodes.values() if any(v is reduce.result for v in n.operands)}
    assert users == {"hc.split_pre_post", "hc.comb_sinkhorn"}


# ---- numeric contract on tiny ---------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("layer", LAYERS)
def test_contract_on_tiny_and_within_the_golden_tolerance(layer, seed):
    result = optimise(tiny(layer), PASS, seed)                   # the manager checks bounded-reassoc(3)
    assert statuses(result) == {PASS: "changed"}
    _assert_hc_rewritten(result.graph, k_split=4, row_tile=8)  # tiny: LINEAR_OK 4, LINEAR_T_TILE 8
    assert not golden_mismatches(result.graph, seed)


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("layer", ATTENTION)
def test_targets_all_on_tiny(layer, seed):
    result = optimise(tiny(layer), f"{PASS}{{targets=all}}", seed)
    g = result.graph
    for name in QKV:
        node = g.nodes[name]
        assert node.op == "matmul_partials" and g.nodes[name + "_reduce"].op == "split_reduce"
        assert name.replace("_matmul", "_seed") not in g.nodes
    assert not g.ops("zeros")
    assert not golden_mismatches(g, seed)


# ---- where it must not fire -----------------------------------------------------------------------------------
@pytest.mark.parametrize("layer", LAYERS)
def test_no_op_on_its_own_output_and_on_qkv_by_default(layer):
    once = optimise(tiny(layer), PASS, numerics=False)
    again = optimise(once.graph, f"{PASS},{PASS}{{targets=all}}", numerics=False)
    assert again.runs[0].status == "no-op"
    assert skips(again, PASS)[LINEAR] == "accumulate = ordered: already deterministic"
    if layer == "moe":                                           # no atomic matmul at all
        assert again.runs[1].status == "no-op"
        return
    for name in QKV:
        assert once.graph.nodes[name].attrs["accumulate"] == "atomic"
        assert skips(once, PASS)[name] == "atomic matmul left as is (targets = hc; targets = all rewrites it)"


def test_case_skip_reasons():
    g = parse_graph((HERE / PASS / "no_fire.before.dsir").read_text())
    reasons = {s.at: s.reason for s in get_pass(PASS)().match(g)}
    assert reasons == {
        "q.matmul": "atomic matmul left as is (targets = hc; targets = all rewrites it)",
        "o.hc_pre_linear": "accumulate = ordered: already deterministic",
        "one.hc_pre_linear": "k_split = 1: one atomic add per element into zeros is already order-independent",
        "p.hc_pre_linear": "accumulates into a graph parameter, not a fresh zeros seed: the partials form would "
                           "drop its initial value",
    }
    g = parse_graph((HERE / PASS / "matmul_all.before.dsir").read_text())
    found = list(get_pass(PASS)(targets="all").match(g))
    assert sorted(s.node.name for s in found if not isinstance(s, Skip)) == ["a.matmul", "b.matmul"]
    reasons = {s.at: s.reason for s in found if isinstance(s, Skip)}
    assert reasons == {
        "c.first": "%c.second updates the result in place (the reduce result is not an allocated buffer)",
        "c.second": "accumulates into %c.first (matmul), not a fresh zeros seed: the partials form would drop "
                    "its initial value",
    }


# ---- flash TP4 (graph level) ----------------------------------------------------------------------------------
@pytest.mark.parametrize("layer", LAYERS)
def test_fires_on_hc_pre_at_flash_tp4(layer, tmp_path):
    g = flash_opt(layer, tmp_path)
    _assert_hc_rewritten(g, k_split=4, row_tile=16)               # seed: reduce spmd t/16, LINEAR_OK = 4
    assert g.symbols["T"] == 128 and g.nodes[REDUCE].attrs["blocks"].value(g.env) == 8
    assert str(g.nodes[LINEAR].attrs["blocks"]) == "ceil(T/16)*4"  # the split-K grid is unchanged
    for name in QKV if layer != "moe" else ():
        assert g.nodes[name].op == "matmul" and g.nodes[name].attrs["accumulate"] == "atomic"


# ---- schedules: the shuffled executor --------------------------------------------------------------------------
def _bits(out) -> list[bytes]:
    outs = out if isinstance(out, list) else [out]
    return [np.ascontiguousarray(v).tobytes() for o in outs for _, v in sorted(o.items())]


def _shuffled_bits(g, inputs) -> tuple[list[bytes], set]:
    tg = build_task_graph(g)
    return _bits(run_numpy(tg, inputs)), {tuple(_bits(run_shuffled(tg, inputs, s))) for s in SHUFFLE_SEEDS}


@pytest.mark.parametrize("layer, tp, pipeline", [("moe", None, PASS), ("decode-swa", 1, f"{PASS}{{targets=all}}")],
                         ids=["moe-ep1", "swa-tp1-all"])
def test_shuffled_execution_is_bitwise_stable_only_after_the_pass(layer, tp, pipeline):
    """20 random task orders and split arrival orders (lowering's `shuffled` executor): the atomic form gives
    different bits for some seed; after the pass every seed gives the numpy executor's bits."""
    g = layers.build(layer, "tiny", tp=tp, **({"ep": 1} if layer == "moe" else {}))
    inputs = runner.layer_inputs(g, 0)
    ref, shuffled = _shuffled_bits(g, inputs)
    assert shuffled != {tuple(ref)}, "an atomic split-K with shuffled arrivals should change some bits"
    after = optimise(g, pipeline, numerics=False).graph
    assert not [t.name for t in build_task_graph(after).tasks if is_atomic_split(t)]
    ref_after, shuffled_after = _shuffled_bits(after, inputs)
    assert shuffled_after == {tuple(ref_after)}
    assert ref_after == ref                     # and the bits are the atomic form's reference (ascending) bits


def test_default_targets_leave_qkv_schedule_dependent():
    """Why targets=hc is not enough for bitwise runs of an attention layer: qr_proj/kv_proj stay atomic."""
    g = optimise(layers.build("decode-swa", "tiny", tp=1), PASS, numerics=False).graph
    assert sorted(t.name for t in build_task_graph(g).tasks if is_atomic_split(t)) == sorted(QKV)


# ---- the kernels behind the contract ---------------------------------------------------------------------------
@pytest.mark.parametrize("k, k_split, trans_b", [(32, 2, False), (10, 3, True), (64, 4, False)])
def test_matmul_partials_reduce_has_the_atomic_reference_bits(k, k_split, trans_b):
    rng = np.random.default_rng(k)
    a = rng.standard_normal((6, k)).astype(np.float32)
    b = rng.standard_normal((5, k) if trans_b else (k, 5)).astype(np.float32)
    atomic = kmm.matmul(a, b, np.zeros((6, 5), np.float32), trans_b=trans_b, k_split=k_split)
    ordered = ksk.split_reduce(ksk.matmul_partials(a, b, trans_b=trans_b, k_split=k_split), k_split=k_split)
    assert ordered.dtype == np.float32 and np.array_equal(ordered.view(np.uint32), atomic.view(np.uint32))


def test_atomic_orders_stay_within_the_stated_bound():
    """Any arrival order of the k splits is within (k_split − 1) ulp of Σ|partials| of the ordered sum (the
    bound the pass docstring states), and some order differs (the reason for the pass)."""
    rng = np.random.default_rng(0)
    k_split = 4
    x = rng.standard_normal((32, 4, 64)).astype(np.float32)
    fn = rng.standard_normal((24, 256)).astype(np.float32)
    parts = khc.hc_pre_linear(x, fn, accumulate="ordered", k_split=k_split)
    ordered = khc.hc_pre_linear_reduce(parts, k_split=k_split)
    magnitude = np.abs(parts.reshape(k_split, 32, 24)).sum(axis=0)
    ulp = np.spacing(magnitude.astype(np.float32))
    differs = False
    for order in ([3, 2, 1, 0], [1, 3, 0, 2], [2, 0, 3, 1]):
        atomic = khc.hc_pre_linear(x, fn, np.zeros((32, 24), np.float32), k_split=k_split, split_order=order)
        err = np.abs(atomic.astype(np.float64) - ordered.astype(np.float64))
        assert (err <= (k_split - 1) * ulp).all()
        differs = differs or not np.array_equal(atomic, ordered)
    assert differs

"""Roofline arithmetic (perf/roofline.py) and the 910B2 constants (dspark_ir/hardware.py)."""
from __future__ import annotations

import math

import pytest

from dspark_ir import layers
from dspark_ir.hardware import HARDWARE
from lowering import build_task_graph
from perf.roofline import Work, blocked_bound, bound, chip_bound, task_work


def test_constants_reproduce_the_published_peaks():
    hw = HARDWARE
    assert hw.cube_peak_flops == pytest.approx(353.9e12, rel=1e-3)      # 24 x 16^3 x 2 x 1.8 GHz
    assert hw.cube_peak_int8 == 2 * hw.cube_peak_flops
    assert hw.vector_peak_ops == 48 * 64 * 1.8e9
    assert hw.dispatch_cycles == 240 + 390 + 200 + 100
    assert hw.gm_bytes_per_s(1) == 32 * 1.8e9 and hw.gm_bytes_per_s(48) == 1.6e12
    assert hw.cores("mix") == 24 and hw.us(1800) == 1.0


def test_chip_bound_takes_the_largest_term():
    w = Work(read=1.6e6, written=0.0, cube_flops=353.9e6 * 3)            # 1 µs of HBM, ~3 µs of cube
    b = chip_bound(w)
    assert b.limit == "cube" and b.us() == pytest.approx(3.0, rel=1e-3)
    assert b.terms["hbm"] * 1e6 == pytest.approx(1.0)
    assert bound(Work()).limit == "none" and bound(Work()).seconds == 0


def test_blocked_bound_uses_only_the_task_cores():
    w = Work(read=57.6e3)                                              # 1 µs for one core at 32 B/cycle
    assert blocked_bound(w, "vector", 1).us() == pytest.approx(1.0)
    assert blocked_bound(w, "vector", 512).us() == pytest.approx(57.6e3 / 1.6e12 * 1e6)   # capped by HBM
    assert blocked_bound(Work(vector_ops=64 * 1.8e9 * 1e-6), "vector", 1).us() == pytest.approx(1.0)


def test_matmul_work_counts_flops_and_bytes():
    g = layers.build("decode-swa", config="flash", tp=4)
    tg = build_task_graph(g)
    t = tg.task("qkv.qr_proj_matmul")                                  # 128 x 4096 @ 4096 x 1024, atomic acc
    w = task_work(t)
    assert w.cube_flops == 2 * 128 * 4096 * 1024 and w.cube_int8 == 0
    assert w.read == 128 * 4096 * 2 + 4096 * 1024 * 2 + 128 * 1024 * 4
    assert w.written == 128 * 1024 * 4
    q = task_work(tg.task("qkv.qproj_matmul"))                         # int8 128 x 1024 @ 1024 x 32768
    assert q.cube_int8 == 2 * 128 * 1024 * 32768 and q.cube_flops == 0


def test_sparse_ops_count_touched_rows_not_whole_caches():
    g = layers.build("decode-swa", config="flash", tp=4)
    tg = build_task_graph(g)
    gather = task_work(tg.task("swa.swa_gather_kv"))                   # kv_cache is 128 MiB; 128 x 128 rows read
    assert gather.read == 128 * 128 * 512 * 2 + 128 * 128 * 4
    insert = task_work(tg.task("swa.swa_cache_insert_valid_bias"))
    assert insert.written == 512 * 512 * 2 + 128 * 128 * 4              # the TP group's 512 cache rows + the bias
    assert math.isclose(chip_bound(gather).seconds, gather.bytes / 1.6e12)


def test_collectives_count_remote_bytes():
    g = layers.build("decode-swa", config="flash", tp=4)
    tg = build_task_graph(g)
    a2a = task_work(tg.task("o.o_group_a2a"))
    assert a2a.remote == pytest.approx(8 * 128 * 4096 * 2 * 3 / 4)
    assert chip_bound(a2a).limit == "link"


def test_a_window_release_moves_no_data():
    """The release typed-gather adds is a rendezvous and a credit reset (kernels/window_release.py): its window
    operand orders it, nothing reads the window's bytes."""
    import passes

    g = passes.run_pipeline(layers.build("decode-swa", config="flash", tp=4)).graph
    release = task_work(build_task_graph(g).task("o.o_group_a2a.release"))
    assert release.bytes == 0 and release.remote == 0
    assert chip_bound(release).limit == "none"


def test_every_kernel_op_has_a_roofline_rule():
    """Every op kind that lowers to a kernel task has a `ROOFLINE` entry keyed by its op class (`DEFAULTS` when
    the default counting is right); a new or renamed op fails here with its name."""
    from dspark_ir.ops import OP_REGISTRY, load_all
    from lowering.build import lowers_to_kernel
    from perf.roofline import ROOFLINE

    load_all()
    missing = sorted(name for name, op in OP_REGISTRY.items() if lowers_to_kernel(op) and op not in ROOFLINE)
    assert not missing, f"op kinds without a roofline rule (perf/roofline.py ROOFLINE): {', '.join(missing)}"
    stray = sorted(op.name for op in ROOFLINE if OP_REGISTRY.get(op.name) is not op or not lowers_to_kernel(op))
    assert not stray, f"roofline rules of op kinds that never lower to a kernel task: {', '.join(stray)}"


def test_an_op_without_a_roofline_rule_is_named():
    from perf.roofline import rule_of

    g = layers.build("decode-swa", config="flash", tp=4)
    task = build_task_graph(g).task("swa.swa_gather_kv")
    assert rule_of(task.op).touched is not None
    with pytest.raises(LookupError, match="op 'slice' has no roofline rule"):
        rule_of("slice")


@pytest.mark.parametrize("config,tp", [("tiny", 1), ("tiny", 2), ("flash", 4)])
def test_every_moe_task_has_a_roofline(config, tp):
    """The routed-expert rule once indexed the second axis of its 1-D recv_count (IndexError on every moe layer)."""
    from dspark_ir import layers
    from lowering.build import build_task_graph
    from perf.roofline import task_work

    tg = build_task_graph(layers.build("moe", config=config, tp=tp))
    assert all(task_work(t) is not None for t in tg.tasks)


def test_each_o_group_reads_its_own_slice_once():
    """o_proj_a of group g reads heads[g] and wo_a[g]; o_proj_b its group's K columns of wo_b: the two groups
    together read each operand once (they counted the whole operand each)."""
    from perf.roofline import floor

    tg = build_task_graph(layers.build("decode-swa", config="flash", tp=4))
    a0, a1 = task_work(tg.task("o.tp_o_a.g0")), task_work(tg.task("o.tp_o_a.g1"))
    heads, wo_a = 2 * 512 * 4096 * 2, 2 * 1024 * 4096 * 2                # [groups, rows, width] bf16, both whole
    assert a0.read == a1.read == (heads + wo_a) / 2
    assert a0.cube_flops == 2 * 512 * 4096 * 1024
    b0 = task_work(tg.task("o.tp_o_b.g0"))
    assert b0.read == 512 * 1024 + 4096 * 1024                          # x int8 + wo_b[:, 0:1024] int8
    f = floor(tg)
    weights = {"wo_a": wo_a, "wo_b": 4096 * 2048}
    read_once = sum(weights.values())
    # the floor counts wo_a and wo_b exactly once: drop one group's tasks and the floor loses half of each
    half = build_task_graph(layers.build("decode-swa", config="flash", tp=4))
    half.tasks = [t for t in half.tasks if not t.name.endswith(".g1")]
    assert f.parts["inputs"] - floor(half).parts["inputs"] == pytest.approx(read_once / 2)


def test_floor_counts_inputs_caches_outputs_once_and_the_exchange_above():
    from perf.roofline import floor

    tg = build_task_graph(layers.build("decode-swa", config="flash", tp=4))
    f = floor(tg)
    weights = 4096 * 1024 * 2 + 1024 * 32768 + 4096 * 512 * 2 + 2 * 1024 * 4096 * 2 + 4096 * 2048 + 24 * 16384 * 4
    x_hc = 128 * 4 * 4096 * 4
    assert weights + x_hc < f.parts["inputs"] < weights + x_hc + 1.5e6      # + tables' rows, scales, small inputs
    assert f.parts["outputs"] == 128 * 4 * 4096 * 4                     # x_out once, not per reader/writer
    window = 128 * 128 * 512 * 2                                        # the gather's window rows of kv_cache
    assert window < f.parts["caches"] < window + 0.6e6                  # + the TP group's tp·T = 512 new rows written
    assert f.high - f.low == f.parts["exchange"] > 0
    assert f.low_us == pytest.approx(f.low / 1.6e12 * 1e6)
    assert 100e6 < f.low < 115e6                                        # the SWA TP4 estimate: 92-117 MB


def test_csa_qk_pv_counts_only_its_live_blocks():
    """With max_context = 256 only the first live_blocks of csa.qk_pv hold valid rows; its template computes and
    gathers only those, so its roofline counts only their keys and compressed rows."""
    def qk_work(**params):
        tg = build_task_graph(layers.build("decode-csa", config="flash", tp=4, **params))
        t = tg.task("csa.qk_pv")
        return t, task_work(t)

    full_task, full = qk_work()
    live_task, live = qk_work(max_context=256)
    k_tile, live_blocks = int(live_task.attrs["k_tile"]), int(live_task.attrs["live_blocks"])
    assert "live_blocks" not in full_task.attrs and live_blocks * k_tile < 640
    assert live.cube_flops / full.cube_flops == pytest.approx(live_blocks * k_tile / 640)
    assert live.read < full.read

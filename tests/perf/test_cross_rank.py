"""Schedule rule 10: a collective's link transfer and signal tasks (perf/schedule.py), declared per op
(`OpDef.cross_rank`, dspark_ir/ops/collective.py), and the remote bytes the roofline and the schedule share."""
from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_ir.ops.base import OP_REGISTRY, CrossRank
from lowering.codegen import op_definition
from perf import calibrate as cal
from perf.ab import Case, Shape, Variant, lower_variant
from perf.costs import KernelCost
from perf.roofline import remote_bytes
from perf.schedule import SchedTask, ScheduleParams, alone_cycles, chip_cost, sched_tasks, schedule

# 1 cycle = 1 µs; a link of 1 byte per µs, so remote bytes read as µs
CHIP = ScheduleParams(cube_cores=4, vector_cores=48, dispatch_cycles=1, clock_hz=1e6, block_model="span",
                      dispatchers=3, block_dispatch_cycles=2, hop_cycles=5, link_bytes_per_s=1e6, cross_rank=True,
                      name="chip")


def vec(span, blocks=1):
    return KernelCost("given", float(span), 0.0, float(span * blocks))


def pair(link: str = "overlap", remote: float = 0.0, signals: int = 0, span: float = 10.0):
    """A collective (id 0) and its consumer (id 1)."""
    tasks = [SchedTask(0, "exchange", "vector", 1, remote_bytes=remote, link=link, signals=signals),
             SchedTask(1, "consumer", "vector", 1, (0,))]
    return tasks, {0: vec(span), 1: vec(3)}


def test_overlapped_link_is_the_slower_of_local_part_and_transfer():
    tasks, costs = pair("overlap", remote=4.0)
    assert schedule(tasks, costs, CHIP).runs[0].finish == 1 + 2 + 10       # the local part (10) is slower
    tasks, costs = pair("overlap", remote=40.0)
    assert schedule(tasks, costs, CHIP).runs[0].finish == 1 + 2 + 40       # the link (40) is slower
    # the trust flag L's sensitivity: no overlap, the transfer adds
    assert schedule(tasks, costs, replace(CHIP, link_overlap=False)).runs[0].finish == 1 + 2 + 50


def test_a_publish_before_the_local_part_adds_up():
    tasks, costs = pair("before", remote=40.0)
    assert schedule(tasks, costs, CHIP).runs[0].finish == 1 + 2 + 50
    assert chip_cost(tasks[0], costs[0], CHIP).span == 50 and costs[0].span == 10    # the given cost untouched


def test_signal_tasks_follow_the_data_and_their_hops_are_gaps():
    tasks, costs = pair(signals=2)
    s = schedule(tasks, costs, CHIP)
    data_end = 1 + 2 + 10
    tail = 2 * (1 + 5 + 2)                   # each: D + H, then one block's issue
    assert s.runs[0].finish == data_end + tail and s.runs[0].gaps == 2 * (1 + 5)
    assert s.runs[1].ready == s.runs[0].finish + 1 + 5                    # the consumer waits for the last signal
    assert alone_cycles(tasks[0], costs[0], CHIP) == 1 + 2 + 10 + 2 * (1 + 2)       # no hop in alone times


def test_rule_10_off_and_the_legacy_model_ignore_the_declarations():
    tasks, costs = pair("before", remote=40.0, signals=2)
    off = schedule(tasks, costs, replace(CHIP, cross_rank=False))
    plain = schedule([replace(tasks[0], remote_bytes=0.0, link="none", signals=0), tasks[1]], costs,
                     replace(CHIP, cross_rank=False))
    assert off.makespan == plain.makespan and off.runs[0].gaps == 0
    assert not ScheduleParams().cross_rank


def test_a_schedule_keeps_the_given_costs_so_rescheduling_is_stable():
    """The link term is applied inside `schedule` only: rescheduling a schedule's own costs (as the A/B's stage
    scopes and the fit's cases do) must not apply it twice."""
    tasks, costs = pair("before", remote=40.0, signals=1)
    first = schedule(tasks, costs, CHIP)
    assert first.costs[0].span == 10
    assert schedule(tasks, first.costs, CHIP).makespan == first.makespan


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["overlap", "before", "none"]), st.integers(0, 60), st.integers(0, 3),
                          st.integers(1, 30), st.lists(st.integers(0, 10), max_size=3)), min_size=1, max_size=8))
def test_every_collective_holds_its_consumers_for_its_transfer_and_signals(spec):
    tasks = [SchedTask(i, f"t{i}", "vector", 1, tuple(sorted({d for d in deps if d < i})), remote_bytes=float(r),
                       link=link, signals=n) for i, (link, r, n, _, deps) in enumerate(spec)]
    costs = {i: vec(span) for i, (_, _, _, span, _) in enumerate(spec)}
    s = schedule(tasks, costs, CHIP)
    for t in tasks:
        run, span = s.runs[t.id], costs[t.id].span
        link = t.remote_bytes if t.link != "none" else 0.0
        data = max(span, link) if t.link == "overlap" else span + link
        assert run.finish - run.start >= data + t.signals * (1 + 5 + 2)
        assert run.gaps == t.signals * (1 + 5)
        for d in t.deps:
            assert run.ready >= s.runs[d].finish + 1 + 5


def test_swimlane_rows_leave_the_signal_hops_out():
    facts = {"swimlane": {"source": "test", "makespan_us": 1.0, "task": [{"chip": "X", "span_us": 30.0,
                                                                           "ours": ["exchange"]}]}}
    tasks, costs = pair(signals=2)
    rows, _ = cal.task_rows(facts, tasks, costs, CHIP)
    s = schedule(tasks, costs, CHIP)
    assert rows[0].predicted_us == pytest.approx(s.runs[0].finish - s.runs[0].start - 2 * (1 + 5))


# ---- the declarations ------------------------------------------------------------------------------------
def test_every_collective_op_declares_its_cross_rank_steps():
    op_definition("cp_allgather")          # loads every op module
    missing = [name for name, op in OP_REGISTRY.items() if op.family == "collective" and op.cross_rank is None]
    assert not missing, f"collective ops without a cross_rank declaration: {missing}"


def test_a_declaration_rejects_unknown_compositions():
    with pytest.raises(ValueError, match="overlap | before | none"):
        CrossRank("x", "sideways")
    with pytest.raises(ValueError, match="signals"):
        CrossRank("x", "none", -1)
    with pytest.raises(ValueError, match="readback_signals must be >= 0"):
        CrossRank("x", "overlap", 1, readback_signals=-1)
    assert CrossRank("x", "overlap", exchanged="out").sent_bytes((8, 4), "bf16", 4) == 8 * 4 * 2 * 3 / 4
    assert CrossRank("x", "overlap", whole_group=False, wire="f32").sent_bytes((8, 4), "bf16", 4) == 8 * 4 * 4 * 3
    assert CrossRank("x", "overlap").sent_bytes((8, 4), "bf16", 1) == 0


@pytest.fixture(scope="module")
def hca_tp4():
    """The swimlane's graph: the untyped CP all-gather and the O path's copy-out (perf/calibration/facts.toml)."""
    g = Case("decode-hca", Shape("flash", 4, 16, 8, ())).build()
    return lower_variant(g, Variant("default", "default", ctx=(("disabled", ("typed-gather", "a2a-direct-read")),))).tg


def test_the_lowered_hca_layer_carries_the_declared_steps(hca_tp4):
    by_name = {t.name: t for t in sched_tasks(hca_tp4)}
    push = by_name["cp.hca_allgather"]
    assert (push.link, push.signals) == ("overlap", 1)
    assert push.remote_bytes == 4 * 128 * 2560 * 2 * 3 / 4        # the bf16[4*T, 2560] window, 3 peers' share
    # the read-backs: the CP step's declares read-back wait + retire, the all-to-all's copy-out its complete
    assert (by_name["cp.hca_allgather.copy_out"].link, by_name["cp.hca_allgather.copy_out"].signals) == ("none", 2)
    assert by_name["o.o_group_a2a.copy_out"].signals == 1 and by_name["o.o_group_a2a"].signals == 1
    rs = by_name["o.tp_o_reduce_scatter"]
    assert (rs.link, rs.signals, rs.remote_bytes) == ("before", 2, 4 * 128 * 4096 * 4 * 3 / 4)
    glue = by_name["cp.hca_allgather.own_rows"]
    assert glue.remote_bytes == 0 and glue.signals == 0
    assert all(t.signals == 0 and t.remote_bytes == 0 for t in by_name.values()
               if not t.name.startswith(("cp.", "o.o_group_a2a", "o.tp_o_reduce_scatter")))


def test_the_roofline_counts_the_declared_exchange_only(hca_tp4):
    by_name = {t.name: t for t in hca_tp4.tasks}
    assert remote_bytes(by_name["cp.hca_allgather.own_rows"]) == 0       # modelling glue: nothing on the link
    assert remote_bytes(by_name["cp.hca_allgather"]) == 4 * 128 * 2560 * 2 * 3 / 4


def test_a_single_rank_layer_has_no_cross_rank_steps():
    g = Case("decode-hca", Shape("flash", 1, 16, 8, ())).build()
    tg = lower_variant(g, Variant("default", "default")).tg
    assert all(t.signals == 0 and t.remote_bytes == 0 for t in sched_tasks(tg))


def test_every_table_row_of_a_collective_names_its_link_estimate(hca_tp4):
    """The link transfer is a peak-bandwidth estimate, not a simulation: the estimate's rows say so."""
    from perf.costs import DUMMY
    from perf.estimate import estimate

    costs = {t.id: DUMMY if t.is_dummy else vec(1000) for t in hca_tp4.tasks}
    rows = {r.name: r for r in estimate(hca_tp4, None, CHIP, costs=costs).rows}
    assert "rule 10: link 1.97 MB" in rows["cp.hca_allgather"].note and "1 signal task" in rows["cp.hca_allgather"].note
    assert "2 signal tasks" in rows["o.tp_o_reduce_scatter"].note and "(before)" in rows["o.tp_o_reduce_scatter"].note
    assert "rule 10" not in rows["hc.hc_post"].note
    off = {r.name: r for r in estimate(hca_tp4, None, replace(CHIP, cross_rank=False), costs=costs).rows}
    assert "rule 10" not in off["cp.hca_allgather"].note


def test_every_declared_exchange_names_an_argument_of_its_op():
    """A renamed operand or result fails here, naming the op, not deep inside an estimate."""
    op_definition("cp_allgather")          # loads every op module
    for name, op in OP_REGISTRY.items():
        spec = op.cross_rank
        if spec is None or spec.link == "none":
            continue
        params = [p.lstrip("*") for p in (*op.operands, *op.results)]
        assert spec.exchanged in params, f"op '{name}' exchanges '{spec.exchanged}', not one of {params}"

"""The schedule model (perf/schedule.py) on hand-built task graphs with known makespans."""
from __future__ import annotations

import pytest

from perf.costs import KernelCost
from perf.schedule import SchedTask, ScheduleError, ScheduleParams, alone_cycles, block_cycles, schedule

P = ScheduleParams(cube_cores=2, vector_cores=4, dispatch_cycles=0, clock_hz=1e6)   # 1 cycle = 1 µs


def cost(span, cube=0.0, vector=0.0):
    return KernelCost("given", float(span), float(cube), float(vector))


def vec(span, blocks):
    """A vector task whose blocks each take `span` cycles (work = span × blocks)."""
    return cost(span, vector=span * blocks)


def test_chain_is_the_sum_of_its_tasks():
    tasks = [SchedTask(0, "a", "vector", 1), SchedTask(1, "b", "vector", 1, (0,)), SchedTask(2, "c", "cube", 1, (1,))]
    s = schedule(tasks, {0: vec(10, 1), 1: vec(20, 1), 2: cost(5, cube=5)}, P)
    assert s.makespan == 35 and s.serial == 35 and s.critical == 35
    assert [(s.runs[i].start, s.runs[i].finish) for i in range(3)] == [(0, 10), (10, 30), (30, 35)]


def test_independent_tasks_overlap_on_free_cores():
    tasks = [SchedTask(0, "a", "vector", 2), SchedTask(1, "b", "vector", 2), SchedTask(2, "c", "cube", 1)]
    s = schedule(tasks, {0: vec(10, 2), 1: vec(10, 2), 2: cost(7, cube=7)}, P)
    assert s.makespan == 10            # 4 AIVs hold both 2-block tasks, the AIC runs c alongside
    assert s.serial == 27


def test_core_limit_makes_waves():
    """6 blocks of 10 on 4 AIVs: two waves (the floor span 10 does not bind)."""
    s = schedule([SchedTask(0, "a", "vector", 6)], {0: vec(10, 6)}, P)
    assert s.makespan == 20
    assert sorted(b.start for b in s.blocks) == [0, 0, 0, 0, 10, 10]
    assert alone_cycles(SchedTask(0, "a", "vector", 6), vec(10, 6), P) == 20


def test_tasks_compete_for_cores_in_ready_order():
    """Two 4-block tasks on 4 AIVs: the later one waits for the first wave; a cube task backfills."""
    tasks = [SchedTask(0, "a", "vector", 4), SchedTask(1, "b", "vector", 4), SchedTask(2, "c", "cube", 2)]
    s = schedule(tasks, {0: vec(10, 4), 1: vec(10, 4), 2: cost(3, cube=6)}, P)
    assert (s.runs[0].start, s.runs[1].start, s.runs[2].start) == (0, 10, 0)
    assert s.makespan == 20


def test_dependency_waits_for_every_block():
    tasks = [SchedTask(0, "a", "vector", 5), SchedTask(1, "b", "cube", 1, (0,))]
    s = schedule(tasks, {0: vec(10, 5), 1: cost(1, cube=1)}, P)
    assert s.runs[1].ready == 20 and s.makespan == 21      # the 5th block runs in a second wave


def test_dispatch_overhead_is_paid_per_task():
    p = ScheduleParams(cube_cores=2, vector_cores=4, dispatch_cycles=3, clock_hz=1e6)
    tasks = [SchedTask(0, "a", "vector", 1), SchedTask(1, "b", "vector", 1, (0,)), SchedTask(2, "d", "none", 0, (1,))]
    s = schedule(tasks, {0: vec(10, 1), 1: vec(10, 1)}, p)
    assert [s.runs[i].ready for i in range(3)] == [3, 16, 29]
    assert s.makespan == 29 and s.serial == 3 + 13 + 13


def test_span_floor_binds_a_wide_task():
    """64 blocks of 1 cycle fit one wave-pair on 4 AIVs in 16 cycles, but the kernel's own makespan is 40."""
    s = schedule([SchedTask(0, "a", "vector", 64)], {0: cost(40, vector=64)}, P)
    assert s.makespan == 40 and s.runs[0].floor_bound


def test_work_split_over_blocks():
    """One block does all the work: a 1-block task with 100 busy cycles takes 100, not its 10-cycle span."""
    s = schedule([SchedTask(0, "at", "vector", 1)], {0: cost(10, vector=100)}, P)
    assert s.makespan == 100


def test_mix_blocks_take_a_core_group():
    """A mix block holds 1 AIC + 2 AIV: with 2 AIC / 4 AIV two run at once; d = max(W_cube, W_vec / 2) / B."""
    t = SchedTask(0, "qk", "mix", 4)
    c = cost(1, cube=40, vector=120)
    assert block_cycles(t, c) == 15
    s = schedule([t], {0: c}, P)
    assert s.makespan == 30
    assert all(len(b.lanes) == 3 for b in s.blocks)


def test_dummies_and_zero_block_tasks_take_no_time():
    tasks = [SchedTask(0, "j", "none", 0), SchedTask(1, "z", "vector", 0, (0,)), SchedTask(2, "a", "vector", 1, (1,))]
    s = schedule(tasks, {1: vec(5, 1), 2: vec(5, 1)}, P)
    assert s.makespan == 5 and not [b for b in s.blocks if b.task != 2]


def test_critical_path_ignores_core_limits():
    tasks = [SchedTask(i, f"t{i}", "vector", 4) for i in range(3)]
    s = schedule(tasks, {i: vec(10, 4) for i in range(3)}, P)
    assert s.makespan == 30 and s.critical == 10           # three independent tasks, one core set


def test_bad_inputs_are_refused():
    with pytest.raises(ScheduleError, match="unknown task"):
        schedule([SchedTask(0, "a", "vector", 1, (7,))], {0: vec(1, 1)}, P)
    with pytest.raises(ScheduleError, match="no"):
        schedule([SchedTask(0, "a", "mix", 1)], {0: vec(1, 1)}, ScheduleParams(0, 4, 0, 1e6))
    with pytest.raises(ScheduleError, match="cycle"):
        schedule([SchedTask(0, "a", "vector", 1, (1,)), SchedTask(1, "b", "vector", 1, (0,))],
                 {0: vec(1, 1), 1: vec(1, 1)}, P)


def test_utilization_and_summary():
    s = schedule([SchedTask(0, "a", "vector", 4)], {0: vec(10, 4)}, P)
    assert s.utilization() == {"cube": 0.0, "vector": 1.0}
    assert "makespan 10.0 µs" in s.summary()


def test_span_block_model_keeps_each_kernel_at_its_span():
    """The sensitivity variant: d = span / waves, so a 1-block task takes its span, not its work."""
    p = ScheduleParams(cube_cores=2, vector_cores=4, dispatch_cycles=0, clock_hz=1e6, block_model="span")
    s = schedule([SchedTask(0, "at", "vector", 1)], {0: cost(10, vector=100)}, p)
    assert s.makespan == 10
    s = schedule([SchedTask(0, "a", "vector", 8)], {0: cost(10, vector=8)}, p)
    assert s.makespan == 10 and {b.end - b.start for b in s.blocks} == {5}
    with pytest.raises(ScheduleError, match="block_model"):
        ScheduleParams(block_model="bogus")


def test_a_kernel_consumer_waits_the_kernel_start_and_an_empty_one_does_not():
    """Rule 6: after the hop, a consumer with a cost of its own waits S more; a task with nothing to run (an empty
    probe task, a dummy) does not, and neither does a task without dependencies."""
    from perf.schedule import is_kernel

    p = ScheduleParams(cube_cores=2, vector_cores=4, dispatch_cycles=0, clock_hz=1e6, hop_cycles=3,
                       kernel_start_cycles=5)
    producer = SchedTask(0, "p", "vector", 1)
    consumer = SchedTask(1, "c", "vector", 1, (0,))
    busy, empty = KernelCost("given", 10.0, 0.0, 10.0), KernelCost("given", 0.0)
    assert is_kernel(busy) and not is_kernel(empty)
    run = schedule([producer, consumer], {0: busy, 1: busy}, p).runs
    assert run[0].ready == 0 and run[1].ready == 10 + 3 + 5
    run = schedule([producer, consumer], {0: busy, 1: empty}, p).runs
    assert run[1].ready == 10 + 3

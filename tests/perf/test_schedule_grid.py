"""The `grid` block model (perf/schedule.py rule 2): a task's parallelism is bounded by its own grid.

d_t = max(S_t / waves_t, w_t / B_t): a 1-block task pays its whole work on one core, a task whose grid covers
the lanes pypto's cost model used keeps its span exactly, and a collective without a grid of its own keeps its
span."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from perf.costs import KernelCost
from perf.schedule import (
    BLOCK_MODELS,
    SchedTask,
    ScheduleError,
    ScheduleParams,
    alone_cycles,
    block_cycles,
    has_grid,
    schedule,
)

GRID = ScheduleParams(cube_cores=2, vector_cores=4, dispatch_cycles=0, clock_hz=1e6, block_model="grid")
SPAN = ScheduleParams(cube_cores=2, vector_cores=4, dispatch_cycles=0, clock_hz=1e6, block_model="span")


def cost(span, cube=0.0, vector=0.0):
    return KernelCost("given", float(span), float(cube), float(vector))


def test_a_one_block_serial_task_pays_its_whole_work_on_one_core():
    """pypto spread 100 cycles of a serial loop over 10 lanes (span 10); the task has one block."""
    t = SchedTask(0, "insert", "vector", 1)
    c = cost(10, vector=100)
    assert block_cycles(t, c, GRID) == 100 and alone_cycles(t, c, GRID) == 100
    assert block_cycles(t, c, SPAN) == 10 and alone_cycles(t, c, SPAN) == 10
    assert schedule([t], {0: c}, GRID).makespan == 100


def test_a_grid_narrower_than_the_lanes_runs_its_work_on_its_blocks():
    """2 blocks, 100 cycles of work over 10 lanes: 50 each, not the span 10."""
    t = SchedTask(0, "a", "vector", 2)
    s = schedule([t], {0: cost(10, vector=100)}, GRID)
    assert s.makespan == 50 and [b.end - b.start for b in s.blocks] == [50, 50]


def test_a_wide_grid_keeps_pypto_span():
    """8 blocks on 4 AIVs (2 waves), work 32 over 4 lanes, span 8: each block S / waves = 4 (> w / B = 4)."""
    t = SchedTask(0, "wide", "vector", 8)
    c = cost(8, vector=32)
    assert block_cycles(t, c, GRID) == block_cycles(t, c, SPAN) == 4
    s = schedule([t], {0: c}, GRID)
    assert s.makespan == 8 == schedule([t], {0: c}, SPAN).makespan


def test_a_wide_grid_with_more_work_than_its_span_pays_its_work_per_core():
    """8 blocks, 4 AIVs, span 8, work 64: the 4 cores it can use need 16 each (two waves of 8)."""
    t = SchedTask(0, "wide", "vector", 8)
    c = cost(8, vector=64)
    assert block_cycles(t, c, GRID) == 8 and alone_cycles(t, c, GRID) == 16


def test_mix_uses_the_mix_form_of_the_work():
    """A mix block is 1 AIC + 2 AIV: w = max(W_cube, W_vec / 2)."""
    t = SchedTask(0, "m", "mix", 1)
    assert block_cycles(t, cost(5, cube=30, vector=100), GRID) == 50
    assert block_cycles(t, cost(5, cube=80, vector=100), GRID) == 80


def test_a_task_without_work_or_without_a_grid_keeps_its_span():
    assert block_cycles(SchedTask(0, "stub", "vector", 1), cost(7), GRID) == 7
    rendezvous = SchedTask(0, "o_group_a2a", "mix", 1, grid=False)
    assert block_cycles(rendezvous, cost(10, vector=200), GRID) == 10
    assert block_cycles(rendezvous, cost(10, vector=200), ScheduleParams(block_model="work")) == 100


def test_which_lowered_tasks_have_a_grid():
    class T:
        def __init__(self, collective, attrs):
            self.collective, self.attrs = collective, attrs

    assert has_grid(T(False, {})) and has_grid(T(False, {"blocks": 8})) and has_grid(T(True, {"blocks": 16}))
    assert not has_grid(T(True, {"tp": 4}))


def test_the_block_models_are_named():
    assert BLOCK_MODELS == ("work", "span", "grid")
    with pytest.raises(ScheduleError, match="work, span, grid"):
        ScheduleParams(block_model="lanes")


@st.composite
def kernels(draw):
    core = draw(st.sampled_from(["cube", "vector", "mix"]))
    lanes = draw(st.integers(1, 48))                    # the lanes pypto's cost model used
    span = draw(st.integers(1, 10_000))
    busy = [draw(st.integers(0, span)) for _ in range(lanes)]      # each lane busy at most the span
    work = float(sum(busy))
    c = {"cube": cost(span, cube=work), "vector": cost(span, vector=work),
         "mix": cost(span, cube=work, vector=draw(st.floats(0, 2 * work)))}[core]
    blocks = draw(st.integers(1, 600))
    return SchedTask(0, "t", core, blocks), c, lanes


@settings(max_examples=300, deadline=None)
@given(kernels(), st.integers(1, 64), st.integers(1, 64))
def test_grid_is_at_least_span_and_equal_once_the_grid_covers_the_lanes(k, cube_cores, vector_cores):
    t, c, lanes = k
    vector_cores = max(vector_cores, 2)
    grid = ScheduleParams(cube_cores=cube_cores, vector_cores=vector_cores, dispatch_cycles=0, block_model="grid")
    span = ScheduleParams(cube_cores=cube_cores, vector_cores=vector_cores, dispatch_cycles=0, block_model="span")
    work = ScheduleParams(cube_cores=cube_cores, vector_cores=vector_cores, dispatch_cycles=0, block_model="work")
    assert block_cycles(t, c, grid) >= block_cycles(t, c, span)
    assert block_cycles(t, c, grid) >= block_cycles(t, c, work) or c.work == 0
    assert alone_cycles(t, c, grid) >= alone_cycles(t, c, span)
    waves = math.ceil(t.blocks / grid.cores(t.core))
    if t.blocks >= lanes * waves:
        assert block_cycles(t, c, grid) == block_cycles(t, c, span)
    if t.blocks == 1 and c.work > 0:
        w = max(c.work_cube, c.work_vector / 2) if t.core == "mix" else c.work
        assert alone_cycles(t, c, grid) == max(c.span, w)

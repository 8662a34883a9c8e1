"""Streaming sweeps and the Dask executor's batching (perf/executors.py, perf/sweep.py), without pypto.

The Dask tests run an in-process LocalCluster (threads, 127.0.0.1) whose task, `perf.dask_worker.simulate`, is
replaced by one that answers from the cost key (tests/perf/test_sweep.py `fake_outcome`) and counts what it ran:
the batching, the de-duplication and the order of the answers are exercised as with pypto, in seconds.
"""
from __future__ import annotations

import itertools
import threading

import pytest

from perf.costs import PyptoCosts
from perf.executors import BATCH_PREFIX, TASK_PREFIX, TASKS_PER_THREAD, DaskExecutor, SimJob, TaskSizer, task_key
from perf.sweep import run_sweep
from tests.perf.test_sweep import TINY, FakeExecutor, fake_outcome

STAGE = ["attn.*", "qkv.*"]


class StreamingExecutor:
    """Answers each job when `lag` more jobs have been drawn after it (the rest at the end), noting the points
    recorded at each draw: lag 0 answers before drawing the next; lag 1 answers a kernel of an earlier point while
    a later point hands over its kernels."""

    name = "streaming"

    def __init__(self, out, lag: int = 0):
        self.out = out
        self.lag = lag
        self.jobs = []
        self.recorded_at_draw = []

    def run(self, jobs):
        for index, job in enumerate(jobs):
            self.recorded_at_draw.append(len(list((self.out / "points").glob("*.json"))))
            self.jobs.append(job)
            if index >= self.lag:
                yield index - self.lag, fake_outcome(self.jobs[index - self.lag].key)
        for index in range(max(0, len(self.jobs) - self.lag), len(self.jobs)):
            yield index, fake_outcome(self.jobs[index].key)

    def describe(self):
        return "streaming"

    def close(self):
        pass


@pytest.mark.parametrize("lag", [0, 1, 3])
def test_a_sweep_streams_points_finish_while_kernels_are_still_drawn(tmp_path, lag):
    points, _ = TINY.points()
    stream = StreamingExecutor(tmp_path / "s", lag)
    streamed = run_sweep(points, PyptoCosts(cache=tmp_path / "c1", executor=stream), tmp_path / "s", stage=STAGE)
    assert stream.recorded_at_draw[0] == 0 and stream.recorded_at_draw[-1] > 0    # points done before the last draw
    assert len(stream.jobs) == len({j.key for j in stream.jobs}) == streamed.simulated
    whole = FakeExecutor(reverse=True)          # draws everything first, answers in reverse
    batch = run_sweep(points, PyptoCosts(cache=tmp_path / "c2", executor=whole), tmp_path / "b", stage=STAGE)
    assert not streamed.incomplete and streamed.to_json()["points"] == batch.to_json()["points"]
    assert sorted(j.key for j in stream.jobs) == sorted(j.key for j in whole.jobs)


def test_task_keys_name_the_kernels_in_any_order():
    assert task_key(["abc"]) == TASK_PREFIX + "abc"
    assert task_key(["a", "b", "c"]) == task_key(["c", "a", "b"]) != task_key(["a", "b"])
    assert task_key(["a", "b"]).startswith(BATCH_PREFIX)


def test_task_sizer_batches_short_kernels_and_spreads_the_last_ones():
    sizer = TaskSizer(most=8, seconds=2.0)
    assert sizer.size() == 1                                  # nothing known yet: one kernel per task
    for _ in range(4):
        sizer.observe(0.5)
    assert sizer.size() == 4                                  # 2 s of 0.5 s kernels
    assert sizer.size(left=6, final=True, threads=2) == 2     # 6 left over 2 threads x TASKS_PER_THREAD tasks
    assert sizer.size(left=1, final=True, threads=2) == 1
    for _ in range(4):
        sizer.observe(10.0)
    assert sizer.size() == 1                                  # long kernels: a task each
    fast = TaskSizer(most=3, seconds=2.0)
    fast.observe(0.01)
    assert fast.size() == 3 and TaskSizer(most=1).size() == 1
    assert TASKS_PER_THREAD >= 2


# ---- the Dask executor on an in-process cluster ------------------------------------------------------------------
RAN: list[tuple[str, ...]] = []                # the kernels of every task the fake workers ran, in order
_ran_lock = threading.Lock()


def _fake_simulate(jobs, timeout):
    with _ran_lock:
        RAN.append(tuple(job.key for job in jobs))
    return [(fake_outcome(job.key), 0.05) for job in jobs]


@pytest.fixture
def cluster(monkeypatch):
    distributed = pytest.importorskip("distributed")
    import perf.dask_worker as dask_worker

    monkeypatch.setattr(dask_worker, "simulate", _fake_simulate)
    monkeypatch.setattr(dask_worker, "ensure_plugin", lambda client, **kw: None)     # no pypto processes
    RAN.clear()
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=False, protocol="tcp",
                                  host="127.0.0.1", dashboard_address=None) as c:
        yield c


def _jobs(count: int, duplicates: int = 0) -> list[SimJob]:
    keys = [f"{k * 2654435761 % 2 ** 32:08x}" + "0" * 16 for k in range(count)]
    keys += keys[:duplicates]
    return [SimJob(key, "src", {}, {}, label=f"k{n}") for n, key in enumerate(keys)]


def _run(executor, jobs) -> dict[int, object]:
    answers = {}
    for index, outcome in executor.run(iter(jobs)):         # drawn lazily, like a sweep's kernels
        assert index not in answers
        answers[index] = outcome
    return answers


def test_dask_batches_short_kernels_runs_duplicates_once_and_answers_every_job(cluster):
    jobs = _jobs(40, duplicates=6)
    batched = DaskExecutor(cluster.scheduler_address, kernels_per_task=8, task_seconds=0.4)
    try:
        answers = _run(batched, jobs)
    finally:
        batched.close()
    assert set(answers) == set(range(len(jobs)))
    assert all(answers[i] == fake_outcome(job.key) for i, job in enumerate(jobs))
    ran = list(itertools.chain.from_iterable(RAN))
    assert sorted(ran) == sorted({job.key for job in jobs})          # each distinct kernel once
    assert batched.tasks == len(RAN) < len(ran)                       # several kernels per task
    assert max(len(t) for t in RAN) <= 8 and len(RAN[0]) == 1        # one at a time until times are known
    RAN.clear()
    single = DaskExecutor(cluster.scheduler_address, kernels_per_task=1)
    try:
        one_each = _run(single, jobs)
    finally:
        single.close()
    assert all(len(t) == 1 for t in RAN) and single.tasks == len(RAN) == len({job.key for job in jobs})
    assert one_each == answers                                        # batched or not: the same answers


def test_dask_sweep_batched_equals_a_sweep_answered_in_reverse(cluster, tmp_path):
    points, _ = TINY.points()
    executor = DaskExecutor(cluster.scheduler_address, kernels_per_task=4, task_seconds=1.0)
    try:
        dask = run_sweep(points, PyptoCosts(cache=tmp_path / "c1", executor=executor), tmp_path / "d", stage=STAGE)
    finally:
        executor.close()
    reverse = run_sweep(points, PyptoCosts(cache=tmp_path / "c2", executor=FakeExecutor(reverse=True)),
                        tmp_path / "r", stage=STAGE)
    assert dask.to_json()["points"] == reverse.to_json()["points"] and not dask.incomplete
    assert any(len(t) > 1 for t in RAN) and dask.simulated == sum(len(t) for t in RAN)
    entries = sorted(p.name for p in (tmp_path / "c1").glob("*.json"))
    assert entries == sorted(p.name for p in (tmp_path / "c2").glob("*.json"))

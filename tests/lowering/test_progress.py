"""Progress bars of the long pypto commands: advanced per batch / wave, closed, off when stderr is not a TTY."""
import argparse

import kernels.pypto_rt as rt
from dspark_cli.common import add_progress_argument, progress_bars
from dspark_cli.main import build_parser
from dspark_ir import layers
from kernels.pypto_rt import KernelResult
from lowering import build_task_graph
from lowering.pypto_exec import check_kernels, runs_on_pypto


class Bar:
    def __init__(self, total):
        self.total, self.done, self.closed = total, 0, False

    def update(self, n):
        self.done += n

    def close(self):
        self.closed = True


class FakePool:
    batches = []

    def __init__(self, workers, timeout, **kwargs):
        self.workers = workers

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def run(self, jobs):
        FakePool.batches.append(len(jobs))
        return [KernelResult(label="k", mode="sim", ok=True, cycles=7, tasks=1) for _ in jobs]


def test_check_kernels_advances_the_bar_per_batch(monkeypatch):
    monkeypatch.setattr(rt, "WorkerPool", FakePool)
    tg = build_task_graph(layers.build("decode-swa", config="tiny", tp=1))
    bars = []
    runs = check_kernels(tg, "sim", workers=2, progress=lambda total: bars.append(Bar(total)) or bars[-1])
    n = sum(runs_on_pypto(t, tg) for t in tg.tasks)
    assert len(runs) == n and [b.total for b in bars] == [n] and bars[0].done == n and bars[0].closed
    assert max(FakePool.batches) <= 2


def test_no_bar_without_a_terminal_or_with_no_progress(monkeypatch):
    assert progress_bars(argparse.Namespace(no_progress=True), "task") is None
    monkeypatch.setattr("sys.stderr.isatty", lambda: False, raising=False)
    assert progress_bars(argparse.Namespace(no_progress=False), "task") is None


def test_every_command_with_a_bar_takes_the_shared_no_progress_flag():
    """One home for the flag and its rule (stderr only, only on a terminal): no command keeps its own."""
    shared = argparse.ArgumentParser()
    add_progress_argument(shared)
    want = next(a.help for a in shared._actions if "--no-progress" in a.option_strings)
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    helps = {name: [a.help for a in p._actions if "--no-progress" in a.option_strings]
             for name, p in sub.choices.items()}
    with_bar = {name for name, h in helps.items() if h}
    assert {"ab", "estimate", "sweep", "calibrate", "compile", "lower", "run"} <= with_bar
    assert all(helps[name] == [want] for name in with_bar)

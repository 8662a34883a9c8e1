"""`dspark sweep` (perf/sweep.py), the executors (perf/executors.py) and the cost-cache key, without pypto.

Kernel simulations are replaced by a fake executor whose answers are a function of the kernel's cost key, so
the plumbing (dedup, caching, per-point completion, order independence) is exercised as with pypto.
"""
from __future__ import annotations

import dataclasses
import json
import socket
from types import SimpleNamespace

import pytest

import perf.costs as costs
from dspark_cli.main import main
from dspark_ir import layers
from lowering import build_task_graph
from perf.ab import Shape
from perf.costs import PyptoCosts, RooflineCosts, cost_key, kernel_source
from perf.executors import ExecutorError, LocalExecutor, SimOutcome, make_executor
from perf.schedule import ScheduleParams
from perf.sweep import Grid, Point, SweepError, parse_param, parse_values, pipeline_variant, run_sweep


def fake_outcome(key: str) -> SimOutcome:
    """A cost-model answer that is a function of the kernel's cost key alone."""
    h = int(key[:8], 16)
    return SimOutcome(True, cycles=9000 + h % 5000, tasks=1 + h % 7,
                      lanes={"first": 100.0, "last": 1100.0 + h % 3000, "cube": float(h % 2000),
                             "vector": float(h % 4000)})


class FakeExecutor:
    """Answers derived from the job's key, in the order given or reversed; `transient` keys time out."""

    name = "fake"

    def __init__(self, reverse: bool = False, transient=()):
        self.reverse = reverse
        self.transient = set(transient)
        self.jobs = []

    def run(self, jobs):
        jobs = list(jobs)
        self.jobs += jobs
        order = range(len(jobs))[::-1] if self.reverse else range(len(jobs))
        for i in order:
            key = jobs[i].key
            if key in self.transient:
                yield i, SimOutcome(False, "timed out after 1 s (worker killed)")
                continue
            yield i, fake_outcome(key)

    def describe(self):
        return "fake"

    def close(self):
        pass


TINY = Grid(("decode-swa",), ("tiny",), (1, 2), pipelines=("default", "all-off"))


# ---- the grid ----------------------------------------------------------------------------------------------
def test_axis_values_and_params():
    assert parse_values("1,2,4", "--tp") == (1, 2, 4)
    assert parse_values("8K, 16K,128K,8K", "--context") == (8192, 16384, 131072)
    assert parse_values("1M", "x") == (1 << 20,)
    for bad in ("", "0", "-4", "8X", "1.5"):
        with pytest.raises(SweepError, match="is not a positive integer"):
            parse_values(bad, "--batch")
    assert parse_param("chunk=64,128") == ("chunk", (64, 128))
    with pytest.raises(SweepError, match="expected NAME=V1,V2"):
        parse_param("chunk")


def test_pipelines_named_or_strings():
    assert pipeline_variant("all-off").kind == "off" and pipeline_variant("-topk-bypass").kind == "loo"
    custom = pipeline_variant("canonicalize,cse,dce")
    assert custom.kind == "pipeline" and dict(custom.ctx) == {"pipeline": "canonicalize,cse,dce"}
    with pytest.raises(SweepError, match="names no A/B variant"):
        pipeline_variant("-no-such-pass")
    with pytest.raises(Exception, match="-p:1:"):
        pipeline_variant("canonicalize,no-such-pass")


def test_grid_points_parameter_axes_and_impossible_shapes():
    grid = Grid(("decode-swa", "decode-csa"), ("tiny", "flash"), (2, 4), params=(("max_context", (64, 128)),),
                pipelines=("default", "all-off"))
    points, skipped = grid.points()
    swa = [p for p in points if p.layer == "decode-swa"]
    csa = [p for p in points if p.layer == "decode-csa"]
    # tiny TP2/TP4 and flash TP4 (flash TP2 is impossible); swa takes no max_context: one point per shape
    assert len(swa) == 3 * 2 and len(csa) == 3 * 2 * 2
    assert all(dict(p.shape.params) == {} for p in swa)
    assert {dict(p.shape.params)["max_context"] for p in csa} == {64, 128}
    assert skipped and all("flash TP=2" in s and "not supported" in s for s in skipped)
    assert points == list(dict.fromkeys(points))
    with pytest.raises(SweepError, match="--param chunk: none of the layers takes it"):
        Grid(("decode-swa",), ("tiny",), params=(("chunk", (64,)),)).points()
    with pytest.raises(SweepError, match="no possible point"):
        Grid(("decode-swa",), ("flash",), (2,)).points()


# ---- resume ------------------------------------------------------------------------------------------------
class Interrupting(RooflineCosts):
    """Roofline costs that raise KeyboardInterrupt on the `stop_at`-th point (a Ctrl-C mid-sweep)."""

    def __init__(self, stop_at: int | None = None):
        super().__init__()
        self.calls = 0
        self.stop_at = stop_at

    def costs(self, tg, tasks=None, progress=None):
        self.calls += 1
        if self.calls == self.stop_at:
            raise KeyboardInterrupt
        return super().costs(tg, tasks, progress)


def test_an_interrupted_sweep_resumes_without_redoing_finished_points(tmp_path):
    points, _ = TINY.points()
    with pytest.raises(KeyboardInterrupt):
        run_sweep(points, Interrupting(stop_at=3), tmp_path)
    assert len(list((tmp_path / "points").glob("*.json"))) == 2          # the two points finished before
    again = Interrupting()
    report = run_sweep(points, again, tmp_path)
    assert report.resumed == 2 and again.calls == len(points) - 2 and not report.incomplete
    fresh = run_sweep(points, RooflineCosts(), tmp_path / "fresh")
    assert report.to_json()["points"] == fresh.to_json()["points"]


def test_a_recorded_point_is_loaded_not_recomputed(tmp_path):
    points, _ = TINY.points()
    run_sweep(points, RooflineCosts(), tmp_path)
    files = sorted((tmp_path / "points").glob("*.json"))
    doc = json.loads(files[0].read_text())
    doc["result"]["latency_us"] = 12345.0
    files[0].write_text(json.dumps(doc))
    counting = Interrupting()
    report = run_sweep(points, counting, tmp_path)
    assert counting.calls == 0 and report.resumed == len(points)
    assert 12345.0 in [r["latency_us"] for r in report.results.values()]
    # another schedule model is another identity: nothing is reused
    other = run_sweep(points, counting, tmp_path, params=ScheduleParams(dispatch_cycles=0.0))
    assert other.resumed == 0 and counting.calls == len(points)


# ---- the pypto path, with a fake executor ---------------------------------------------------------------------
def test_results_do_not_depend_on_order_or_executor_state(tmp_path):
    points, _ = TINY.points()
    stage = ["attn.*", "qkv.*"]
    runs = []
    for k, reverse in enumerate((False, True)):
        fake = FakeExecutor(reverse=reverse)
        source = PyptoCosts(cache=tmp_path / f"cache{k}", executor=fake)
        report = run_sweep(points, source, tmp_path / f"out{k}", stage=stage)
        assert not report.incomplete and report.simulated == len({j.key for j in fake.jobs}) > 0
        assert len(fake.jobs) == len({j.key for j in fake.jobs})               # a kernel is submitted once
        runs.append(report.to_json()["points"])
    assert runs[0] == runs[1]
    assert all(r["result"]["sources"].get("pypto") for r in runs[0])
    # a warm re-run simulates nothing and answers every look-up from the cache
    fake = FakeExecutor()
    warm = run_sweep(points, PyptoCosts(cache=tmp_path / "cache0", executor=fake), tmp_path / "warm", stage=stage)
    assert not fake.jobs and warm.cache_misses == 0 and warm.cache_hits > 0
    assert warm.to_json()["points"] == runs[0]


def test_points_waiting_for_a_timed_out_kernel_stay_unrecorded(tmp_path):
    points, _ = TINY.points()
    stage = ["attn.*", "qkv.*"]
    probe = FakeExecutor()
    run_sweep(points, PyptoCosts(cache=tmp_path / "probe", executor=probe), tmp_path / "probe-out", stage=stage)
    flaky = probe.jobs[0].key
    report = run_sweep(points, PyptoCosts(cache=tmp_path / "c", executor=FakeExecutor(transient={flaky})),
                       tmp_path / "out", stage=stage)
    assert report.incomplete and len(report.results) + len(report.incomplete) == len(points)
    assert "points incomplete" in report.markdown()
    retry = run_sweep(points, PyptoCosts(cache=tmp_path / "c", executor=FakeExecutor()), tmp_path / "out",
                      stage=stage)
    assert not retry.incomplete and retry.resumed == len(report.results) and retry.simulated == 1


# ---- the cost-cache key ----------------------------------------------------------------------------------------
def test_cost_key_covers_everything_that_changes_the_answer(monkeypatch):
    tg = build_task_graph(layers.build("decode-swa", config="tiny"))
    t = tg.task("attn.rms_norm")
    src = kernel_source(t)
    base = cost_key(t, src)
    a = t.args[0]

    def first_arg(**change):
        arg = SimpleNamespace(**{"param": a.param, "direction": a.direction, "dtype": a.dtype, "shape": a.shape,
                                 **change})
        return dataclasses.replace(t, args=(arg, *t.args[1:]))

    assert cost_key(first_arg(), src) == base
    changed = {
        "source": cost_key(t, src + "\n"),
        "shape": cost_key(first_arg(shape=(*a.shape[:-1], a.shape[-1] + 1)), src),
        "dtype": cost_key(first_arg(dtype="f32"), src),
        "direction": cost_key(first_arg(direction="inout"), src),
    }
    monkeypatch.setattr(costs, "EXTRACTOR_VERSION", costs.EXTRACTOR_VERSION + 1)
    changed["extractor"] = cost_key(t, src)
    monkeypatch.undo()
    model = costs.cost_model()
    for field, value in (("pypto", "0.2.1"), ("model", "0" * 16)):
        monkeypatch.setattr(costs, "_installed_cost_model", lambda f=field, v=value: {**model, f: v})
        changed[field] = cost_key(t, src)
        monkeypatch.undo()
    assert cost_key(t, src) == base
    assert all(k != base for k in changed.values()) and len(set(changed.values())) == len(changed), changed
    # a renamed task with the same body shares the entry (the key never sees the task's name)
    assert cost_key(dataclasses.replace(t, name="x.other", kernel="other"), src) == base


def test_cost_model_digests_pypto_configs():
    model = costs.cost_model()
    assert set(model) == {"pypto", "model"}
    assert model["pypto"] == "none" or len(model["model"]) == 16


def test_cache_writes_are_atomic_and_readable_by_others(tmp_path):
    tg = build_task_graph(layers.build("decode-swa", config="tiny"))
    t = tg.task("attn.rms_norm")
    src = PyptoCosts(cache=tmp_path)
    assert src._record(t, "k1", SimOutcome(True, cycles=10, tasks=1, lanes={"first": 0, "last": 5, "cube": 0,
                                                                            "vector": 5}))
    assert [p.name for p in tmp_path.iterdir()] == ["k1.json"]               # no temp file left behind
    assert (tmp_path / "k1.json").stat().st_mode & 0o777 == 0o644


# ---- executor selection and its errors ----------------------------------------------------------------------
def test_executor_selection(monkeypatch):
    monkeypatch.delenv("DSPARK_SCHEDULER", raising=False)
    assert isinstance(make_executor(), LocalExecutor) and make_executor(workers=3).workers == 3
    with pytest.raises(ExecutorError, match="--scheduler applies to --executor dask"):
        make_executor("local", scheduler="tcp://127.0.0.1:8786")
    with pytest.raises(ExecutorError, match="--executor dask needs --scheduler tcp://HOST:PORT"):
        make_executor("dask")
    monkeypatch.setenv("DSPARK_SCHEDULER", "not-an-address")
    with pytest.raises(ExecutorError, match="'not-an-address': expected tcp://HOST:PORT"):
        make_executor()                          # the variable alone selects dask
    assert isinstance(make_executor("local"), LocalExecutor)


def _one_line_error(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("dspark: "), err
    return err


@pytest.mark.parametrize("cmd", ["sweep", "ab"])
def test_bad_executor_flags_are_one_line_errors(cmd, tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("DSPARK_SCHEDULER", raising=False)
    base = [cmd, "decode-swa", "--config", "tiny", "--no-progress", "-o", str(tmp_path / "o")]
    assert "needs --scheduler" in _one_line_error(capsys, base + ["--executor", "dask"])
    assert "expected tcp://HOST:PORT" in _one_line_error(capsys, base + ["--scheduler", "localhost"])
    assert "--workers: must be at least 1" in _one_line_error(capsys, base + ["--workers", "0"])


def test_dask_missing_is_a_one_line_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(__import__("sys").modules, "distributed", None)
    err = _one_line_error(capsys, ["sweep", "decode-swa", "--config", "tiny", "--scheduler", "tcp://127.0.0.1:9",
                                   "-o", str(tmp_path)])
    assert "needs dask[distributed]" in err


def test_unreachable_scheduler_is_a_one_line_error(tmp_path, capsys, monkeypatch):
    pytest.importorskip("distributed")
    import perf.executors

    monkeypatch.setattr(perf.executors, "CONNECT_TIMEOUT", 1.0)
    with socket.socket() as s:                   # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    err = _one_line_error(capsys, ["sweep", "decode-swa", "--config", "tiny", "--scheduler",
                                   f"tcp://127.0.0.1:{port}", "-o", str(tmp_path)])
    assert f"--scheduler tcp://127.0.0.1:{port}: cannot reach the Dask scheduler" in err


# ---- the command ---------------------------------------------------------------------------------------------
def test_cli_writes_table_json_plots_and_resumes(tmp_path, capsys):
    out = tmp_path / "sw"
    argv = ["sweep", "decode-swa", "decode-csa", "--config", "tiny", "--tp", "1,2", "--context", "32,64",
            "-p", "default", "-p", "all-off", "-p", "canonicalize,cse,dce", "-p=-topk-bypass", "--source", "roofline",
            "--no-progress", "-o", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert "| config | TP | B | S | max_context | pipeline | latency µs |" in printed
    assert "`canonicalize,cse,dce`" in printed and "`-topk-bypass`" in printed and "Swept: tp, max_context." in printed
    assert "-p=-topk-bypass" in printed                                 # the reproduce line parses back
    doc = json.loads((out / "sweep.json").read_text())
    assert doc["schema"] == "dspark-sweep/1" and doc["swept"] == ["tp", "max_context"]
    assert len(doc["points"]) == 2 * 4 + 2 * 2 * 4 and not doc["incomplete"]
    assert all(p["result"]["latency_us"] > 0 for p in doc["points"])
    off = [p for p in doc["points"] if p["point"]["pipeline"] == "all-off"]
    assert all(p["delta_vs_off_pct"] == 0 for p in off)
    pngs = sorted(p.name for p in out.glob("*.png"))
    assert pngs == ["sweep_decode-csa_max_context.png", "sweep_decode-csa_tp.png", "sweep_decode-swa_tp.png"]
    assert all((out / p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in pngs)
    assert main(argv) == 0
    assert "24 points: 24 recorded by an earlier run, 0 estimated now" in capsys.readouterr().out
    assert json.loads((out / "sweep.json").read_text())["points"] == doc["points"]


def test_cli_grid_errors(tmp_path, capsys):
    base = ["sweep", "decode-swa", "--config", "tiny", "--source", "roofline", "-o", str(tmp_path)]
    assert "--tp: 'x' is not a positive integer" in _one_line_error(capsys, base + ["--tp", "x"])
    assert "--param chunk: none of the layers takes it" in _one_line_error(capsys, base + ["--param", "chunk=64"])
    assert "did you mean" in _one_line_error(capsys, ["sweep", "decode-swb", "-o", str(tmp_path)])
    assert "no task of" in _one_line_error(capsys, base + ["--stage", "nothing.*", "--no-progress"])


def test_point_labels():
    p = Point("decode-csa", Shape("tiny", 2, params=(("max_context", 64),)), "all-off")
    assert p.label() == "decode-csa [tiny TP=2 max_context=64] all-off"
    assert p.to_json() == {"layer": "decode-csa", "config": "tiny", "tp": 2, "batch": None, "seq": None,
                           "max_context": 64, "pipeline": "all-off"}


def test_ab_runs_its_kernels_on_the_chosen_executor(tmp_path, monkeypatch):
    import perf.executors

    fake = FakeExecutor()
    chosen = {}

    def make(name=None, **kw):
        chosen.update(kw, name=name)
        return fake

    monkeypatch.setattr(perf.executors, "make_executor", make)
    argv = ["ab", "decode-swa", "--config", "tiny", "--tp", "1", "--no-loo", "--no-aoi", "--no-steps", "--no-plots",
            "--no-traces", "--no-progress", "--workers", "3", "--cost-cache",
            str(tmp_path / "cache"), "-o", str(tmp_path / "ab")]
    assert main(argv) == 0
    assert chosen == {"name": None, "scheduler": None, "workers": 3, "timeout": 1800.0}
    assert fake.jobs and len(list((tmp_path / "cache").glob("*.json"))) == len(fake.jobs)
    assert f"{len(fake.jobs)} kernels simulated in this run on fake" in (tmp_path / "ab" / "ab.md").read_text()

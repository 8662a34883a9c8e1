"""`dspark sweep` on a Dask LocalCluster (two worker processes on 127.0.0.1) against the local executor.

Six tiny kernels (kv projection and attention norm of tiny decode-swa at TP1 and TP2, default and all-off pipelines)
go through pypto's cost model once on each executor, each with its own empty cost cache: the sweeps must agree bit
for bit. On Dask, once the first kernel is back, the next ones are batched (up to 4 per task whatever their times,
one task in flight per worker): batched on Dask and one at a time locally, the answers are the same. About a minute
on an idle 2-core machine (each kernel has a 300 s timeout); the cluster is closed on the way out.
"""
from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from dspark_cli.main import main

pytestmark = [pytest.mark.pypto, pytest.mark.slow]

SWEEP = ["sweep", "decode-swa", "--config", "tiny", "--tp", "1,2", "-p", "default", "-p", "all-off",
         "--stage", "qkv.kv_*,attn.rms_norm", "--timeout", "300", "--no-plots", "--no-progress"]


def _points(out) -> list:
    return json.loads((out / "sweep.json").read_text())["points"]


def test_dask_sweep_equals_local_sweep(tmp_path, capsys, monkeypatch):
    distributed = pytest.importorskip("distributed")
    import perf.executors

    monkeypatch.setattr(perf.executors, "TASK_SECONDS", 1e6)      # batch as soon as one kernel time is known
    monkeypatch.setattr(perf.executors, "TASKS_PER_THREAD", 1)    # 2 singles, then a batch of the next 4
    scratch = Path(tempfile.gettempdir())
    before = set(scratch.glob("dspark-dask-*"))
    assert main(SWEEP + ["--executor", "local", "--cost-cache", str(tmp_path / "cache-local"),
                         "-o", str(tmp_path / "local")]) == 0
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, host="127.0.0.1",
                                  dashboard_address=None) as cluster:
        assert main(SWEEP + ["--scheduler", cluster.scheduler_address, "--kernels-per-task", "4", "--cost-cache",
                             str(tmp_path / "cache-dask"), "-o", str(tmp_path / "dask")]) == 0
        with distributed.Client(cluster, set_as_default=False) as client:
            ran = client.run(lambda dask_worker: "dspark-pypto" in dask_worker.plugins)
            batches = client.run_on_scheduler(lambda dask_scheduler: sorted(
                {str(t[0]) for t in dask_scheduler.transition_log if str(t[0]).startswith("dspark-sims-")}))
    assert set(scratch.glob("dspark-dask-*")) == before        # the workers' plugins cleaned up
    printed = capsys.readouterr().out
    assert "on dask (tcp://127.0.0.1:" in printed and "2 workers" in printed
    assert len(ran) == 2 and all(ran.values())
    assert batches                                              # some tasks ran several kernels
    local, dask = _points(tmp_path / "local"), _points(tmp_path / "dask")
    assert local == dask
    assert all(p["result"]["sources"] == {"pypto": p["result"]["kernels"]} for p in local)
    entries = {p.name: json.loads(p.read_text()) for p in (tmp_path / "cache-local").glob("*.json")}
    assert entries and entries == {p.name: json.loads(p.read_text()) for p in (tmp_path / "cache-dask").glob("*.json")}

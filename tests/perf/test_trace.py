"""The Perfetto / Chrome trace of a schedule (perf/trace.py)."""
from __future__ import annotations

import json

from perf.costs import KernelCost
from perf.schedule import SchedTask, ScheduleParams, schedule
from perf.trace import trace_json, write_trace


def _sched():
    p = ScheduleParams(cube_cores=2, vector_cores=4, dispatch_cycles=2, clock_hz=1e6)
    tasks = [SchedTask(0, "a", "vector", 6, (), "op_a"), SchedTask(1, "b", "mix", 1, (0,), "op_b"),
             SchedTask(2, "j", "none", 0, (1,))]
    costs = {0: KernelCost("pypto", 10, 0, 60), 1: KernelCost("roofline", 5, 5, 10)}
    return schedule(tasks, costs, p)


def test_trace_is_valid_chrome_json(tmp_path):
    s = _sched()
    path = tmp_path / "t.trace.json"
    write_trace(path, s, "unit", layer="x")
    doc = json.loads(path.read_text())
    assert doc["displayTimeUnit"] == "ns" and doc["otherData"]["makespan_us"] == s.makespan_us
    events = doc["traceEvents"]
    for e in events:
        assert e["ph"] in ("X", "M") and isinstance(e["pid"], int)
        if e["ph"] == "X":
            assert e["ts"] >= 0 and e["dur"] >= 0 and isinstance(e["tid"], int) and e["name"]
    blocks = [e for e in events if e["ph"] == "X" and e["pid"] == 1]
    assert len(blocks) == 6 + 3                      # six vector blocks, one mix block on 3 lanes
    assert {e["cat"] for e in blocks} == {"pypto", "roofline"}
    lanes = {e["args"]["name"] for e in events if e["name"] == "thread_name" and e["pid"] == 1}
    assert lanes == {"AIC0", "AIC1", "AIV0", "AIV1", "AIV2", "AIV3"}


def test_task_track_shows_waits_and_runs():
    doc = trace_json(_sched())
    tasks = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["pid"] == 2]
    runs = {e["name"]: e for e in tasks if e["cat"] != "wait"}
    assert set(runs) == {"a", "b", "j"}
    assert runs["b"]["ts"] == 24 and runs["b"]["args"]["source"] == "roofline"   # 2 + two waves of 10 + 2
    assert not [e for e in tasks if e["cat"] == "wait"]                          # nothing waited for cores

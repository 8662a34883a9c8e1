"""A schedule as a Chrome / Perfetto trace (JSON object format, timestamps in µs).

Process 1 "cores": one thread per AIC / AIV lane, one complete event ("ph": "X") per block on it (a mix
block shows on its AIC and both AIVs). Process 2 "tasks": one thread per task with its dispatch wait
(ready → first block) and its run (first block → finish). Open the file in https://ui.perfetto.dev or
chrome://tracing.
"""
from __future__ import annotations

import json
from typing import Any

from .schedule import Schedule

CORES_PID, TASKS_PID = 1, 2


def _lane_order(lane: str) -> int:
    kind, index = lane[:3], int(lane[3:])
    return (0 if kind == "AIC" else 1000) + index


def trace_events(sched: Schedule, title: str = "schedule") -> list[dict[str, Any]]:
    us = sched.params.us
    names = {t.id: t.name for t in sched.tasks}
    ops = {t.id: t.op for t in sched.tasks}
    lanes = [f"AIC{i}" for i in range(sched.params.cube_cores)] + [f"AIV{i}" for i in range(sched.params.vector_cores)]
    tid = {lane: _lane_order(lane) for lane in lanes}
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": CORES_PID, "args": {"name": f"{title}: cores"}},
        {"name": "process_name", "ph": "M", "pid": TASKS_PID, "args": {"name": f"{title}: tasks"}},
    ]
    events += [{"name": "thread_name", "ph": "M", "pid": CORES_PID, "tid": tid[lane], "args": {"name": lane}}
               for lane in lanes]
    for b in sched.blocks:
        cost = sched.costs[b.task]
        for lane in b.lanes:
            events.append({"name": names[b.task], "cat": cost.source, "ph": "X", "pid": CORES_PID, "tid": tid[lane],
                           "ts": us(b.start), "dur": us(b.end - b.start),
                           "args": {"task": b.task, "op": ops[b.task], "block": b.block, "source": cost.source}})
    for t in sched.tasks:
        run = sched.runs[t.id]
        events.append({"name": "thread_name", "ph": "M", "pid": TASKS_PID, "tid": t.id,
                       "args": {"name": f"{t.id} {t.name}"}})
        cost = sched.costs[t.id]
        args = {"task": t.id, "op": t.op, "core": t.core, "blocks": t.blocks, "source": cost.source,
                "span_cycles": cost.span, "floor_bound": run.floor_bound}
        if run.start > run.ready:
            events.append({"name": "wait for cores", "cat": "wait", "ph": "X", "pid": TASKS_PID, "tid": t.id,
                           "ts": us(run.ready), "dur": us(run.start - run.ready), "args": {"task": t.id}})
        events.append({"name": t.name, "cat": cost.source, "ph": "X", "pid": TASKS_PID, "tid": t.id,
                       "ts": us(run.start), "dur": max(us(run.finish - run.start), 0.0), "args": args})
    return events


def trace_json(sched: Schedule, title: str = "schedule", **metadata: Any) -> dict[str, Any]:
    return {"traceEvents": trace_events(sched, title), "displayTimeUnit": "ns",
            "otherData": {"title": title, "makespan_us": sched.makespan_us, "serial_us": sched.serial_us,
                          "dispatch_cycles": sched.params.dispatch_cycles, **metadata}}


def write_trace(path, sched: Schedule, title: str = "schedule", **metadata: Any) -> None:
    from dspark_ir.fsutil import write_file_atomic

    write_file_atomic(str(path), json.dumps(trace_json(sched, title, **metadata)) + "\n")

"""Layer latency estimate: kernel costs (cost model or roofline) + the schedule model + the roofline bound.

    est = estimate(tg, PyptoCosts())           # or RooflineCosts(), FunctionCosts(fn)
    est.makespan_us, est.serial_us, est.bound_us, est.ratio, est.rows (one per task), est.schedule

Per kernel row: its source (pypto | roofline), its alone time (the task with the chip to itself, schedule
rule 5 without the dispatch), its chip-level roofline bound (bytes / HBM bandwidth, FLOPs / peak of its
core kind) and their ratio. Per layer: the serial sum, the scheduled makespan, and the layer bound =
the chip roofline of the summed work of all kernels (the makespan can never beat it), with the ratio
makespan / bound, and beside it the floor of what the rank must move (roofline.floor) with makespan / floor.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from dspark_ir.hardware import HARDWARE, Hardware
from lowering.taskgraph import TaskGraph

from .costs import CostSource, KernelCost
from .roofline import Bound, Floor, Work, chip_bound, floor, task_work
from .schedule import Schedule, ScheduleParams, cross_rank_note, sched_tasks, schedule


@dataclass
class KernelRow:
    id: int
    name: str
    op: str
    core: str
    blocks: int
    source: str
    note: str
    span_us: float            # cost-model makespan of the kernel (or roofline estimate)
    alone_us: float           # max(span, waves · block) — the kernel with the chip to itself
    start_us: float
    finish_us: float
    bound_us: float           # chip roofline of this kernel
    limit: str                # which roofline term binds: hbm | cube | vector | link
    bytes: float
    cube_flops: float
    vector_ops: float
    pypto_tasks: int | None
    total_cycles: float | None

    @property
    def ratio(self) -> float | None:
        return self.alone_us / self.bound_us if self.bound_us > 0 else None

    def to_json(self) -> dict:
        d = dict(self.__dict__)
        d["ratio"] = self.ratio
        return d


@dataclass
class LayerEstimate:
    label: str
    schedule: Schedule
    rows: list[KernelRow]
    work: Work
    bound: Bound
    floor: Floor
    hw: Hardware = HARDWARE
    extra: dict = field(default_factory=dict)

    @property
    def makespan_us(self) -> float:
        return self.schedule.makespan_us

    @property
    def serial_us(self) -> float:
        return self.schedule.serial_us

    @property
    def critical_us(self) -> float:
        return self.schedule.params.us(self.schedule.critical)

    @property
    def bound_us(self) -> float:
        return self.bound.us()

    @property
    def ratio(self) -> float | None:
        return self.makespan_us / self.bound_us if self.bound_us > 0 else None

    @property
    def floor_ratio(self) -> float | None:
        """makespan / the low end of the floor of what the rank must move."""
        return self.makespan_us / self.floor.low_us if self.floor.low_us > 0 else None

    @property
    def tasks(self) -> int:
        return len(self.schedule.tasks)

    @property
    def kernels(self) -> int:
        return sum(1 for r in self.rows if r.core != "none")

    def sources(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for r in self.rows:
            if r.core != "none":
                out[r.source] = out.get(r.source, 0) + 1
        return out

    def roofline_share(self) -> float:
        """Fraction of the serial kernel time that comes from roofline (not cost-model) estimates."""
        total = sum(r.alone_us for r in self.rows if r.core != "none")
        rl = sum(r.alone_us for r in self.rows if r.core != "none" and r.source != "pypto")
        return rl / total if total else 0.0

    def critical_rows(self) -> list[KernelRow]:
        ids = set(self.schedule.critical_path)
        return [r for r in self.rows if r.id in ids and r.core != "none"]

    def summary(self) -> str:
        src = ", ".join(f"{n} {k}" for k, n in sorted(self.sources().items()))
        return (f"{self.label}: makespan {self.makespan_us:.1f} µs, serial {self.serial_us:.1f} µs, "
                f"roofline {self.bound_us:.1f} µs ({self.bound.limit}), ratio {self.ratio or 0:.2f}; "
                f"{self.tasks} tasks, {self.kernels} kernels ({src})")

    def to_json(self, rows: bool = True) -> dict:
        d = {"label": self.label, "makespan_us": self.makespan_us, "serial_us": self.serial_us,
             "critical_us": self.critical_us, "bound_us": self.bound_us, "bound_limit": self.bound.limit,
             "bound_terms_us": {k: v * 1e6 for k, v in self.bound.terms.items()}, "ratio": self.ratio,
             "floor": self.floor.to_json(), "floor_ratio": self.floor_ratio,
             "tasks": self.tasks, "kernels": self.kernels, "sources": self.sources(),
             "roofline_share": self.roofline_share(), "work": self.work.to_json(),
             "dispatch_cycles": self.schedule.params.dispatch_cycles,
             "critical_path": [r.name for r in self.critical_rows()], **self.extra}
        if rows:
            d["kernels_detail"] = [r.to_json() for r in self.rows]
        return d


def estimate(tg: TaskGraph, source: CostSource, params: ScheduleParams | None = None, *,
             hw: Hardware = HARDWARE, label: str = "", costs: dict[int, KernelCost] | None = None,
             progress: Callable[[int, int], None] | None = None) -> LayerEstimate:
    """Costs from `source` (or `costs`), the schedule, per-kernel rows and the layer roofline."""
    params = params or ScheduleParams.of(hw)
    costs = costs if costs is not None else source.costs(tg, progress=progress)
    tasks = sched_tasks(tg)
    sched = schedule(tasks, costs, params)
    rows, total = [], Work()
    for t, st in zip(tg.tasks, tasks):
        work = task_work(t)
        total = total + work
        b = chip_bound(work, hw)
        c = costs[t.id]
        run = sched.runs[t.id]
        alone = run.alone - params.dispatch_cycles if st.core != "none" else 0.0
        note = "; ".join(x for x in (c.note, cross_rank_note(st, params)) if x)
        rows.append(KernelRow(t.id, t.name, t.op, st.core, st.blocks, c.source, note, hw.us(c.span),
                              hw.us(alone), hw.us(run.start), hw.us(run.finish), b.us(), b.limit, work.bytes,
                              work.cube_flops + work.cube_int8, work.vector_ops, c.pypto_tasks, c.total))
    return LayerEstimate(label or tg.name, sched, rows, total, chip_bound(total, hw), floor(tg, hw), hw)


def kernel_table(est: LayerEstimate, limit: int | None = None) -> str:
    """Markdown: the kernels by alone time, with source, bound and ratio."""
    rows = sorted((r for r in est.rows if r.core != "none"), key=lambda r: -r.alone_us)
    if limit is not None:
        rows = rows[:limit]
    lines = ["| task | op | core × blocks | source | alone µs | roofline µs (limit) | ratio | pypto tasks | note |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r.ratio:.1f}" if r.ratio is not None else "–"
        tasks = r.pypto_tasks if r.pypto_tasks is not None else "–"
        lines.append(f"| {r.id} `{r.name}` | {r.op} | {r.core} × {r.blocks} | {r.source} | {r.alone_us:.1f} | "
                     f"{r.bound_us:.2f} ({r.limit}) | {ratio} | {tasks} | "
                     f"{r.note.replace('|', '/')} |")
    return "\n".join(lines)


def fmt_us(x: float | None) -> str:
    if x is None or (isinstance(x, float) and math.isnan(x)):
        return "–"
    return f"{x:.1f}"

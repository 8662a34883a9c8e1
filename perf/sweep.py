"""`dspark sweep`: estimated latency over a grid of shapes × pipelines, resumable, on any executor.

    grid = Grid(("decode-csa",), configs=("flash",), tps=(4,), params=(("max_context", (8192, 16384)),))
    report = run_sweep(grid.points()[0], PyptoCosts(executor=...), "sweep-out")
    report.markdown(), report.to_json(), report.plots("sweep-out")

A point is one layer at one shape (config, TP, B, S and the layer's own parameters: `max_context` for the
context sweeps of CSA/HCA, a prefill layer's chunk) lowered through one pipeline: a named variant of perf/ab.py
(`default`, `all-off`, `cleanup`, `-PASS`, `+PASS`, `step:N`) or any pass pipeline string. Its numbers are the
A/B matrix's (perf/estimate.py on the layer, or the `stage` alone as in `dspark ab --stage`), from the same
cost source, so a sweep point and an A/B variant of the same shape agree.

How a sweep runs: one stream of kernels. The executor draws the next kernel when it has room for it (perf/
executors.py); to answer, the sweep lowers the next point and hands over those of its kernels that are neither in
the cost cache nor already submitted (distinct keys over the whole sweep), so the lowering and code generation of
later points overlap the simulation of earlier ones. A point is estimated and recorded as soon as the last of its
kernels is back (a point whose kernels are all cached, at once). Each finished point is written at once to
`<out>/points/<id>.json` (atomically), where `<id>` hashes the point and everything else its numbers depend on
(cost source, cost model, schedule parameters, stage): a re-run with the same output directory (after an
interrupt, or with a grid that grew) loads those points instead of redoing them. A point one of whose kernels
timed out or crashed is left unrecorded (it is retried by the next run). The results do not depend on the
executor, its worker count, how it groups kernels into tasks or the order in which kernels finish.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from dspark_ir.errors import DsparkError
from dspark_ir.fsutil import OutputDir
from dspark_ir.hardware import HARDWARE, Hardware

from .ab import Case, Lowered, Shape, Variant, lower_variant, stage_tasks, variants
from .costs import CostSource, PyptoCosts, cost_model
from .estimate import estimate
from .roofline import Work, chip_bound, task_work
from .schedule import ScheduleParams, schedule

SCHEMA = "dspark-sweep/1"
SHAPE_AXES = ("config", "tp", "batch", "seq")
DEFAULT_PIPELINES = ("default", "all-off")


class SweepError(DsparkError):
    """A bad grid or pipeline, or a point that cannot be estimated."""


# ---- the grid --------------------------------------------------------------------------------------------
_SIZE = re.compile(r"^(\d+)([kKmM]?)$")


def parse_values(text: str, what: str) -> tuple[int, ...]:
    """`1,2,4` or `8K,16K,128K` (K = 1024, M = 1024²) -> positive ints, in the order given, duplicates dropped."""
    out: list[int] = []
    for item in (part.strip() for part in str(text).split(",")):
        m = _SIZE.match(item)
        if not m or int(m.group(1)) <= 0:
            raise SweepError(f"{what}: '{item}' is not a positive integer (e.g. 4, 8K, 1M)")
        value = int(m.group(1)) * {"": 1, "k": 1024, "m": 1024 ** 2}[m.group(2).lower()]
        if value not in out:
            out.append(value)
    return tuple(out)


def parse_param(text: str) -> tuple[str, tuple[int, ...]]:
    """`NAME=V1,V2` (a layer parameter axis) -> (NAME, values)."""
    name, sep, values = str(text).partition("=")
    if not sep or not re.fullmatch(r"[A-Za-z_]\w*", name.strip()):
        raise SweepError(f"--param: expected NAME=V1,V2,..., got '{text}'")
    return name.strip(), parse_values(values, f"--param {name.strip()}")


def pipeline_variant(spec: str) -> Variant:
    """A named A/B variant (default, all-off, cleanup, -PASS, +PASS, step:N), `none` (no passes: the graph as
    built or written) or a pass pipeline string."""
    spec = spec.strip()
    named = {v.name: v for v in variants()}
    if spec in named:
        return named[spec]
    if spec == "none":
        return Variant("none", "none", ctx=(("pipeline", ""),))
    if spec[:1] in "-+" or spec.startswith("step:"):
        raise SweepError(f"-p: '{spec}' names no A/B variant (known: all-off, default, cleanup, -PASS, +PASS, "
                         "step:N with PASS an optimisation pass of the default pipeline)")
    from passes import parse_pipeline

    parse_pipeline(spec, "-p")          # a bad pipeline string is a one-line error with its column
    return Variant(spec, "pipeline", ctx=(("pipeline", spec),))


@dataclass(frozen=True)
class Point:
    layer: str
    shape: Shape
    pipeline: str

    @property
    def case(self) -> Case:
        return Case(self.layer, self.shape)

    def axes(self) -> dict[str, Any]:
        s = self.shape
        return {"config": s.config, "tp": s.tp, "batch": s.batch, "seq": s.seq, **dict(s.params)}

    def label(self) -> str:
        return f"{self.case.label()} {self.pipeline}"

    def to_json(self) -> dict:
        return {"layer": self.layer, **self.axes(), "pipeline": self.pipeline}


@dataclass(frozen=True)
class Grid:
    layers: tuple[str, ...]
    configs: tuple[str, ...] = ("flash",)
    tps: tuple[int | None, ...] = (None,)              # None: the config's own
    batches: tuple[int | None, ...] = (None,)
    seqs: tuple[int | None, ...] = (None,)
    params: tuple[tuple[str, tuple[int, ...]], ...] = ()   # layer-parameter axes, e.g. (("max_context", (8192,)),)
    pipelines: tuple[str, ...] = DEFAULT_PIPELINES

    def points(self) -> tuple[list[Point], list[str]]:
        """(the points in grid order, a note per impossible shape left out). A parameter axis applies to the
        layers that take that parameter; the others get one point per shape for it."""
        from dspark_ir import layers

        for name, _values in self.params:
            if not any(name in layers.layer_params(layer) for layer in self.layers):
                takes = "; ".join(f"{layer}: {', '.join(layers.layer_params(layer)) or 'no parameters'}"
                                  for layer in self.layers)
                raise SweepError(f"--param {name}: none of the layers takes it ({takes})")
        for spec in self.pipelines:
            pipeline_variant(spec)
        points: list[Point] = []
        skipped: list[str] = []
        for layer in self.layers:
            own = layers.layer_params(layer)
            axes = [(name, values) for name, values in self.params if name in own]
            for config, tp, batch, seq in itertools.product(self.configs, self.tps, self.batches, self.seqs):
                try:
                    layers.resolve_config(config, tp, batch, seq)
                except DsparkError as e:
                    note = f"{layer} [{Shape(config, tp, batch, seq).label()}]: {e}"
                    if note not in skipped:
                        skipped.append(note)
                    continue
                for combo in itertools.product(*(values for _name, values in axes)):
                    shape = Shape(config, tp, batch, seq, tuple((n, v) for (n, _), v in zip(axes, combo)))
                    points += [Point(layer, shape, p) for p in self.pipelines]
        points = list(dict.fromkeys(points))
        if not points:
            raise SweepError("the grid has no possible point: " + ("; ".join(skipped) or "no layer given"))
        return points, skipped


# ---- the record of finished points -------------------------------------------------------------------------
class PointStore:
    """`<out>/points/<id>.json`, one per finished point, written atomically as each point finishes."""

    def __init__(self, out: OutputDir, identity: Mapping[str, Any]):
        self.out = out
        self.identity = dict(identity)

    def point_id(self, point: Point) -> str:
        text = json.dumps({"point": point.to_json(), **self.identity}, sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def path(self, point: Point) -> Path:
        return self.out.path(f"points/{self.point_id(point)}.json")

    def load(self, point: Point) -> dict | None:
        try:
            doc = json.loads(self.path(point).read_text())
        except (OSError, ValueError):
            return None
        if doc.get("point") != point.to_json() or doc.get("identity") != self.identity:
            return None
        return doc.get("result")

    def record(self, point: Point, result: Mapping[str, Any]) -> None:
        doc = {"schema": SCHEMA, "point": point.to_json(), "identity": self.identity, "result": dict(result)}
        self.out.write_text(f"points/{self.point_id(point)}.json", json.dumps(doc, indent=1, sort_keys=True) + "\n")


def identity(source: CostSource, params: ScheduleParams, stage: Sequence[str] | None) -> dict:
    """Everything besides the point that its numbers depend on (part of its record's name)."""
    doc = {"source": source.name, "schedule": asdict(params), "stage": list(stage) if stage else None}
    if isinstance(source, PyptoCosts):
        doc["cost_model"] = cost_model()
        doc["offline"] = source.offline
    return doc


# ---- one point's numbers ------------------------------------------------------------------------------------
def point_tasks(low: Lowered, stage: Sequence[str] | None) -> list[int]:
    if not stage:
        return [t.id for t in low.tg.tasks]
    return [t.id for t in stage_tasks(low.tg, stage)]


def point_result(point: Point, low: Lowered, source: CostSource, params: ScheduleParams,
                 stage: Sequence[str] | None, hw: Hardware = HARDWARE) -> dict:
    """The point's estimate: the layer (perf/estimate.py), or its stage scheduled alone (perf/ab.py)."""
    if not stage:
        est = estimate(low.tg, source, params, hw=hw, label=point.label())
        sched, costs, bound, kinds = est.schedule, est.schedule.costs, est.bound, est.sources()
    else:
        tasks = stage_tasks(low.tg, stage)
        if not tasks:
            raise SweepError(f"--stage {','.join(stage)}: no task of {point.label()} matches")
        costs = source.costs(low.tg, [t.id for t in tasks])
        sched = schedule(tasks, costs, params)
        work = Work()
        for t in tasks:
            work = work + task_work(low.tg.tasks[t.id])
        bound = chip_bound(work, hw)
        kinds = {}
        for t in tasks:
            if t.core != "none":
                kinds[costs[t.id].source] = kinds.get(costs[t.id].source, 0) + 1
    bound_us = bound.us()
    return {"latency_us": sched.makespan_us, "serial_us": sched.serial_us,
            "critical_us": sched.params.us(sched.critical), "bound_us": bound_us, "bound_limit": bound.limit,
            "ratio": sched.makespan_us / bound_us if bound_us > 0 else None, "tasks": len(sched.tasks),
            "kernels": sum(kinds.values()), "sources": dict(sorted(kinds.items())), "fired": low.fired,
            "nodes": low.graph_nodes}


# ---- the run ------------------------------------------------------------------------------------------------
@dataclass
class SweepReport:
    points: list[Point]
    results: dict[Point, dict]
    source: str
    params: ScheduleParams
    stage: tuple[str, ...] = ()
    skipped: list[str] = field(default_factory=list)
    resumed: int = 0                   # points loaded from an earlier run
    simulated: int = 0                 # kernels run through the cost model by this run
    cache_hits: int = 0                # kernel look-ups answered by the cost cache while planning
    cache_misses: int = 0              # kernel look-ups that needed a simulation
    notes: list[str] = field(default_factory=list)

    @property
    def incomplete(self) -> list[Point]:
        return [p for p in self.points if p not in self.results]

    def axes(self) -> dict[str, list]:
        """Every axis with its values in grid order (an axis a layer does not take counts once, as None)."""
        out: dict[str, list] = {}
        for p in self.points:
            for name, value in p.axes().items():
                values = out.setdefault(name, [])
                if value not in values:
                    values.append(value)
        return out

    def swept(self) -> list[str]:
        return [name for name, values in self.axes().items() if len([v for v in values if v is not None]) > 1]

    def delta_vs_off(self, p: Point) -> float | None:
        """Improvement of the point over the all-off point of its shape, % of the all-off latency."""
        off = self.results.get(Point(p.layer, p.shape, "all-off"))
        mine = self.results.get(p)
        if off is None or mine is None or not off["latency_us"]:
            return None
        return 100.0 * (off["latency_us"] - mine["latency_us"]) / off["latency_us"]

    def to_json(self) -> dict:
        return {"schema": SCHEMA, "source": self.source, "schedule": asdict(self.params),
                "stage": list(self.stage) or None, "axes": self.axes(), "swept": self.swept(),
                "points": [{"point": p.to_json(), "result": self.results.get(p), "delta_vs_off_pct":
                            self.delta_vs_off(p)} for p in self.points],
                "incomplete": [p.to_json() for p in self.incomplete], "skipped": self.skipped,
                "run": {"resumed": self.resumed, "simulated": self.simulated, "cache_hits": self.cache_hits,
                        "cache_misses": self.cache_misses}, "notes": self.notes}

    def markdown(self) -> str:
        scope = f"stage `{', '.join(self.stage)}` alone" if self.stage else "whole layer"
        lines = ["# dspark sweep: estimated latency over shapes × pipelines", "",
                 f"Cost source: **{self.source}**; {scope}; schedule model perf/schedule.py, dispatch "
                 f"{self.params.dispatch_cycles:g} cycles/task. Δ = improvement over all-off at the same shape "
                 "(positive = faster). Swept: " + (", ".join(self.swept()) or "nothing (one shape)") + ".", ""]
        lines += [f"- {n}" for n in self.notes]
        lines += [f"- left out (impossible shape): {s}" for s in self.skipped]
        if self.incomplete:
            lines.append(f"- **{len(self.incomplete)} points incomplete** (a kernel run timed out or crashed): "
                         "run the same command again to retry them")
        params = [n for n in self.axes() if n not in SHAPE_AXES]
        for layer in dict.fromkeys(p.layer for p in self.points):
            lines += ["", f"## {layer}", "",
                      "| config | TP | B | S | " + "".join(f"{n} | " for n in params) + "pipeline | latency µs | "
                      "serial µs | roofline µs | ratio | Δ vs all-off | tasks | kernels | pypto/roofline |",
                      "|---|---|---|---|" + "---|" * len(params) + "---|---|---|---|---|---|---|---|---|"]
            for p in (q for q in self.points if q.layer == layer):
                ax = p.axes()
                cells = [_cell(ax.get(n)) for n in (*SHAPE_AXES, *params)] + [f"`{p.pipeline}`"]
                r = self.results.get(p)
                if r is None:
                    cells += ["(incomplete)"] + ["–"] * 7
                else:
                    d = self.delta_vs_off(p)
                    src = r["sources"]
                    cells += [f"{r['latency_us']:.1f}", f"{r['serial_us']:.1f}", f"{r['bound_us']:.1f}",
                              "–" if r["ratio"] is None else f"{r['ratio']:.2f}",
                              "–" if d is None else f"{d:+.1f} %", str(r["tasks"]), str(r["kernels"]),
                              f"{src.get('pypto', 0)}/{src.get('roofline', 0)}"]
                lines.append("| " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"

    def plots(self, out_dir) -> list[str]:
        from .plots import sweep_plots

        return sweep_plots(self, out_dir)


def _cell(value) -> str:
    return "–" if value is None else str(value)


def run_sweep(points: Sequence[Point], source: CostSource, out: str | Path | OutputDir, *,
              params: ScheduleParams | None = None, stage: Sequence[str] | None = None, hw: Hardware = HARDWARE,
              progress: Any = None, skipped: Iterable[str] = ()) -> SweepReport:
    """Estimate every point not already recorded in `out`, recording each as it finishes. `progress(total)` makes
    a tqdm-like bar (update, set_postfix_str, close) over the points to estimate, or is None."""
    params = params or ScheduleParams()
    out = out if isinstance(out, OutputDir) else OutputDir(out)
    stage = tuple(stage or ())
    store = PointStore(out, identity(source, params, stage))
    report = SweepReport(list(points), {}, source.name, params, stage, list(skipped))
    pending = []
    for p in report.points:
        recorded = store.load(p)
        if recorded is None:
            pending.append(p)
        else:
            report.results[p] = recorded
    report.resumed = len(report.results)
    bar = progress(len(pending)) if progress is not None else None
    ran_before = source.ran if isinstance(source, PyptoCosts) else 0
    try:
        _Stream(pending, source, store, report, params, stage, hw, bar).run()
    finally:
        if bar is not None:
            bar.close()
    if isinstance(source, PyptoCosts):
        report.simulated = source.ran - ran_before
    return report


class _Stream:
    """The points to estimate, lowered one at a time as the executor asks for kernels (see the module doc)."""

    def __init__(self, points: list[Point], source: CostSource, store: PointStore, report: SweepReport,
                 params: ScheduleParams, stage: tuple[str, ...], hw: Hardware, progress):
        self.points, self.source, self.store, self.report = points, source, store, report
        self.params, self.stage, self.hw, self.progress = params, stage, hw, progress
        self.graphs: dict[Case, Any] = {}
        self.left = Counter(p.case for p in points)      # points of a case not lowered yet (then its graph goes)
        self.lowered: dict[Point, Lowered] = {}           # lowered, not finished
        self.need: dict[Point, set[str]] = {}             # kernel keys a point still waits for
        self.waiting: dict[str, list[Point]] = {}         # kernel key -> points waiting for it
        self.sent: set[str] = set()                       # kernel keys handed to the executor

    def run(self) -> None:
        source = self.source
        if isinstance(source, PyptoCosts) and not source.offline:
            source.simulate(self.kernels(), self.kernel_progress, self.stored)
        else:
            for p in self.points:
                self.lowered[p] = self.lower(p)
                self.finish(p)

    def lower(self, p: Point) -> Lowered:
        if p.case not in self.graphs:
            self.graphs[p.case] = p.case.build()
        graph = self.graphs[p.case]
        self.left[p.case] -= 1
        if not self.left[p.case]:
            del self.graphs[p.case]
        return lower_variant(graph, pipeline_variant(p.pipeline))

    def kernels(self) -> Iterator[tuple]:
        """(task, key, source) of every kernel the points need that is neither cached nor already handed over."""
        source = self.source
        for p in self.points:
            low = self.lowered[p] = self.lower(p)
            hits = source.hits
            _known, todo = source.plan(low.tg, point_tasks(low, self.stage))
            self.report.cache_hits += source.hits - hits
            self.report.cache_misses += len(todo)
            self.need[p] = {key for _i, key, _src in todo}
            for _i, key, _src in todo:      # all before the first yield: a kernel in flight may come back meanwhile
                self.waiting.setdefault(key, []).append(p)
            for i, key, src in todo:
                if key not in self.sent:
                    self.sent.add(key)
                    yield low.tg.tasks[i], key, src
            if not self.need[p] and p in self.lowered:   # all cached (or answered while its kernels were drawn)
                self.finish(p)

    def finish(self, p: Point) -> None:
        result = point_result(p, self.lowered.pop(p), self.source, self.params, self.stage or None, self.hw)
        self.store.record(p, result)
        self.report.results[p] = result
        if self.progress is not None:
            self.progress.update(1)

    def stored(self, key: str) -> None:
        for p in self.waiting.pop(key, []):
            self.need[p].discard(key)
            if not self.need[p]:
                self.finish(p)

    def kernel_progress(self, done: int, total: int) -> None:
        if self.progress is not None:
            self.progress.set_postfix_str(f"pypto {done}/{total} kernels so far, {len(self.points)} points")

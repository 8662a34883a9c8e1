"""Fit the chip schedule model's free constants to the training facts, and compare it to the chip's swimlane.

    facts = load_facts()                               # perf/calibration/facts.toml
    tasks, costs = swimlane_graph(facts, source)       # our HCA TP4 16x256 decode graph and its kernel costs
    fit = calibrate(facts, tasks, costs)               # constants, residuals (deterministic)
    fit.to_json(); swimlane_table(facts, tasks, costs, params)

Free constants (perf/schedule.py rules 6-8): H = `hop_cycles`, S = `kernel_start_cycles`, c =
`block_dispatch_cycles`, L = `launch_cycles`.
Everything else is the chip's (dspark_ir/hardware.py: dispatch D, cores, the AICPU's 3 dispatchers).

What each fact predicts under the model:
* swimlane makespan: the AICore makespan of our graph scheduled by the chip model (the graph of the captured
  code: HCA decode, default pipeline, the case's shape), vs 866.16 µs; its static critical path (the longest
  chain of tasks alone, no hops, no core limits: schedule rule 5) vs 591.32 µs;
* swimlane gaps: D + H + S + c before a kernel (a consumer's first block starts that long after its producer
  finishes: ready after D + H + S, then one block issue) vs the mean of the critical-path gaps before the
  chip's compute tasks, and D + H + c vs the mean of those before its signal tasks (waits, completes, retires:
  what rule 10 models as signal tasks). The model has one gap of each kind, so each is fitted to its mean, not
  to every gap: relative errors of single gaps would weigh a 0.2 µs gap like a 9.5 µs one; a zero gap is a
  repeat of one task back to back, its blocks issued while the previous one ran, and the one 30.76 µs wait is
  excluded by the facts file. (A facts file with one `hop_gaps_us` list compares its mean with D + H + c.);
* a launch probe of T tasks x B blocks (each block's own compute taken as zero): L + the model's makespan of
  that graph (a chain when `serial`, else T independent tasks);
* per-block dispatch of a B-block vector task: ceil(min(B, 48) / K) · c / B;
* per task (the one-to-one rows of the swimlane table): our scheduled span (first block start -> finish,
  summed over our tasks when a chip task maps to several; `measure = "window"`: from the first of our tasks'
  first block start to the last one's finish, for a chip window over several tasks) vs the chip's span;
* the seed cases of the corpus (perf/cases, `[fit] cases` names which): each side with a published absolute,
  its scope's makespan (`dspark ab --cases`' prediction) vs the published µs.
The loss is Σ weight_group · Σ (predicted / measured − 1)²; the per-task group is normalised by its size so that
it cannot drown the global facts. The fit is a deterministic grid search over (H, c, S), each point with its
best L, refined by halving (no random start, no library optimiser: scipy is not in the venv): the same facts
and costs give the same bits.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import math
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Mapping, Sequence

from dspark_ir.hardware import HARDWARE

try:
    import tomllib
except ModuleNotFoundError:      # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from .costs import KernelCost
from .schedule import CHIP_BLOCK_MODEL, FITTED, SchedTask, ScheduleParams, dispatched_blocks, sched_tasks, schedule

FACTS = Path(__file__).parent / "calibration" / "facts.toml"
RESULT = Path(__file__).parent / "calibration" / "result.json"
TOLERANCE = 0.25            # a task "matches" within ±25 %
# Search box (µs) of each free constant: (low, high, first step). SEARCH: the constants on the grid (L is searched
# per grid point: it only shifts the probes).
BOX = {"hop_cycles": (0.0, 12.0, 1.0), "block_dispatch_cycles": (0.0, 4.0, 0.5), "kernel_start_cycles": (0.0, 8.0, 1.0),
       "launch_cycles": (0.0, 150.0, 5.0)}
SEARCH = ("hop_cycles", "block_dispatch_cycles", "kernel_start_cycles")


class CalibrationError(ValueError):
    pass


def load_facts(path: str | Path = FACTS) -> dict:
    path = Path(path)
    try:
        facts = tomllib.loads(path.read_text())
    except OSError as e:
        raise CalibrationError(f"{path}: cannot read the facts file ({e.strerror})") from None
    except tomllib.TOMLDecodeError as e:
        raise CalibrationError(f"{path}: not TOML: {e}") from None
    for key in ("swimlane", "probe", "block_dispatch", "gaps", "fit"):
        if key not in facts:
            raise CalibrationError(f"{path}: missing [{key}]")
    return facts


# ---- the swimlane's graph ----------------------------------------------------------------------------
def swimlane_graph(facts: Mapping, source) -> tuple[list[SchedTask], dict[int, KernelCost]]:
    """Our task graph of the swimlane's case (the default pipeline less the swimlane's `disabled` passes: what
    the captured code had not) and its kernel costs from `source`."""
    from .ab import Case, Shape, Variant, lower_variant

    sw = facts["swimlane"]
    params = (("max_context", int(sw["max_context"])),) if sw.get("max_context") else ()
    g = Case(sw["layer"], Shape(sw["config"], int(sw["tp"]), int(sw["batch"]), int(sw["seq"]), params)).build()
    disabled = tuple(sw.get("disabled", ()))
    tg = lower_variant(g, Variant("default", "default", ctx=(("disabled", disabled),) if disabled else ())).tg
    return sched_tasks(tg), source.costs(tg)


@dataclass
class CaseSide:
    """One side (before | after) of a corpus case with a published absolute figure: its lowered graph and kernel
    costs (fixed during the fit), rescheduled under each candidate's parameters."""

    case: str
    side: str
    measured_us: float
    result: object          # perf.ab.VariantResult
    scope: tuple[str, ...]

    def predicted_us(self, params: ScheduleParams) -> float:
        from .trust import scope_latency

        return scope_latency(self.result, params, self.scope)

    def digest(self) -> str:
        return costs_digest(sched_tasks(self.result.tg), self.result.estimate.schedule.costs)


def corpus_sides(spec: str, source, base: ScheduleParams | None = None) -> list[CaseSide]:
    """The seed cases of the corpus (perf/cases, `spec` as `dspark ab --cases`) with published absolutes."""
    from .ab import Case
    from .cases import load_cases, predict_side

    base = base or ScheduleParams()
    out = []
    for case in load_cases(spec):
        if case.unsupported:
            continue
        wanted = [(side, pipe, us) for side, pipe, us in (("before", case.before, case.hw.before_us),
                                                           ("after", case.after, case.hw.after_us)) if us]
        if not wanted:
            continue
        g = Case(case.layer, case.shape).build()
        for side, pipe, us in wanted:
            r, _ = predict_side(g, case, pipe, source, base)
            out.append(CaseSide(case.name, side, float(us), r, tuple(case.scope)))
    return out


def costs_digest(tasks: Sequence[SchedTask], costs: Mapping[int, KernelCost]) -> str:
    """A digest of the graph and costs a fit used (the fit reproduces bit for bit when this does)."""
    rows = [[t.name, t.core, t.blocks, list(t.deps), costs[t.id].source, costs[t.id].span, costs[t.id].work_cube,
             costs[t.id].work_vector] for t in tasks]
    return hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class TaskRow:
    chip: str
    ours: list[str]
    span_us: float
    predicted_us: float | None
    one_to_one: bool
    sources: list[str]
    note: str

    @property
    def ratio(self) -> float | None:
        return self.predicted_us / self.span_us if self.predicted_us is not None and self.span_us else None

    @property
    def within(self) -> bool:
        return self.ratio is not None and abs(self.ratio - 1) <= TOLERANCE


def task_rows(facts: Mapping, tasks: Sequence[SchedTask], costs: Mapping[int, KernelCost],
              params: ScheduleParams) -> tuple[list[TaskRow], float]:
    """The swimlane table's rows under `params`, and our makespan (µs)."""
    sched = schedule(tasks, costs, params)
    by_name = {t.name: t.id for t in tasks}
    rows = []
    for entry in facts["swimlane"].get("task", []):
        ours = list(entry.get("ours", []))
        unknown = [n for n in ours if n not in by_name]
        if unknown:
            raise CalibrationError(f"facts: swimlane task '{entry['chip']}' maps to '{unknown[0]}', "
                                   "which our graph does not have")
        pred = None
        runs = [sched.runs[by_name[n]] for n in ours]
        if runs and entry.get("measure", "sum") == "window":
            pred = params.us(max(r.finish for r in runs) - min(r.start for r in runs))
        elif runs:     # task spans, as the chip's rows: the gaps before rule 10's signal tasks left out
            pred = sum(params.us(r.finish - r.start - r.gaps) for r in runs)
        rows.append(TaskRow(entry["chip"], ours, float(entry["span_us"]), pred,
                            bool(entry.get("one_to_one", True)) and bool(ours),
                            [costs[by_name[n]].source for n in ours], entry.get("note", "")))
    return rows, sched.makespan_us


# ---- the model's predictions of each fact ---------------------------------------------------------------
def probe_us(probe: Mapping, params: ScheduleParams) -> float:
    """L + the makespan of T tasks x B vector blocks of zero compute (a chain when `serial`)."""
    n, b = int(probe["tasks"]), int(probe["blocks"])
    tasks = [SchedTask(i, f"probe{i}", "vector", b, (i - 1,) if probe["serial"] and i else ()) for i in range(n)]
    zero = KernelCost("given", 0.0)
    s = schedule(tasks, {i: zero for i in range(n)}, params)
    return s.call_us


def block_dispatch_us(blocks: int, params: ScheduleParams) -> float:
    k = max(params.dispatchers, 1)
    issued = dispatched_blocks(SchedTask(0, "block dispatch", "vector", blocks), params)
    return params.us(math.ceil(issued / k) * params.block_dispatch_cycles) / blocks


def gap_us(params: ScheduleParams, kernel: bool = False) -> float:
    """The model's producer -> consumer gap (rule 6 + one block issue, rule 7), before a kernel or before a task
    with nothing to run (a signal task)."""
    start = params.kernel_start_cycles if kernel else 0.0
    return params.us(params.dispatch_cycles + params.hop_cycles + start + params.block_dispatch_cycles)


def _mean_positive(gaps) -> tuple[int, float]:
    waits = [float(g) for g in gaps if g > 0]
    return len(waits), (sum(waits) / len(waits) if waits else 0.0)


@dataclass
class Residual:
    group: str
    name: str
    measured: float
    predicted: float

    @property
    def error(self) -> float:
        return self.predicted / self.measured - 1 if self.measured else 0.0

    def to_json(self) -> dict:
        return {"group": self.group, "fact": self.name, "measured_us": self.measured,
                "predicted_us": round(self.predicted, 4), "error_pct": round(100 * self.error, 2)}


def residuals(facts: Mapping, tasks: Sequence[SchedTask], costs: Mapping[int, KernelCost],
              params: ScheduleParams, cases: Sequence[CaseSide] = ()) -> list[Residual]:
    out = []
    rows, makespan = task_rows(facts, tasks, costs, params) if tasks else ([], None)
    if makespan is not None:
        out.append(Residual("swimlane_makespan", "AICore makespan", float(facts["swimlane"]["makespan_us"]),
                            makespan))
        if "static_critical_us" in facts["swimlane"]:
            out.append(Residual("swimlane_static_critical", "static critical path (infinite cores)",
                                float(facts["swimlane"]["static_critical_us"]),
                                params.us(schedule(tasks, costs, params).critical)))
    gaps = facts["gaps"]
    for key, what, kernel in (("kernel_gaps_us", "gaps before a compute task", True),
                              ("signal_gaps_us", "gaps before a signal task", False),
                              ("hop_gaps_us", "producer -> consumer gaps", False)):
        n, mean = _mean_positive(gaps.get(key, ()))
        if n:
            out.append(Residual("swimlane_gaps", f"mean of {n} {what}", mean, gap_us(params, kernel)))
    for p in facts["probe"]:
        out.append(Residual("probes", p["name"], float(p["us"]), probe_us(p, params)))
    for d in facts["block_dispatch"]:
        out.append(Residual("block_dispatch", f"{d['blocks']}-block task, per block", float(d["us_per_block"]),
                            block_dispatch_us(int(d["blocks"]), params)))
    for r in rows:
        if r.one_to_one and r.predicted_us is not None:
            out.append(Residual("tasks", r.chip, r.span_us, r.predicted_us))
    for c in cases:
        out.append(Residual("cases", f"{c.case} {c.side}", c.measured_us, c.predicted_us(params)))
    return out


def loss(res: Sequence[Residual], weights: Mapping[str, float]) -> float:
    groups: dict[str, list[float]] = {}
    for r in res:
        groups.setdefault(r.group, []).append(r.error ** 2)
    total = 0.0
    for g, errs in sorted(groups.items()):
        w = float(weights.get(g, 0.0))
        total += w * (sum(errs) / len(errs) if g in ("tasks", "cases") else sum(errs))
    return total


# ---- the fit ---------------------------------------------------------------------------------------
@dataclass
class Fit:
    params: ScheduleParams
    residuals: list[Residual]
    loss: float
    evaluations: int
    digest: str

    def to_json(self) -> dict:
        p = self.params
        sources = {"hop_cycles": "fitted: the swimlane's gaps before its signal tasks, its makespan, the serial "
                                 "launch probes",
                   "kernel_start_cycles": "fitted: the swimlane's gaps before its compute tasks (against those "
                                          "before its signal tasks and the empty probe tasks), its makespan",
                   "block_dispatch_cycles": "fitted: per-block dispatch (48 / 32 blocks), parallel probes, "
                                            "swimlane makespan and task spans",
                   "launch_cycles": "fitted: the launch probes (1 x 1 = 79.7 µs and the others)"}
        constants = {k: {"value": getattr(p, k), "us": round(p.us(getattr(p, k)), 4), "unit": "cycles",
                         "source": sources[k]} for k in FITTED}
        fixed = {"dispatch_cycles": [p.dispatch_cycles, "dspark_ir/hardware.py (pypto's AICPU charges)"],
                 "dispatchers": [p.dispatchers, "dspark_ir/hardware.py (the AICPU's 3 scheduler threads)"],
                 "clock_hz": [p.clock_hz, "dspark_ir/hardware.py"], "block_model": [p.block_model, "rule 2/chip"],
                 "block_issue": [p.block_issue, "rule 7 (dspark calibrate --block-issue; the chip model runs under "
                                                "the rule fitted)"],
                 "early_dispatch": [p.early_dispatch, "rule 9, pypto-lib docs/debug-and-tune/dependency-and-"
                                                      "scheduling.md (dspark calibrate --early-dispatch on|off)"],
                 "cross_rank": [p.cross_rank, "rule 10: the collectives' declared steps (dspark_ir/ops/collective.py), "
                                              "the link of dspark_ir/hardware.py (dspark calibrate --cross-rank "
                                              "on|off)"]}
        return {"schema": "dspark-calibration/1", "constants": constants,
                "fixed": {k: {"value": v, "source": s} for k, (v, s) in fixed.items()},
                "loss": round(self.loss, 8), "evaluations": self.evaluations, "inputs_digest": self.digest,
                "residuals": [r.to_json() for r in self.residuals]}


def calibrate(facts: Mapping, tasks: Sequence[SchedTask], costs: Mapping[int, KernelCost],
              base: ScheduleParams | None = None, rounds: int = 6, cases: Sequence[CaseSide] = (),
              progress: Callable[[], None] | None = None) -> Fit:
    """Grid search over the SEARCH constants in BOX, each point with its best L (L only shifts the probes, so it is
    searched on the residuals of one schedule run), then `rounds` refinements of the grid around the best point
    with the steps halved: deterministic, no random start. `progress` is called after each evaluation."""
    base = base or ScheduleParams(block_model=CHIP_BLOCK_MODEL, dispatchers=HARDWARE.aicpu_schedulers, name="chip")
    weights = facts["fit"]
    evaluations = 0

    def at(point: Sequence[float], launch: float) -> ScheduleParams:
        values = dict(zip(SEARCH, point), launch_cycles=launch)
        return replace(base, **{k: HARDWARE.cycles(v * 1e-6) for k, v in values.items()})

    def best_launch(point: tuple[float, ...]) -> tuple[float, float]:
        """(loss, L) with the best L for this point: probes re-priced by L alone, the rest fixed."""
        nonlocal evaluations
        evaluations += 1
        res = residuals(facts, tasks, costs, at(point, 0.0), cases)
        if progress is not None:
            progress()
        lo, hi, step = BOX["launch_cycles"]
        best = (math.inf, lo)
        for r in range(rounds + 2):
            centre = best[1]
            grid = ([lo + i * step for i in range(int(round((hi - lo) / step)) + 1)] if r == 0 else
                    [min(hi, max(lo, centre + i * step)) for i in range(-4, 5)])
            for launch in grid:
                shifted = [replace(x, predicted=x.predicted + launch) if x.group == "probes" else x for x in res]
                value = loss(shifted, weights)
                if value < best[0] - 1e-15 or (value == best[0] and launch < best[1]):
                    best = (value, round(launch, 9))
            step /= 2
        return best

    steps = [BOX[k][2] for k in SEARCH]
    grids = [[BOX[k][0] + i * BOX[k][2] for i in range(int(round((BOX[k][1] - BOX[k][0]) / BOX[k][2])) + 1)]
             for k in SEARCH]
    seen: dict[tuple[float, ...], tuple[float, float]] = {}
    best: tuple[float, tuple[float, ...], float] = (math.inf, tuple(0.0 for _ in SEARCH), 0.0)
    for _ in range(rounds + 1):
        for point in itertools.product(*grids):
            key = tuple(round(v, 9) for v in point)
            if key not in seen:
                seen[key] = best_launch(key)
            value, launch = seen[key]
            if value < best[0] - 1e-15:
                best = (value, key, launch)
        steps = [step / 2 for step in steps]
        grids = [[min(BOX[k][1], max(BOX[k][0], centre + i * step)) for i in range(-2, 3)]
                 for k, centre, step in zip(SEARCH, best[1], steps)]
    params = at(best[1], best[2])
    digest = costs_digest(tasks, costs)
    if cases:
        parts = [digest] + [c.digest() for c in cases]
        digest = hashlib.sha256(" ".join(parts).encode()).hexdigest()[:16]
    return Fit(params, residuals(facts, tasks, costs, params, cases), best[0], evaluations, digest)


# ---- text --------------------------------------------------------------------------------------------
def swimlane_table(facts: Mapping, tasks: Sequence[SchedTask], costs: Mapping[int, KernelCost],
                   params: ScheduleParams) -> tuple[str, dict]:
    rows, makespan = task_rows(facts, tasks, costs, params)
    lines = [f"Per task vs the chip's swimlane ({facts['swimlane']['source']}), schedule model '{params.name}':", "",
             "| chip task | ours | chip µs | predicted µs | ratio | ±25 % | cost source |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        ratio = f"{r.ratio:.2f}" if r.ratio is not None else "–"
        ok = ("yes" if r.within else "no") if r.one_to_one else "(not 1:1)"
        pred = f"{r.predicted_us:.2f}" if r.predicted_us is not None else "–"
        lines.append(f"| {r.chip} | {', '.join(r.ours) or '–'} | {r.span_us:.2f} | {pred} | {ratio} | {ok} | "
                     f"{'/'.join(sorted(set(r.sources))) or '–'} |")
    one = [r for r in rows if r.one_to_one]
    hit = sum(r.within for r in one)
    chip = float(facts["swimlane"]["makespan_us"])
    lines += ["", f"{hit} of {len(one)} one-to-one tasks within ±25 %; makespan {makespan:.1f} vs {chip:.2f} µs "
              f"(ratio {makespan / chip:.2f})"]
    summary = {"model": params.name, "within": hit, "one_to_one": len(one), "makespan_us": round(makespan, 2),
               "chip_makespan_us": chip, "makespan_ratio": round(makespan / chip, 4)}
    return "\n".join(lines), summary


def residual_table(fit: Fit) -> str:
    lines = ["| group | fact | measured µs | predicted µs | error |", "|---|---|---|---|---|"]
    for r in fit.residuals:
        lines.append(f"| {r.group} | {r.name} | {r.measured:g} | {r.predicted:.2f} | {100 * r.error:+.1f} % |")
    return "\n".join(lines)


def write_result(fit: Fit, summaries: Sequence[dict], path: str | Path = RESULT) -> str:
    d = fit.to_json()
    d["swimlane"] = list(summaries)
    text = json.dumps(d, indent=1, sort_keys=True, ensure_ascii=False) + "\n"
    Path(path).write_text(text)
    return text



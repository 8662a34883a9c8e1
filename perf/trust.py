"""Trust flags: when an estimated Δ between two variants should not be believed at face value.

    t = trust(ref, var, params, globs=())     # two VariantResults (perf/ab.py), optionally one stage of them
    t.flags                                   # ("F", "R", "B", "I", "L") subset, next to the Δ; LEGEND explains

A Δ is the improvement of `var` over `ref` in % of `ref` (positive = faster), over the whole layer or over the
tasks matching `globs` scheduled alone (perf/ab.py `stage_tasks`). It is flagged
  F  when it depends on a kernel more than FAR_RATIO× over its chip roofline: with every such cost-model kernel
     replaced by its blocked roofline in both variants (`far_at_roofline`), the Δ moves by more than TOLERANCE
     points or changes sign;
  R  when it comes mostly from roofline-only tasks (collectives, kernels without a pypto template, failed
     simulations): at least ROOFLINE_SHARE of the summed per-task change of alone time is on such tasks;
  B  when its sign flips under any other block model (`work`, `span`, `grid`: perf/schedule.py rule 2);
  I  when its sign flips under the other block-issue rule (`cores` | `grid`: perf/schedule.py rule 7, which
     blocks of a grid wider than its cores the AICPU's dispatchers pay for; only with block dispatch on). The
     corpus's facts do not decide between the two (docs/seed-baselines.md, "HCA sparse-attention stage"), so a
     Δ whose sign rests on one of them says so;
  L  when its sign flips with no collective's link transfer overlapping its local part (perf/schedule.py rule 10,
     `link_overlap = False`: the transfers of pushes and fused publishes add to their local parts instead).
A Δ within ±FLAT points has no sign (a flip needs two signed Δs).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from .costs import KernelCost, roofline_cost
from .schedule import BLOCK_ISSUE, BLOCK_MODELS, CALIBRATION, ScheduleParams, sched_tasks, schedule

FAR_RATIO = 10.0        # a cost-model kernel this many times over its chip roofline is "far" from it
TOLERANCE = 5.0         # points of Δ: the corpus's acceptance band (perf/cases.py)
ROOFLINE_SHARE = 0.5    # "mostly": at least half of the per-task change
FLAT = 0.5              # points: a Δ this small has no sign

LEGEND = {
    "F": f"the Δ depends on a kernel > {FAR_RATIO:g}× over its roofline (with those kernels at their roofline in "
         f"both variants it moves > {TOLERANCE:g} points or changes sign)",
    "R": f"the Δ comes mostly (≥ {100 * ROOFLINE_SHARE:.0f} % of the per-task change) from roofline-only tasks "
         "(collectives, untemplated kernels): lower bounds, not simulations",
    "B": "the sign of the Δ flips under another block model (`work`, `span`, `grid`)",
    "I": "the sign of the Δ flips under the other block-issue rule (schedule rule 7: `cores` | `grid`)",
    "L": "the sign of the Δ flips when no collective's link transfer overlaps its local part (schedule rule 10's "
         "`overlap` read as `before`)",
}


@dataclass
class Trust:
    delta: float | None                    # improvement %, our model
    flags: tuple[str, ...] = ()
    detail: dict[str, Any] = field(default_factory=dict)

    def mark(self) -> str:
        """' [F,R]' to append to the Δ it qualifies, '' when nothing is flagged."""
        return f" [{','.join(self.flags)}]" if self.flags else ""

    def to_json(self) -> dict:
        return {"delta_pct": self.delta, "flags": list(self.flags), **self.detail}


def other_block_models(params: ScheduleParams) -> tuple[str, ...]:
    """The block models a Δ is checked against (flag B): every one but `params`'."""
    return tuple(m for m in BLOCK_MODELS if m != params.block_model)


def other_block_issue(params: ScheduleParams) -> str | None:
    """The block-issue rule a Δ is checked against (flag I): the one `params` does not use; None without block
    dispatch (the rule then changes nothing)."""
    if params.dispatchers <= 0 or params.block_dispatch_cycles <= 0:
        return None
    return next(r for r in BLOCK_ISSUE if r != params.block_issue)


def improvement(ref: float, var: float) -> float | None:
    return 100.0 * (ref - var) / ref if ref else None


def sign(delta: float | None) -> int:
    if delta is None or abs(delta) <= FLAT:
        return 0
    return 1 if delta > 0 else -1


def flips(a: float | None, b: float | None) -> bool:
    return sign(a) * sign(b) < 0


def scope_latency(r, params: ScheduleParams, globs: Sequence[str] = (),
                  costs: dict[int, KernelCost] | None = None) -> float:
    """Makespan µs of a VariantResult's tasks (those matching `globs` scheduled alone, else all) under `costs`
    (default: its own) and `params`."""
    from .ab import stage_tasks

    tasks = stage_tasks(r.tg, globs) if globs else sched_tasks(r.tg)
    if not tasks:
        return 0.0
    return schedule(tasks, costs if costs is not None else r.estimate.schedule.costs, params).makespan_us


def far_at_roofline(r, ratio: float = FAR_RATIO) -> tuple[dict[int, KernelCost], set[str]]:
    """Costs with every pypto-sourced kernel whose alone time exceeds `ratio` × its chip roofline replaced by
    its blocked roofline estimate, and the ops of those kernels: a what-if that shows how much of a layer those
    kernels hold back."""
    costs = dict(r.estimate.schedule.costs)
    far: set[str] = set()
    for row in r.estimate.rows:
        far_off = row.ratio > ratio if row.ratio is not None else row.alone_us > 0   # no bound: a no-op on device
        if row.source == "pypto" and far_off:
            costs[row.id] = roofline_cost(r.tg.tasks[row.id], note="what-if")
            far.add(row.op)
    return costs, far


def in_scope(r, globs: Sequence[str]) -> set[int]:
    from .ab import stage_tasks

    return {t.id for t in (stage_tasks(r.tg, globs) if globs else sched_tasks(r.tg))}


def roofline_share(ref, var, globs: Sequence[str] = ()) -> tuple[float, float]:
    """(share, total µs): the fraction of Σ|per-task change of alone time| (tasks matched by name; a task in one
    variant only counts its whole alone time) that is on roofline-sourced tasks (either side), and that sum."""
    def rows(r):
        ids = in_scope(r, globs)
        return {row.name: row for row in r.estimate.rows if row.id in ids and row.core != "none"}

    a, b = rows(ref), rows(var)
    total = roof = 0.0
    for name in sorted(a.keys() | b.keys()):     # a fixed order: the float sum is the same in every run
        ra, rb = a.get(name), b.get(name)
        change = abs((rb.alone_us if rb else 0.0) - (ra.alone_us if ra else 0.0))
        total += change
        if any(x is not None and x.source == "roofline" for x in (ra, rb)):
            roof += change
    return (roof / total if total else 0.0), total


def trust(ref, var, params: ScheduleParams, globs: Sequence[str] = (), *,
          ref_latency: float | None = None, var_latency: float | None = None) -> Trust:
    """The flags of `var`'s Δ over `ref` (module docstring)."""
    lr = ref_latency if ref_latency is not None else scope_latency(ref, params, globs)
    lv = var_latency if var_latency is not None else scope_latency(var, params, globs)
    delta = improvement(lr, lv)
    d_block = {}
    for model in other_block_models(params):
        other = replace(params, block_model=model)
        d_block[model] = improvement(scope_latency(ref, other, globs), scope_latency(var, other, globs))
    (c_ref, far_ref), (c_var, far_var) = far_at_roofline(ref), far_at_roofline(var)
    d_far = improvement(scope_latency(ref, params, globs, c_ref), scope_latency(var, params, globs, c_var))
    share, changed = roofline_share(ref, var, globs)
    flags = []
    far_moves = d_far is not None and delta is not None and (abs(d_far - delta) > TOLERANCE or flips(delta, d_far))
    if far_moves:
        flags.append("F")
    if changed > 0 and share >= ROOFLINE_SHARE:
        flags.append("R")
    if any(flips(delta, d) for d in d_block.values()):
        flags.append("B")
    d_issue = None
    issue = other_block_issue(params)
    if issue is not None:
        other = replace(params, block_issue=issue)
        d_issue = improvement(scope_latency(ref, other, globs), scope_latency(var, other, globs))
        if flips(delta, d_issue):
            flags.append("I")
    d_link = None
    if params.cross_rank:
        serial = replace(params, link_overlap=False)
        d_link = improvement(scope_latency(ref, serial, globs), scope_latency(var, serial, globs))
        if flips(delta, d_link):
            flags.append("L")
    return Trust(delta, tuple(flags), {"delta_other_block_models_pct": d_block,
                                       "delta_other_block_issue_pct": {issue: d_issue} if issue else {},
                                       "delta_link_serial_pct": d_link,
                                       "delta_far_at_roofline_pct": d_far,
                                       "far_kernels": sorted(far_ref | far_var), "roofline_share": share,
                                       "changed_alone_us": changed})


# ---- how far the chip model's figures have been from the chip ----------------------------------------------
@dataclass(frozen=True)
class MeasuredDelta:
    """One published before → after measurement as the committed fit reproduces it, judged by the corpus's own
    sign rule (perf/cases.py `verdict`)."""
    name: str
    chip_pct: float          # Δ = (after − before) / before, negative = faster (perf/cases.py `change`)
    predicted_pct: float
    sign_right: bool

    @property
    def error_pts(self) -> float:
        return self.predicted_pct - self.chip_pct


@dataclass(frozen=True)
class Validation:
    """The committed fit's residuals on its training facts (perf/calibration/result.json): the seed cases' Δs and
    the swimlane's per-task rows. Training data, not a held-out test: a lower bound on how wrong a Δ can be."""
    deltas: tuple[MeasuredDelta, ...]
    tasks_within: int                           # the fit's own count (`dspark calibrate`'s swimlane table)
    tasks: int
    tolerance_pct: float                        # "within" for a task (perf/calibrate.py TOLERANCE)
    task_errors_pct: tuple[float, float]        # (most under, most over)
    makespan_ratio: float | None
    committed: bool                             # the run's schedule parameters are the fitted ones

    def worst_miss_pts(self) -> float:
        return max((abs(d.error_pts) for d in self.deltas), default=0.0)

    def markdown(self) -> list[str]:
        worst = self.worst_miss_pts()
        out = ["## How far to believe a Δ", "",
               "The chip model's constants were fitted (`dspark calibrate`, perf/calibration/result.json) to one "
               "HCA swimlane, launch probes and the seed PRs' measurements. On those same facts (its training "
               "data, so a lower bound on its error) it reads:", "",
               "| seed measurement | chip Δ | predicted Δ | error | sign |", "|---|---|---|---|---|"]
        out += [f"| {d.name} | {d.chip_pct:+.1f} % | {d.predicted_pct:+.1f} % | {d.error_pts:+.1f} pts | "
                f"{'right' if d.sign_right else '**wrong**'} |" for d in self.deltas]
        lo, hi = self.task_errors_pct
        span = f"; makespan {self.makespan_ratio:.2f}× the chip's" if self.makespan_ratio is not None else ""
        out += ["", f"- Per task (the swimlane's one-to-one rows): {self.tasks_within} of {self.tasks} within "
                    f"±{self.tolerance_pct:g} % (errors {lo:+.0f} … {hi:+.0f} %){span}.",
                f"- So a Δ within ±{worst:.1f} points (the largest miss above) is inside what this model has got "
                "wrong on a published measurement, flagged or not; perf/README.md, \"Limits of the estimate\", says "
                "why."]
        if not self.committed:
            out.append("- These are the committed constants' and rules' figures; this run changes some of them "
                       "(its model line above), so they bound it less well.")
        return out

    def summary(self) -> str:
        wrong = sum(not d.sign_right for d in self.deltas)
        return (f"model check (perf/calibration/result.json, training facts): seed Δs off by up to "
                f"{self.worst_miss_pts():.1f} points, {wrong} of {len(self.deltas)} signs wrong; "
                f"{self.tasks_within} of {self.tasks} swimlane tasks within ±{self.tolerance_pct:g} %")

    def to_json(self) -> dict:
        return {"source": "perf/calibration/result.json", "committed": self.committed,
                "deltas": [{"name": d.name, "chip_pct": d.chip_pct, "predicted_pct": d.predicted_pct,
                            "error_pts": d.error_pts, "sign_right": d.sign_right} for d in self.deltas],
                "tasks_within": self.tasks_within, "tasks": self.tasks, "tolerance_pct": self.tolerance_pct,
                "task_errors_pct": list(self.task_errors_pct), "makespan_ratio": self.makespan_ratio}


def validation(params: ScheduleParams, path: Path = CALIBRATION) -> Validation | None:
    """The committed fit's residuals for a run under `params`; None for a model without a fit (legacy) or
    without a result file."""
    from .calibrate import TOLERANCE
    from .cases import Measured, change, verdict  # cases imports this module: its rules, read at call time

    if params.name != "chip" or not path.is_file():
        return None
    record = json.loads(path.read_text())
    sides: dict[str, dict[str, dict]] = {}
    for r in record.get("residuals", []):
        if r["group"] == "cases":
            name, side = r["fact"].rsplit(" ", 1)
            sides.setdefault(name, {})[side] = r
    deltas = []
    for name, s in sides.items():
        if {"before", "after"} <= s.keys():
            chip = Measured(s["before"]["measured_us"], s["after"]["measured_us"])
            before, after = s["before"]["predicted_us"], s["after"]["predicted_us"]
            deltas.append(MeasuredDelta(name, chip.delta, change(before, after),
                                        bool(verdict(chip, before, after)["sign"])))
    errors = [r["error_pct"] for r in record.get("residuals", []) if r["group"] == "tasks"]
    lane = next((s for s in record.get("swimlane", []) if s.get("model") == "chip"), {})
    return Validation(tuple(deltas), lane.get("within", 0), lane.get("one_to_one", 0), 100 * TOLERANCE,
                      (min(errors, default=0.0), max(errors, default=0.0)), lane.get("makespan_ratio"),
                      params == ScheduleParams.chip())

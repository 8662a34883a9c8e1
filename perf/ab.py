"""The pass A/B matrix: estimated layer latency with all passes on, all off, leave-one-out and add-one-in.

    report = run_ab([Case("decode-swa", Shape("flash", tp=4, batch=16, seq=8))], PyptoCosts())
    report.markdown(), report.to_json(), report.plots(out_dir)

Variants of one case (a layer at one shape), each a PassContext over the default pipeline:
  all-off     every pass disabled: the layer exactly as the builder makes it (the seed's before form)
  default     the default pipeline
  cleanup     only canonicalize, cse and dce
  seed-only   the default pipeline without the passes no seed PR made (NOT_FROM_SEEDS)
  -X          the default pipeline without pass X (leave-one-out)
  +X          canonicalize, cse, X, dce (add-one-in: X with the cleanups that let its rewrite show)
  step:N      the first N passes of the default pipeline, plus dce (the waterfall's cumulative steps)
Every variant is lowered and estimated with the same cost source (perf/estimate.py). Δ% are
improvements: (reference − variant) / reference, against all-off and against default.
"fired" lists the passes that changed the graph in that variant.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from fnmatch import fnmatchcase
from functools import cached_property
from typing import Any, Callable, Mapping, Sequence

from .costs import CostSource
from .estimate import LayerEstimate, estimate, kernel_table
from .schedule import ScheduleParams, sched_tasks, schedule
from .trust import FAR_RATIO as WHAT_IF_RATIO
from .trust import LEGEND, Trust, Validation, far_at_roofline, other_block_models, trust, validation

CLEANUP = ("canonicalize", "cse", "dce")
# Passes of the default pipeline that no seed PR made (README "Passes": later pypto-lib grids and rewrites, and a
# traffic model's tiles). The seed-only pipeline is the default without them; its gain is reported beside the default's.
NOT_FROM_SEEDS = ("tile-choice", "pool-fanout", "quant-workers", "dequant-workers", "hca-raw-kv-no-transpose",
                  "fuse-mix-x-rms-norm", "raw-kv-gather-per-request", "hca-attn-workers", "o-dequant-workers")

# The stage each seed PR benchmarked in isolation (task-name globs; deps from outside the stage count as met at
# time 0): HCA's published −29.7 % is the TP4-shaped sparse attention alone (stages 8a–8i of the seed's layer);
# SWA's and CSA's figures are whole-layer decode, so their stage is the sparse attention for comparison only.
STAGES: dict[str, tuple[str, tuple[str, ...]]] = {
    "decode-hca": ("sparse attention", ("hca.hca_gather_kv", "hca.hca_raw_*", "hca.rope_swap", "hca.rope_cs",
                                        "hca.hca_cmp_*", "hca.hca_stream_*")),
    "decode-swa": ("sparse attention", ("swa.swa_gather_kv", "swa.qk_pv", "swa.rope_cs", "swa.merge_norm")),
    "decode-csa": ("sparse attention", ("csa.csa_slots_build_valid_qk_plan", "csa.qk_pv", "csa.rope_cs",
                                        "csa.merge_norm")),
}


@dataclass(frozen=True)
class Shape:
    config: str = "flash"
    tp: int | None = None
    batch: int | None = None
    seq: int | None = None
    params: tuple[tuple[str, Any], ...] = ()   # layer parameters, e.g. (("max_context", 256),)

    def label(self) -> str:
        parts = [self.config]
        parts += [f"{k}={v}" for k, v in (("TP", self.tp), ("B", self.batch), ("S", self.seq)) if v is not None]
        parts += [f"{k}={v}" for k, v in self.params]
        return " ".join(parts)


@dataclass(frozen=True)
class Case:
    layer: str                      # a layer name, or the file name of a .dsir graph (`path`)
    shape: Shape = Shape()
    path: str = ""                  # a .dsir file: its entry graph, as written (the shape does not apply)

    def label(self) -> str:
        return self.layer if self.path else f"{self.layer} [{self.shape.label()}]"

    def build(self):
        if self.path:
            from dspark_ir import parse_file

            return parse_file(self.path).entry
        from dspark_ir import layers

        s = self.shape
        return layers.build(self.layer, config=s.config, tp=s.tp, batch=s.batch, seq=s.seq, **dict(s.params))

    @staticmethod
    def of_file(path: str) -> "Case":
        import os

        return Case(os.path.basename(path), path=path)


@dataclass(frozen=True)
class Variant:
    name: str
    kind: str                       # off | none | default | cleanup | seed | loo | aoi | step | case | pipeline
    pass_name: str = ""
    ctx: tuple[tuple[str, Any], ...] = ()

    def context(self):
        from passes import PassContext

        kw = {k: (dict(v) if k == "options" else list(v) if isinstance(v, tuple) else v) for k, v in self.ctx}
        return PassContext(use_env=False, verify_each=False, **kw)

    def toggled(self, toggles: "Toggles") -> "Variant":
        """This variant with the toggles of the command line added (all-off stays all off). An --enable of a
        pass this variant disables (its leave-one-out) is dropped for it."""
        if self.kind in ("off", "none") or not toggles:
            return self
        ctx = dict(self.ctx)
        own_off = set(ctx.get("disabled", ()))
        enabled = tuple(e for e in toggles.enabled if e.split("{", 1)[0].strip() not in own_off)
        ctx["enabled"] = tuple(ctx.get("enabled", ())) + enabled
        ctx["disabled"] = tuple(ctx.get("disabled", ())) + tuple(toggles.disabled)
        if toggles.only:
            ctx["only"] = tuple(ctx.get("only", ())) + tuple(toggles.only)
        if toggles.options:
            ctx["options"] = tuple(toggles.options)
        return replace(self, ctx=tuple((k, v) for k, v in ctx.items() if v != ()))


@dataclass(frozen=True)
class Toggles:
    """Pass toggles of the command line applied to every variant (`dspark ab --enable X --pass-option 'p{k=v}'`)."""

    enabled: tuple[str, ...] = ()
    disabled: tuple[str, ...] = ()
    only: tuple[str, ...] = ()
    options: tuple[tuple[str, Any], ...] = ()     # (pass, {option: value}) pairs

    def __bool__(self) -> bool:
        return bool(self.enabled or self.disabled or self.only or self.options)


def pipeline_names() -> list[str]:
    """Pass names of the default pipeline (entries on by default), in order."""
    from passes import DEFAULT_PIPELINE, parse_entries

    return [parse_entries(e.spec, "default pipeline")[0].name for e in DEFAULT_PIPELINE if e.enabled]


def optimisation_passes() -> list[str]:
    return [n for n in pipeline_names() if n not in CLEANUP]


def all_off() -> Variant:
    return Variant("all-off", "off", ctx=(("disabled", tuple(pipeline_names())),))


def seed_only() -> Variant:
    return Variant("seed-only", "seed", ctx=(("disabled", NOT_FROM_SEEDS),))


def variants(passes: Sequence[str] | None = None, *, loo: bool = True, aoi: bool = True,
             steps: bool = True, seed: bool = True) -> list[Variant]:
    names = pipeline_names()
    chosen = list(passes) if passes is not None else optimisation_passes()
    out = [all_off(), Variant("default", "default"), Variant("cleanup", "cleanup", ctx=(("only", CLEANUP),))]
    if seed:
        out.append(seed_only())
    if loo:
        out += [Variant(f"-{p}", "loo", p, (("disabled", (p,)),)) for p in chosen]
    if aoi:
        out += [Variant(f"+{p}", "aoi", p, (("only", ("canonicalize", "cse", p, "dce")),)) for p in chosen]
    if steps:
        for k in range(1, len(names)):
            prefix = tuple(names[:k]) + (() if "dce" in names[:k] else ("dce",))
            out.append(Variant(f"step:{k}", "step", names[k - 1], (("only", prefix),)))
    return out


@dataclass
class VariantResult:
    variant: Variant
    estimate: LayerEstimate
    fired: list[str]
    statuses: dict[str, str]
    graph_nodes: int
    tg: Any = None
    program: dict | None = None        # pypto whole-program cross-check (perf/program.py)

    @property
    def latency_us(self) -> float:
        return self.estimate.makespan_us


@dataclass
class CaseResult:
    case: Case
    results: dict[str, VariantResult] = field(default_factory=dict)
    dispatch: dict[str, dict[str, float]] = field(default_factory=dict)   # variant -> {cycles: makespan µs}
    block_model: dict[str, dict[str, float]] = field(default_factory=dict)   # variant -> other block model -> makespan
    what_if: dict[str, float] = field(default_factory=dict)              # variant -> makespan, far kernels at roofline
    far_kernels: list[str] = field(default_factory=list)                 # ops of those kernels (both variants)
    stage_name: str = ""
    stage_globs: tuple[str, ...] = ()
    stage: dict[str, tuple[float, int]] = field(default_factory=dict)   # variant -> (stage makespan µs, tasks)
    trust: dict[str, Trust] = field(default_factory=dict)    # variant -> flags of its Δ vs trust_reference()

    def latency(self, name: str) -> float:
        return self.results[name].latency_us

    def delta(self, name: str, ref: str) -> float | None:
        if ref not in self.results or name not in self.results:
            return None
        r = self.latency(ref)
        return 100.0 * (r - self.latency(name)) / r if r else None

    def pass_cost(self, name: str) -> float | None:
        """What pass `name` adds to the default latency, % of the latency without it (leave-one-out)."""
        loo = f"-{name}"
        if loo not in self.results or "default" not in self.results:
            return None
        base = self.latency(loo)
        return 100.0 * (self.latency("default") - base) / base if base else None

    @property
    def improvement(self) -> float | None:
        """default vs all-off, % of the all-off latency."""
        return self.delta("default", "all-off")

    def mostly_roofline(self) -> list[str]:
        """Variants whose Δ comes mostly from roofline-only tasks (trust flag R)."""
        return [n for n, t in self.trust.items() if "R" in t.flags]


def trust_reference(v: Variant) -> str | None:
    """The variant whose Δ a row's trust flags qualify: default for leave-one-out (what the pass is worth in the
    default pipeline), all-off for the others; None for the reference itself and the waterfall steps."""
    if v.kind in ("off", "step"):
        return None
    return "default" if v.kind == "loo" else "all-off"


@dataclass
class ABReport:
    cases: list[CaseResult]
    source: str
    params: ScheduleParams
    notes: list[str] = field(default_factory=list)
    compare: list[str] = field(default_factory=list)    # an A/B of pipelines: variant names, the reference first

    @cached_property
    def validation(self) -> Validation | None:
        """How far the chip model's Δs have been from the chip (perf/trust.py `validation`), read once."""
        return validation(self.params)

    # ---- text ------------------------------------------------------------------------------------
    def markdown(self, kernels: int = 12) -> str:
        lines = ["# dspark ab: estimated layer latency per pass configuration", "",
                 f"Cost source: **{self.source}** (per-kernel cycles; `source` column per kernel). Schedule model: "
                 f"perf/schedule.py, {self.params.cube_cores} AIC + {self.params.vector_cores} AIV, dispatch "
                 f"{self.params.dispatch_cycles:g} cycles/task, {self.params.clock_hz / 1e9:g} GHz, "
                 f"{_model_text(self.params)}. Δ = improvement over the reference (positive = faster).", ""]
        lines += [f"- {n}" for n in self.notes]
        if self.validation is not None:
            lines += ["", *self.validation.markdown()]
        for c in self.cases:
            lines += ["", f"## {c.case.label()}", ""]
            lines += self._case_table(c)
            lines += self._case_notes(c)
            d = c.results.get("default")
            if d is not None:
                lines += ["", f"Slowest kernels of the default pipeline ({d.estimate.summary()}):", "",
                          kernel_table(d.estimate, kernels)]
            off = c.results.get("all-off")
            if off is not None:
                lines += ["", "Slowest kernels with all passes off:", "", kernel_table(off.estimate, kernels)]
        return "\n".join(lines) + "\n"

    def _case_table(self, c: CaseResult) -> list[str]:
        lines = ["| variant | latency µs | serial µs | Δ vs all-off | Δ vs default | roofline µs | ratio | tasks | "
                 "kernels | pypto/roofline | fired |",
                 "|---|---|---|---|---|---|---|---|---|---|---|"]
        for name, r in c.results.items():
            if r.variant.kind == "step":
                continue
            e = r.estimate
            src = e.sources()
            ref, t = trust_reference(r.variant), c.trust.get(name)
            mark = {ref: t.mark()} if t is not None else {}
            lines.append(
                f"| {name} | {e.makespan_us:.1f} | {e.serial_us:.1f} | {_pct(c.delta(name, 'all-off'))}"
                f"{mark.get('all-off', '')} | {_pct(c.delta(name, 'default'))}{mark.get('default', '')} | "
                f"{e.bound_us:.1f} | {_ratio(e.ratio)} | {e.tasks} | {e.kernels} | "
                f"{src.get('pypto', 0)}/{src.get('roofline', 0)} | {', '.join(r.fired) or '–'} |")
        return lines

    def _case_notes(self, c: CaseResult) -> list[str]:
        out = []
        if c.improvement is not None:
            seed = c.delta("seed-only", "all-off")
            beside = (f"; seed-only pipeline (the default without {', '.join(NOT_FROM_SEEDS)}) vs all-off: "
                      f"**{seed:+.1f} %** ({c.latency('seed-only'):.1f} µs)" if seed is not None else "")
            out.append(f"\n**default vs all-off: {c.improvement:+.1f} %** "
                       f"({c.latency('all-off'):.1f} → {c.latency('default'):.1f} µs){beside}.")
        if c.trust:
            out.append("- trust flags next to a Δ (vs all-off; leave-one-out rows vs default): "
                       + "; ".join(f"**{k}** {v}" for k, v in LEGEND.items()))
        mostly = c.mostly_roofline()
        if mostly:
            out.append("- gain mostly from roofline-only tasks (flag R: the Δ is a difference of lower bounds, not of "
                       "simulations): " + ", ".join(
                           f"{n} ({100 * c.trust[n].detail['roofline_share']:.0f} % of the per-task change)"
                           for n in mostly))
        out += _floor_notes(c)
        for p in optimisation_passes():
            cost = c.pass_cost(p)
            if cost is not None and p == "deterministic-split-k":
                out.append(f"- {p} costs {cost:+.2f} % of the latency (default vs -{p}; negative = it saves time)")
        for name in ("default", "all-off"):
            r = c.results.get(name)
            if r is not None and r.estimate.roofline_share() > 0:
                out.append(f"- {name}: {100 * r.estimate.roofline_share():.0f} % of the serial kernel time comes "
                           "from roofline estimates (kernels without a pypto template, collectives): those are "
                           "lower bounds, flagged `roofline` below.")
        if c.dispatch:
            parts = []
            for name, m in c.dispatch.items():
                parts.append(f"{name}: " + ", ".join(f"{k} cyc → {v:.1f} µs" for k, v in m.items()))
            out.append("- dispatch sensitivity (makespan): " + "; ".join(parts))
        if c.block_model and "all-off" in c.block_model and "default" in c.block_model:
            parts = []
            for other, off in c.block_model["all-off"].items():
                on = c.block_model["default"][other]
                parts.append(f"`{other}` blocks: all-off {off:.1f} µs → default {on:.1f} µs "
                             f"({100 * (off - on) / off:+.1f} %)")
            out.append("- block-model sensitivity (perf/schedule.py rule 2): " + "; ".join(parts))
        if c.what_if and "all-off" in c.what_if and "default" in c.what_if:
            off, on = c.what_if["all-off"], c.what_if["default"]
            out.append(f"- what-if (a diagnostic, not an estimate): with every cost-model kernel that is more than "
                       f"{WHAT_IF_RATIO:g}× over its roofline ({', '.join(c.far_kernels) or 'none'}) replaced by its "
                       f"blocked roofline in both variants: all-off {off:.1f} µs → default {on:.1f} µs "
                       f"({100 * (off - on) / off:+.1f} %)")
        if "all-off" in c.stage and "default" in c.stage:
            (off, n_off), (on, n_on) = c.stage["all-off"], c.stage["default"]
            pct = f" ({100 * (off - on) / off:+.1f} %)" if off else ""
            out.append(f"- stage `{c.stage_name}` alone (tasks {', '.join(c.stage_globs)}; scheduled by themselves, "
                       f"inputs ready at 0, the scope of a seed's isolated kernel benchmark): all-off {off:.1f} µs "
                       f"({n_off} tasks) → default {on:.1f} µs ({n_on} tasks){pct}")
        compared = [n for n in self.compare if n in c.results]
        if len(compared) > 1:
            ref = c.results[compared[0]]
            out.append(f"\n**A/B against `{compared[0]}`** ({ref.latency_us:.1f} µs): " + "; ".join(
                f"`{n}` {c.latency(n):.1f} µs ({_pct(c.delta(n, compared[0]))})" for n in compared[1:]))
        held = _holding_back(c)
        if held:
            out.append("- on the default critical path (kernels common to both variants, alone µs / roofline ×): "
                       + ", ".join(held))
        progs = {n: r.program for n, r in c.results.items() if r.program}
        if progs:
            out.append("- pypto whole-program cross-check: " + "; ".join(_program_text(n, p) for n, p in progs.items()))
            verdict = program_verdict(c)
            if verdict:
                out.append(f"- {verdict}")
        return out

    def to_json(self) -> dict:
        cases = []
        for c in self.cases:
            rows = []
            for name, r in c.results.items():
                e = r.estimate
                rows.append({"variant": name, "kind": r.variant.kind, "pass": r.variant.pass_name or None,
                             "latency_us": e.makespan_us, "serial_us": e.serial_us, "critical_us": e.critical_us,
                             "delta_vs_off_pct": c.delta(name, "all-off"),
                             "delta_vs_default_pct": c.delta(name, "default"),
                             "roofline_us": e.bound_us, "roofline_limit": e.bound.limit, "roofline_ratio": e.ratio,
                             "tasks": e.tasks, "kernels": e.kernels, "nodes": r.graph_nodes,
                             "sources": e.sources(), "roofline_share": e.roofline_share(),
                             "fired": r.fired, "passes": r.statuses, "program": r.program,
                             "trust": c.trust[name].to_json() if name in c.trust else None,
                             "trust_reference": trust_reference(r.variant),
                             "floor": e.floor.to_json(),
                             "floor_ratio": e.floor_ratio,
                             "kernel_rows": ([k.to_json() for k in e.rows] if r.variant.kind in ("default", "off")
                                             else None)})
            cases.append({"layer": c.case.layer, "shape": c.case.shape.label(), "label": c.case.label(),
                          "improvement_pct": c.improvement,
                          "seed_only_improvement_pct": c.delta("seed-only", "all-off"),
                          "mostly_roofline": c.mostly_roofline(), "dispatch_sensitivity": c.dispatch,
                          "block_model_sensitivity": c.block_model, "what_if_far_kernels_at_roofline": c.what_if,
                          "far_kernels": c.far_kernels, "holding_back": _holding_back(c),
                          "stage": {"name": c.stage_name, "tasks": list(c.stage_globs),
                                    "latency_us": {k: v[0] for k, v in c.stage.items()},
                                    "task_count": {k: v[1] for k, v in c.stage.items()}},
                          "pass_cost_pct": {p: c.pass_cost(p) for p in optimisation_passes()}, "variants": rows})
        return {"schema": "dspark-ab/1", "source": self.source,
                "schedule": {"cube_cores": self.params.cube_cores, "vector_cores": self.params.vector_cores,
                             "dispatch_cycles": self.params.dispatch_cycles, "clock_hz": self.params.clock_hz,
                             "model": self.params.name, "block_model": self.params.block_model,
                             "block_issue": self.params.block_issue, "early_dispatch": self.params.early_dispatch,
                             "cross_rank": self.params.cross_rank,
                             "hop_cycles": self.params.hop_cycles, "dispatchers": self.params.dispatchers,
                             "block_dispatch_cycles": self.params.block_dispatch_cycles,
                             "launch_cycles": self.params.launch_cycles},
                "notes": self.notes, "compare": self.compare, "cases": cases,
                "validation": self.validation.to_json() if self.validation is not None else None}

    # ---- plots -----------------------------------------------------------------------------------
    def plots(self, out_dir) -> list[str]:
        from .plots import onoff_bars, waterfall

        written = [onoff_bars(self, out_dir)]
        for c in self.cases:
            path = waterfall(c, out_dir)
            if path:
                written.append(path)
        return [w for w in written if w]




def _holding_back(c: CaseResult, top: int = 6) -> list[str]:
    d, o = c.results.get("default"), c.results.get("all-off")
    if d is None or o is None:
        return []
    common = {r.name for r in o.estimate.rows}
    rows = [r for r in d.estimate.critical_rows() if r.name in common]
    rows.sort(key=lambda r: -r.alone_us)
    return [f"`{r.name}` {r.alone_us:.0f} µs / {r.ratio:.0f}×" if r.ratio else f"`{r.name}` {r.alone_us:.0f} µs"
            for r in rows[:top]]


def _model_text(p: ScheduleParams) -> str:
    if not p.dispatchers and not p.hop_cycles:
        return f"model `{p.name}` ({p.block_model} blocks)"
    return (f"model `{p.name}` ({p.block_model} blocks, hop {p.us(p.hop_cycles):.2f} µs, block dispatch "
            f"{p.us(p.block_dispatch_cycles):.2f} µs over {p.dispatchers} dispatchers, {p.block_issue} block issue, "
            f"early dispatch {'on' if p.early_dispatch else 'off'}, "
            f"cross-rank steps {'on' if p.cross_rank else 'off'}; "
            "latencies are AICore makespans, "
            f"a call adds the {p.us(p.launch_cycles):.1f} µs launch floor)")


def _floor_notes(c: CaseResult) -> list[str]:
    """The layer's roofline beside the floor of what a rank must move, with both ratios."""
    out = []
    for name in ("all-off", "default"):
        r = c.results.get(name)
        if r is None:
            continue
        e, f = r.estimate, r.estimate.floor
        out.append(f"- {name}: decomposition roofline {e.bound_us:.1f} µs ({e.bound.limit}; makespan × "
                   f"{_ratio(e.ratio)}); floor of what a rank must move {f.low / 1e6:.1f}–{f.high / 1e6:.1f} MB → "
                   f"{f.low_us:.1f}–{f.high_us:.1f} µs at HBM rate (makespan × {_ratio(e.floor_ratio)} of the low end; "
                   f"{f.summary()})")
    return out


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:+.1f} %"


def _ratio(x: float | None) -> str:
    return "–" if x is None or math.isinf(x) else f"{x:.2f}"


def _program_text(name: str, p: Mapping) -> str:
    if not p.get("ok"):
        return f"{name}: pypto program failed ({p.get('error', '?')[:120]})"
    return (f"{name}: pypto {p['pypto_us']:.1f} µs vs our schedule {p['ours_us']:.1f} µs for the same "
            f"{p['tasks']} tasks")


def program_verdict(c: CaseResult) -> str:
    """Does the A/B verdict (default faster than all-off) hold on pypto's own schedule too?"""
    d, o = c.results.get("default"), c.results.get("all-off")
    if not d or not o or not d.program or not o.program or not d.program.get("ok") or not o.program.get("ok"):
        return ""
    ours = d.program["ours_us"] < o.program["ours_us"]
    theirs = d.program["pypto_us"] < o.program["pypto_us"]
    if ours == theirs:
        return (f"A/B verdict on the cross-checked part agrees: default is {'faster' if ours else 'not faster'} "
                "under both our schedule and pypto's runtime model")
    return ("A/B verdict DISAGREES on the cross-checked part: our schedule says default is "
            f"{'faster' if ours else 'slower'}, pypto's whole-program run says {'faster' if theirs else 'slower'}")


# ---- driver ------------------------------------------------------------------------------------------
@dataclass
class Lowered:
    """A variant's pipeline run and task graph, before any cost is known."""

    tg: Any
    fired: list[str]
    statuses: dict[str, str]
    graph_nodes: int


def lower_variant(g, v: Variant) -> Lowered:
    from lowering import compile

    c = compile(g, pipeline="default", ctx=v.context(), verify=False, sources=False)
    statuses = {r.name: r.status for r in c.passes.runs}
    fired = [r.name for r in c.passes.runs if r.status == "changed"]
    return Lowered(c.tg, fired, statuses, len(c.graph))


def run_variant(g, v: Variant, source: CostSource, params: ScheduleParams, label: str,
                progress: Callable[[int, int], None] | None = None) -> VariantResult:
    low = lower_variant(g, v)
    est = estimate(low.tg, source, params, label=f"{label} {v.name}", progress=progress)
    return VariantResult(v, est, low.fired, low.statuses, low.graph_nodes, low.tg)


def stage_tasks(tg, globs: Sequence[str]):
    """The schedule tasks whose names match `globs`, with deps on tasks outside the stage dropped (their results
    are ready at time 0)."""
    tasks = [t for t in sched_tasks(tg) if any(fnmatchcase(t.name, g) for g in globs)]
    inside = {t.id for t in tasks}
    return [replace(t, deps=tuple(d for d in t.deps if d in inside)) for t in tasks]


def stage_latency(r: VariantResult, globs: Sequence[str], params: ScheduleParams) -> tuple[float, int]:
    """(makespan µs, task count) of the variant's tasks whose names match `globs`, scheduled alone (`stage_tasks`),
    the costs are the variant's."""
    tasks = stage_tasks(r.tg, globs)
    if not tasks:
        return 0.0, 0
    return schedule(tasks, r.estimate.schedule.costs, params).makespan_us, len(tasks)


def run_ab(cases: Sequence[Case], source: CostSource, params: ScheduleParams | None = None, *,
           variant_list: Sequence[Variant] | None = None, dispatch_sweep: Sequence[float] = (0.0, 3600.0),
           what_if_ratio: float = 10.0,
           program: Callable[[VariantResult, CaseResult], dict] | None = None,
           stage: tuple[str, Sequence[str]] | None = None, progress: Any = None) -> ABReport:
    """Run every variant of every case. `stage` = (name, task-name globs) for every case, else the layer's entry
    of STAGES. `progress` is a tqdm-like object (update/set_postfix_str) or None."""
    params = params or ScheduleParams()
    vlist = list(variant_list) if variant_list is not None else variants()
    out = []
    for case in cases:
        g = case.build()
        cr = CaseResult(case)
        cr.stage_name, globs = stage or STAGES.get(case.layer, ("", ()))
        cr.stage_globs = tuple(globs)
        for v in vlist:
            if progress is not None:
                progress.set_postfix_str(f"{case.layer} {v.name}")

            def kernels(done: int, total: int, _v=v) -> None:
                if progress is not None:
                    progress.set_postfix_str(f"{case.layer} {_v.name}: pypto {done}/{total} kernels")

            cr.results[v.name] = run_variant(g, v, source, params, case.layer, kernels)
            if progress is not None:
                progress.update(1)
        for name in ("all-off", "default"):
            r = cr.results.get(name)
            if r is None:
                continue
            sweep = {}
            for cyc in (*dispatch_sweep, params.dispatch_cycles):
                p = replace(params, dispatch_cycles=cyc)
                sweep[f"{cyc:g}"] = schedule(sched_tasks(r.tg), r.estimate.schedule.costs, p).makespan_us
            cr.dispatch[name] = dict(sorted(sweep.items(), key=lambda kv: float(kv[0])))
            cr.block_model[name] = {
                model: schedule(sched_tasks(r.tg), r.estimate.schedule.costs,
                                replace(params, block_model=model)).makespan_us
                for model in other_block_models(params)}
            costs, far = far_at_roofline(r, what_if_ratio)
            cr.what_if[name] = schedule(sched_tasks(r.tg), costs, params).makespan_us
            cr.far_kernels = sorted(set(cr.far_kernels) | far)
            if cr.stage_globs:
                cr.stage[name] = stage_latency(r, cr.stage_globs, params)
            if program is not None:
                r.program = program(r, cr)
        for name, r in cr.results.items():
            ref = trust_reference(r.variant)
            if ref is not None and ref in cr.results and ref != name:
                cr.trust[name] = trust(cr.results[ref], r, params, ref_latency=cr.latency(ref),
                                       var_latency=cr.latency(name))
        out.append(cr)
    return ABReport(out, source.name, params)

"""The case corpus: published hardware measurements beside what `dspark ab` predicts for them.

    corpus = load_cases("all")                    # every perf/cases/*.toml, or one file
    report = run_cases(corpus, PyptoCosts())      # report.markdown(), report.to_json(), report.table()

One case per published measurement (perf/cases/*.toml, format in perf/README.md "Case corpus"): a layer at one
shape, a scope (the whole layer, or a stage's task-name globs scheduled alone as perf/ab.py `stage_tasks` does),
the pipeline before and after (`all-off`, `default`, `cleanup`, `seed-only`, a list of passes, a pass pipeline
string, or the default without some passes), the measured µs before/after (or only the published Δ, or nothing
when the figure is held back) and where it was published. A case that the IR cannot express yet is kept with
`unsupported = "reason"`: it is listed, not predicted.

Both sides are lowered and costed by perf/ab.py's variant machinery (`lower_variant`, `run_variant`,
`stage_tasks`); a scoped case costs only its stage's kernels.
Δ here is the change in % of before, (after − before) / before: negative = faster, as the published figures read.
Verdict (the acceptance of issue 16): the sign right (a Δ within ±FLAT points counts as no change), |Δ error| ≤
DELTA_POINTS points, and both absolutes within ±ABSOLUTE_PCT %. Trust flags (perf/trust.py) qualify the Δ.

The rule matrix (`rule_matrix`): every case again under each combination of the chip model's switchable rules
(RULE_AXES: rule 7's block issue, rule 9's early dispatch, rule 10's cross-rank steps), rescheduled with the same
kernel costs and the committed constants. It is a sensitivity, not a refit: it shows which verdicts rest on a rule
the facts do not pin down, and whether any combination would meet the acceptance.
"""
from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping, Sequence

import tomllib

from dspark_ir.errors import DsparkError

from .ab import Case, Shape, Variant, VariantResult, all_off, lower_variant, run_variant, seed_only, stage_tasks
from .costs import DUMMY, CostSource
from .estimate import estimate
from .schedule import ScheduleParams
from .trust import FLAT, LEGEND, Trust, scope_latency, trust

CASES_DIR = Path(__file__).parent / "cases"
DELTA_POINTS = 5.0       # |predicted Δ − hardware Δ| allowed, points
ABSOLUTE_PCT = 25.0      # |predicted / hardware − 1| allowed for the absolutes, %
SCHEMA = "dspark-cases/1"


class CaseError(DsparkError):
    """A case file that cannot be read: one line with the file and the line or the case name."""


@dataclass(frozen=True)
class Pipe:
    """One side of a case: the pipeline as written and the variant that runs it."""

    text: str
    variant: Variant


@dataclass(frozen=True)
class Measured:
    before_us: float | None = None
    after_us: float | None = None
    delta_pct: float | None = None     # given when only the relative figure is published ("unchanged": 0)

    @property
    def delta(self) -> float | None:
        if self.before_us is not None and self.after_us is not None:
            return change(self.before_us, self.after_us)
        return self.delta_pct

    def to_json(self) -> dict | None:
        if self.before_us is None and self.after_us is None:
            return None
        return {"before_us": self.before_us, "after_us": self.after_us}


@dataclass(frozen=True)
class CorpusCase:
    name: str
    pr: int | None
    layer: str
    shape: Shape
    rows: int
    scope: tuple[str, ...]            # task-name globs; () = the whole layer
    scope_name: str
    before: Pipe
    after: Pipe
    hw: Measured
    source: str
    unsupported: str = ""
    note: str = ""
    file: str = ""

    def shape_json(self) -> dict:
        s = self.shape
        batch, seq = (self.rows, 1) if s.batch is None else (s.batch, s.seq)   # a prefill chunk: B = T, S = 1
        return {"config": s.config, "tp": s.tp, "batch": batch, "seq": seq, "contexts": dict(s.params),
                "rows": self.rows}

    def scope_json(self) -> dict:
        return {"name": self.scope_name, "tasks": list(self.scope) or None}


def change(before: float, after: float) -> float | None:
    """(after − before) / before in %: negative = faster."""
    return 100.0 * (after - before) / before if before else None


# ---- loading -------------------------------------------------------------------------------------------------
CASE_KEYS = {"name", "pr", "layer", "shape", "scope", "before", "after", "hw", "source", "unsupported", "note"}
SHAPE_KEYS = {"config", "tp", "batch", "seq", "contexts", "rows"}
HW_KEYS = {"before_us", "after_us", "delta_pct"}
PIPE_KEYS = {"passes", "pipeline", "default_without", "default_with"}
NAMED = {"all-off": all_off, "default": lambda: Variant("default", "default"),
         "cleanup": lambda: Variant("cleanup", "cleanup", ctx=(("only", ("canonicalize", "cse", "dce")),)),
         "seed-only": seed_only}


def case_files(spec: str) -> list[Path]:
    """`all` = every perf/cases/*.toml; else one file."""
    if spec == "all":
        files = sorted(CASES_DIR.glob("*.toml"))
        if not files:
            raise CaseError(f"{CASES_DIR}: no case files (*.toml)")
        return files
    path = Path(spec)
    if not path.is_file():
        raise CaseError(f"{spec}: no such case file (give a .toml file or 'all')")
    return [path]


def load_cases(spec: str) -> list[CorpusCase]:
    cases: list[CorpusCase] = []
    for path in case_files(spec):
        cases += load_file(path)
    seen: dict[str, str] = {}
    for c in cases:
        if c.name in seen:
            raise CaseError(f"{c.file}: case '{c.name}': the name is also used in {seen[c.name]}")
        seen[c.name] = c.file
    return cases


def load_file(path: Path) -> list[CorpusCase]:
    text = path.read_text()
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        m = re.search(r"\(at line (\d+), column (\d+)\)", str(e))
        line = f"{m.group(1)}:{m.group(2)}" if m else str(len(text.splitlines()) + 1)   # else: at the end
        raise CaseError(f"{path}:{line}: {re.sub(r' ?[(]at (line|end).*[)]', '', str(e))}") from None
    extra = set(doc) - {"case"}
    if extra:
        raise CaseError(f"{path}:{_line(text, sorted(extra)[0])}: unknown top-level key '{sorted(extra)[0]}' "
                        "(cases are [[case]] tables)")
    raw = doc.get("case", [])
    if not isinstance(raw, list) or not raw:
        raise CaseError(f"{path}: no [[case]] tables")
    return [parse_case(d, path, text, i) for i, d in enumerate(raw)]


def _line(text: str, key: str) -> int:
    for n, line in enumerate(text.splitlines(), 1):
        if re.match(rf"\s*\[*\s*{re.escape(key)}\b", line):
            return n
    return 1


def parse_case(d: Mapping[str, Any], path: Path, text: str = "", index: int = 0) -> CorpusCase:
    name = d.get("name")
    where = f"{path}: case '{name}'" if isinstance(name, str) and name else f"{path}: case #{index + 1}"

    def fail(msg: str):
        raise CaseError(f"{where}: {msg}")

    if not isinstance(name, str) or not name:
        fail("'name' (a non-empty string) is required")
    unknown = set(d) - CASE_KEYS
    if unknown:
        fail(f"unknown key '{sorted(unknown)[0]}' (known: {', '.join(sorted(CASE_KEYS))})")
    for key in ("layer", "source", "before", "after"):
        if key not in d:
            fail(f"'{key}' is required")
    pr = d.get("pr")
    if pr is not None and (not isinstance(pr, int) or isinstance(pr, bool) or pr <= 0):
        fail(f"'pr' must be a pypto-lib PR number or absent, got {pr!r}")
    layer = _layer(d["layer"], fail)
    shape, rows = _shape(d.get("shape", {}), layer, fail)
    scope = d.get("scope", {})
    if not isinstance(scope, Mapping) or set(scope) - {"name", "tasks"}:
        fail("'scope' is a table with 'name' and 'tasks' (task-name globs); leave it out for the whole layer")
    globs = scope.get("tasks", [])
    if not isinstance(globs, list) or not all(isinstance(g, str) and g for g in globs):
        fail("scope.tasks must be a list of task-name globs")
    scope_name = scope.get("name") or ("whole layer" if not globs else "stage")
    hw = d.get("hw", {})
    if not isinstance(hw, Mapping) or set(hw) - HW_KEYS:
        fail(f"'hw' is a table of {', '.join(sorted(HW_KEYS))}")
    for k, v in hw.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool) or (k != "delta_pct" and v <= 0):
            fail(f"hw.{k} must be a {'number' if k == 'delta_pct' else 'positive number of µs'}, got {v!r}")
    if ("before_us" in hw) != ("after_us" in hw):
        fail("hw needs both before_us and after_us (or neither)")
    if "delta_pct" in hw and "before_us" in hw:
        fail("hw: give before_us/after_us or delta_pct, not both")
    unsupported = d.get("unsupported", "")
    if not isinstance(unsupported, str):
        fail("'unsupported' is the reason (a string)")
    return CorpusCase(name, pr, layer, shape, rows, tuple(globs), scope_name,
                      _pipe(d["before"], f"{name}:before", fail), _pipe(d["after"], f"{name}:after", fail),
                      Measured(*(float(hw[k]) if k in hw else None for k in ("before_us", "after_us", "delta_pct"))),
                      str(d["source"]), unsupported, str(d.get("note", "")), str(path))


def _layer(name: Any, fail) -> str:
    from dspark_ir import layers

    if name not in layers.LAYER_NAMES:
        fail(f"unknown layer {name!r} (known: {', '.join(layers.LAYER_NAMES)})")
    return name


def _shape(d: Any, layer: str, fail) -> tuple[Shape, int]:
    from dspark_ir import layers

    if not isinstance(d, Mapping) or set(d) - SHAPE_KEYS:
        fail(f"'shape' is a table of {', '.join(sorted(SHAPE_KEYS))}")
    for k in ("tp", "batch", "seq", "rows"):
        if k in d and (not isinstance(d[k], int) or isinstance(d[k], bool) or d[k] <= 0):
            fail(f"shape.{k} must be a positive integer, got {d[k]!r}")
    contexts = d.get("contexts", {})
    if not isinstance(contexts, Mapping):
        fail("shape.contexts is a table of layer parameters, e.g. { max_context = 256 }")
    known = layers.layer_params(layer)
    for k in contexts:
        if k not in known:
            fail(f"shape.contexts: {layer} has no parameter '{k}' (it has: {', '.join(known) or 'none'})")
    config, tp, params = str(d.get("config", "flash")), d.get("tp", 4), tuple(sorted(contexts.items()))
    if "chunk" in known:                # a prefill layer: its rows are the chunk (the graph's B = chunk, S = 1)
        given = [k for k in ("batch", "seq") if k in d]
        if given:
            fail(f"shape.{given[0]}: {layer} takes its rows from contexts.chunk (T = chunk tokens per rank); "
                 "leave batch and seq out")
        chunk = contexts.get("chunk", known["chunk"])
        if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk <= 0:
            fail(f"shape.contexts.chunk must be a positive integer (tokens per rank), got {chunk!r}")
        rows = d.get("rows", chunk)
        if rows != chunk:
            fail(f"shape.rows = {rows} but contexts.chunk = {chunk} (a prefill layer's rows are T = chunk per rank)")
        return Shape(config, tp, None, None, params), rows
    batch, seq = d.get("batch", 16), d.get("seq", 8)
    rows = d.get("rows", batch * seq)
    if rows != batch * seq:
        fail(f"shape.rows = {rows} but batch × seq = {batch} × {seq} = {batch * seq} (rows are T = B·S per rank)")
    return Shape(config, tp, batch, seq, params), rows


def _pipe(spec: Any, label: str, fail) -> Pipe:
    from passes import parse_pipeline, registered_names
    from passes.infra.errors import PipelineError

    if isinstance(spec, str):
        if spec not in NAMED:
            fail(f"{label.split(':')[1]}: '{spec}' is not one of {', '.join(NAMED)} (or a table with passes, "
                 "pipeline, default_without or default_with)")
        return Pipe(spec, NAMED[spec]())
    if not isinstance(spec, Mapping) or len(spec) != 1 or set(spec) - PIPE_KEYS:
        fail(f"{label.split(':')[1]}: give exactly one of {', '.join(sorted(PIPE_KEYS))}")
    (key, value), = spec.items()
    side = label.split(":")[1]
    if key == "pipeline":
        if not isinstance(value, str):
            fail(f"{side}.pipeline must be a pass pipeline string")
        try:
            text = str(parse_pipeline(value))
        except PipelineError as e:
            fail(f"{side}.pipeline: {e}")
        return Pipe(text, Variant(label, "case", ctx=(("pipeline", value),)))
    if not isinstance(value, list) or not all(isinstance(p, str) for p in value):
        fail(f"{side}.{key} must be a list of pass names")
    if key == "default_with":
        try:
            text = default_with(value)
        except PipelineError as e:
            fail(f"{side}.default_with: {e}")
        return Pipe("default with " + ", ".join(value), Variant(label, "case", ctx=(("pipeline", text),)))
    bad = [p for p in value if p not in registered_names()]
    if bad:
        fail(f"{side}.{key}: unknown pass '{bad[0]}'")
    if key == "default_without":
        return Pipe("default without " + ", ".join(value), Variant(label, "case", ctx=(("disabled", tuple(value)),)))
    if not value:
        return Pipe("no pass", all_off())
    return Pipe(", ".join(value), Variant(label, "case", ctx=(("only", tuple(value)),)))


def default_with(specs: list[str]) -> str:
    """The default pipeline's text with each given pass entry on, at its place, with the given options: an
    off-by-default entry is turned on, an enabled one takes the options. So a case's side follows the default
    pipeline as it grows, and its Δ stays the named pass's alone."""
    from passes import DEFAULT_PIPELINE, parse_pipeline
    from passes.infra.errors import PipelineError
    from passes.infra.pipeline import format_pass

    given = {}
    for spec in specs:
        for p in parse_pipeline(spec):
            given[p.name] = format_pass(p)
    out = []
    for e in DEFAULT_PIPELINE:
        name = parse_pipeline(e.spec).names[0]
        if name in given:
            out.append(given.pop(name))
        elif e.enabled:
            out.append(e.spec)
    if given:
        raise PipelineError(f"'{next(iter(given))}' is not an entry of the default pipeline (use a pipeline string)")
    return ",".join(out)


# ---- predicting ----------------------------------------------------------------------------------------------
@dataclass
class CaseResult:
    case: CorpusCase
    before: VariantResult | None = None
    after: VariantResult | None = None
    before_us: float | None = None
    after_us: float | None = None
    trust: Trust | None = None
    error: str = ""                   # why it was not predicted (unsupported, a failed build)

    @property
    def predicted_delta(self) -> float | None:
        if self.before_us is None or self.after_us is None:
            return None
        return change(self.before_us, self.after_us)

    def errors(self) -> dict[str, float | None]:
        """Δ error in points (predicted − hardware), absolute errors in % of the hardware figure."""
        hw, pd = self.case.hw.delta, self.predicted_delta
        return {"delta_points": None if hw is None or pd is None else pd - hw,
                "before_pct": _rel(self.before_us, self.case.hw.before_us),
                "after_pct": _rel(self.after_us, self.case.hw.after_us)}

    def verdict(self) -> dict[str, bool | None]:
        """sign right, Δ within ±DELTA_POINTS, absolutes within ±ABSOLUTE_PCT (None: nothing to compare)."""
        return verdict(self.case.hw, self.before_us, self.after_us)

    def to_json(self) -> dict:
        c = self.case
        pred = (None if self.before_us is None else {"before_us": self.before_us, "after_us": self.after_us})
        return {"name": c.name, "pr": c.pr, "layer": c.layer, "shape": c.shape_json(), "scope": c.scope_json(),
                "before": c.before.text, "after": c.after.text, "hw": c.hw.to_json(), "hw_delta_pct": c.hw.delta,
                "predicted": pred, "predicted_delta_pct": self.predicted_delta, "errors": self.errors(),
                "verdict": self.verdict(), "trust": self.trust.to_json() if self.trust else None,
                "fired": {"before": self.before.fired if self.before else None,
                          "after": self.after.fired if self.after else None},
                "source": c.source, "unsupported": c.unsupported or None, "error": self.error or None,
                "note": c.note or None, "file": c.file}


def _rel(pred: float | None, hw: float | None) -> float | None:
    return None if pred is None or not hw else 100.0 * (pred - hw) / hw


def verdict(hw: Measured, before_us: float | None, after_us: float | None) -> dict[str, bool | None]:
    pd = change(before_us, after_us) if before_us is not None and after_us is not None and before_us else None
    hd = hw.delta
    out: dict[str, bool | None] = {"sign": None, "delta": None, "absolute": None}
    if pd is None or hd is None:
        return out
    if abs(hd) <= FLAT:                 # published as unchanged: the prediction must be flat within the Δ band
        out["sign"] = abs(pd) <= DELTA_POINTS
    else:
        out["sign"] = abs(pd) > FLAT and math.copysign(1, pd) == math.copysign(1, hd)
    out["delta"] = abs(pd - hd) <= DELTA_POINTS
    if hw.before_us is not None and hw.after_us is not None:
        out["absolute"] = all(abs(_rel(p, h)) <= ABSOLUTE_PCT for p, h in ((before_us, hw.before_us),
                                                                           (after_us, hw.after_us)))
    return out


def predict_side(g, case: CorpusCase, pipe: Pipe, source: CostSource, params: ScheduleParams,
                 progress=None) -> tuple[VariantResult, float]:
    """One side of a case through perf/ab.py's machinery: the whole layer (`run_variant`), or the scope's tasks
    alone (`lower_variant` + `stage_tasks`; only their kernels are costed, the others are left as dummies)."""
    label = f"{case.name} {pipe.variant.name}"
    if not case.scope:
        r = run_variant(g, pipe.variant, source, params, label, progress)
        return r, r.latency_us
    low = lower_variant(g, pipe.variant)
    ids = [t.id for t in stage_tasks(low.tg, case.scope)]
    if not ids:
        raise CaseError(f"{case.file}: case '{case.name}': scope.tasks match no task of {case.layer} "
                        f"({pipe.text})")
    costs = {t.id: DUMMY for t in low.tg.tasks}
    costs.update(source.costs(low.tg, tasks=ids, progress=progress))
    est = estimate(low.tg, source, params, label=label, costs=costs)
    r = VariantResult(pipe.variant, est, low.fired, low.statuses, low.graph_nodes, low.tg)
    return r, scope_latency(r, params, case.scope)


def run_cases(cases: Sequence[CorpusCase], source: CostSource, params: ScheduleParams | None = None, *,
              progress: Any = None, rules: bool = True) -> "CasesReport":
    params = params or ScheduleParams()
    out = []
    for case in cases:
        res = CaseResult(case)
        out.append(res)
        if case.unsupported:
            res.error = f"unsupported: {case.unsupported}"
            continue
        if progress is not None:
            progress.set_postfix_str(case.name)
        g = Case(case.layer, case.shape).build()
        res.before, res.before_us = predict_side(g, case, case.before, source, params)
        res.after, res.after_us = predict_side(g, case, case.after, source, params)
        res.trust = trust(res.before, res.after, params, case.scope, ref_latency=res.before_us,
                          var_latency=res.after_us)
        if progress is not None:
            progress.update(1)
    report = CasesReport(out, source.name, params)
    if rules:
        report.rules = rule_matrix(report)
    return report


# ---- the model's rules ---------------------------------------------------------------------------------------
RULE_AXES = (("block_issue", ("cores", "grid")), ("early_dispatch", (True, False)), ("cross_rank", (True, False)))


@dataclass
class RuleRun:
    """The corpus under one combination of the switchable rules: per case result, its (before, after) µs (None
    when not predicted) and verdict."""
    params: ScheduleParams
    sides: list[tuple[float | None, float | None]]
    verdicts: list[dict[str, bool | None]]
    committed: bool = False          # the combination `report.params` has: its figures are the report's own

    def rules(self) -> dict[str, Any]:
        return {name: getattr(self.params, name) for name, _ in RULE_AXES}

    def label(self) -> tuple[str, ...]:
        p = self.params
        return (p.block_issue, "on" if p.early_dispatch else "off", "on" if p.cross_rank else "off")

    def counts(self) -> dict[str, tuple[int, int]]:
        """verdict key → (passed, judged)."""
        out = {}
        for key in ("sign", "delta", "absolute"):
            vals = [v[key] for v in self.verdicts if v[key] is not None]
            out[key] = (sum(vals), len(vals))
        return out


def rule_matrix(report: "CasesReport") -> list[RuleRun]:
    """Every predicted case rescheduled under each combination of RULE_AXES (module docstring), the committed
    combination taking the report's own figures; [] for a model without block dispatch (the legacy model: the
    rules change nothing there)."""
    base = report.params
    if base.dispatchers <= 0:
        return []
    runs = []
    for values in itertools.product(*(v for _, v in RULE_AXES)):
        params = replace(base, **dict(zip((name for name, _ in RULE_AXES), values)))
        committed = all(getattr(params, name) == getattr(base, name) for name, _ in RULE_AXES)
        sides: list[tuple[float | None, float | None]] = []
        for r in report.results:
            if r.before is None or r.after is None:
                sides.append((None, None))
            elif committed:         # the report's own schedule: not run again
                sides.append((r.before_us, r.after_us))
            else:
                sides.append((scope_latency(r.before, params, r.case.scope),
                              scope_latency(r.after, params, r.case.scope)))
        verdicts = [verdict(r.case.hw, b, a) for r, (b, a) in zip(report.results, sides)]
        runs.append(RuleRun(params, sides, verdicts, committed))
    return runs


# ---- the report ----------------------------------------------------------------------------------------------
@dataclass
class CasesReport:
    results: list[CaseResult]
    source: str
    params: ScheduleParams
    notes: list[str] = field(default_factory=list)
    rules: list[RuleRun] = field(default_factory=list)     # the rule matrix (rule_matrix), [] when not run

    def table(self) -> list[str]:
        lines = ["| case | PR | scope | hardware before → after (Δ) | predicted before → after (Δ) | Δ error | "
                 "before / after error | verdict: sign, Δ ±5, abs ±25 % |",
                 "|---|---|---|---|---|---|---|---|"]
        for r in self.results:
            c, e, v = r.case, r.errors(), r.verdict()
            hw = _side(c.hw.before_us, c.hw.after_us, c.hw.delta, published=True)
            pred = (_side(r.before_us, r.after_us, r.predicted_delta) + (r.trust.mark() if r.trust else "")
                    if r.before_us is not None else f"– ({r.error or 'not run'})")
            lines.append(f"| {c.name} | {('#' + str(c.pr)) if c.pr else '–'} | {c.layer} {c.shape.label()}, "
                         f"{c.scope_name} | {hw} | {pred} | {_pts(e['delta_points'])} | {_pct(e['before_pct'])} / "
                         f"{_pct(e['after_pct'])} | {_verdict(v)} |")
        return lines

    def summary(self) -> str:
        judged = [r.verdict() for r in self.results]
        parts = []
        for key, what in (("sign", "signs right"), ("delta", f"Δ within ±{DELTA_POINTS:g} points"),
                          ("absolute", f"absolutes within ±{ABSOLUTE_PCT:g} %")):
            vals = [v[key] for v in judged if v[key] is not None]
            parts.append(f"{sum(vals)}/{len(vals)} {what}")
        skipped = sum(1 for r in self.results if r.before_us is None)
        return "; ".join(parts) + (f"; {skipped} not predicted" if skipped else "")

    def rule_table(self) -> list[str]:
        """The rule matrix as a table: one row per combination, the verdict counts, then each measured case's
        predicted Δ and its verdict (sign, Δ, absolute)."""
        if not self.rules:
            return []
        shown = [i for i, r in enumerate(self.results) if r.case.hw.delta is not None]
        head = ["block issue (rule 7)", "early dispatch (rule 9)", "cross-rank steps (rule 10)", "signs",
                f"Δ ±{DELTA_POINTS:g}", f"abs ±{ABSOLUTE_PCT:g} %"] + [self.results[i].case.name for i in shown]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for run in self.rules:
            counts = run.counts()
            cells = [f"**{x}**" if run.committed else x for x in run.label()]
            cells += [f"{counts[k][0]}/{counts[k][1]}" for k in ("sign", "delta", "absolute")]
            for i in shown:
                b, a = run.sides[i]
                cells.append("–" if b is None else f"{_pct(change(b, a))} ({_verdict(run.verdicts[i])})")
            lines.append("| " + " | ".join(cells) + " |")
        return lines

    def markdown(self) -> str:
        lines = ["# dspark ab --cases: the case corpus against the estimate", "",
                 f"Cost source: **{self.source}**; schedule model perf/schedule.py `{self.params.name}` "
                 f"({self.params.block_model} blocks, {self.params.block_issue} block issue, early "
                 f"dispatch {'on' if self.params.early_dispatch else 'off'}, cross-rank steps "
                 f"{'on' if self.params.cross_rank else 'off'}, dispatch "
                 f"{self.params.dispatch_cycles:g} cycles/task). "
                 "Δ = (after − before) / before: negative = "
                 f"faster. Verdict: sign right (a published 'unchanged' needs |Δ| ≤ {DELTA_POINTS:g}), |Δ error| ≤ "
                 f"{DELTA_POINTS:g} points, both absolutes within ±{ABSOLUTE_PCT:g} %.", ""]
        lines += [f"- {n}" for n in self.notes]
        lines += ["", f"**{self.summary()}**", ""] + self.table() + ["", "Trust flags next to a predicted Δ:", ""]
        lines += [f"- **{k}**: {v}" for k, v in LEGEND.items()]
        if self.rules:
            lines += ["", "## The model's rules", "",
                      "Every case rescheduled under each combination of the chip model's switchable rules, with the "
                      "same kernel costs and the committed constants (a sensitivity, not a refit); bold: the "
                      "combination above. Per case: the predicted Δ and its verdict (sign, Δ, absolute).", ""]
            lines += self.rule_table()
        lines += ["", "## Cases", ""]
        for r in self.results:
            c = r.case
            lines += [f"### {c.name}", "", f"- layer {c.layer} [{c.shape.label()}], rows T = {c.rows}; scope: "
                      f"{c.scope_name}{' (' + ', '.join(c.scope) + ')' if c.scope else ''}",
                      f"- before: {c.before.text}; after: {c.after.text}", f"- source: {c.source}"]
            if c.note:
                lines.append(f"- note: {c.note}")
            if r.error:
                lines.append(f"- not predicted: {r.error}")
            if r.before is not None and r.after is not None:
                lines.append(f"- passes fired: before {', '.join(r.before.fired) or '–'}; after "
                             f"{', '.join(r.after.fired) or '–'}")
            if r.trust is not None:
                d = r.trust.detail
                others = ", ".join(f"`{m}` {_pct(v)}" for m, v in d["delta_other_block_models_pct"].items())
                issue = ", ".join(f"`{m}` {_pct(v)}" for m, v in d["delta_other_block_issue_pct"].items())
                lines.append(f"- sensitivity (improvement %): ours {_pct(r.trust.delta)}, other block models "
                             f"{others}, {'other block issue ' + issue + ', ' if issue else ''}far kernels at roofline "
                             f"{_pct(d['delta_far_at_roofline_pct'])} ({', '.join(d['far_kernels']) or 'none'}), "
                             f"no link overlap {_pct(d['delta_link_serial_pct'])}; "
                             f"{100 * d['roofline_share']:.0f} % of the per-task change is on roofline-only tasks")
            lines.append("")
        return "\n".join(lines)

    def to_json(self) -> list[dict]:
        """One row per case (the issue's fields and more); `model` names what predicted it, so two files from
        different schedule models or cost sources are never compared unknowingly."""
        model = {"cost_source": self.source, "schedule": self.params.name, "block_model": self.params.block_model,
                 "block_issue": self.params.block_issue, "early_dispatch": self.params.early_dispatch,
                 "cross_rank": self.params.cross_rank}
        rows = [{**r.to_json(), "model": model} for r in self.results]
        for i, row in enumerate(rows):
            row["rules"] = [{**run.rules(), "before_us": run.sides[i][0], "after_us": run.sides[i][1],
                             "verdict": run.verdicts[i]} for run in self.rules]
        return rows


def _side(before: float | None, after: float | None, delta: float | None, published: bool = False) -> str:
    if before is None or after is None:
        return "held back" if delta is None else f"Δ {_pct(delta)}"
    us = _published if published else (lambda x: f"{x:.1f}")
    return f"{us(before)} → {us(after)} µs ({_pct(delta)})"


def _published(x: float) -> str:
    """µs as published: up to two decimals."""
    return f"{x:.2f}" if round(x, 2) != round(x, 1) else f"{x:.1f}"


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{x:+.1f} %"


def _pts(x: float | None) -> str:
    return "–" if x is None else f"{x:+.1f} pts"


def _verdict(v: Mapping[str, bool | None]) -> str:
    return ", ".join("–" if v[k] is None else ("yes" if v[k] else "NO") for k in ("sign", "delta", "absolute"))

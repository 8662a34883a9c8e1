"""Fit the chip schedule model's free constants (hop latency, kernel start, block dispatch, launch floor) to the
training facts.

The facts (perf/calibration/facts.toml, with their sources) are the chip's HCA TP4 16x256 decode swimlane, the
launch probes and the seed cases of the corpus (perf/cases, `[fit] corpus`); nothing else is fitted (other
published figures are held back to validate the model). The kernel costs come from the pypto cost cache only
(never a cold simulation: a kernel not in the cache gets its roofline estimate, flagged in the table). Writes the
fitted constants and every fact's residual to perf/calibration/result.json (or -o FILE); `--check` refits and
compares with that file instead. Prints the residuals and the per-task table against the swimlane, under the
fitted chip model and the legacy one.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from ..common import UsageError, add_progress_argument, progress_bars

NAME = "calibrate"
HELP = "fit the chip schedule model to the hardware facts; per-task table vs the chip's swimlane"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--facts", default=None, metavar="FILE", help="facts file (default: perf/calibration/facts.toml)")
    p.add_argument("-o", "--output", default=None, metavar="FILE",
                   help="result file (default: perf/calibration/result.json)")
    p.add_argument("--check", action="store_true", help="refit and compare with the result file; write nothing")
    p.add_argument("--swimlane", action="store_true",
                   help="only the per-task table vs the swimlane, with the committed constants (no fit)")
    p.add_argument("--cost-cache", default=None, metavar="DIR", help="cost-model cache directory (read only)")
    add_progress_argument(p)      # a bar of the fit's evaluations: a fit takes a few minutes
    p.add_argument("--block-issue", choices=("cores", "grid"), default=None,
                   help="rule 7's issue rule to fit under (default: the result file's, else the committed "
                        "result's; grid: every logical block; write it elsewhere with -o to compare)")
    p.add_argument("--early-dispatch", choices=("on", "off"), default=None,
                   help="rule 9 (staging consumers of allow-early-resolve producers) to fit under (default: the "
                        "result file's, else the committed result's)")
    p.add_argument("--cross-rank", choices=("on", "off"), default=None,
                   help="rule 10 (collectives' link transfer and signal tasks) to fit under (default: the result "
                        "file's, else the committed result's)")


def run(args: argparse.Namespace) -> int:
    from dspark_ir.hardware import HARDWARE
    from perf import calibrate as cal
    from perf.costs import PyptoCosts
    from perf.schedule import CHIP_BLOCK_MODEL, ScheduleParams, fitted_constants, fitted_rules

    facts_path = Path(args.facts) if args.facts else cal.FACTS
    out = Path(args.output) if args.output else cal.RESULT
    if args.check and args.swimlane:
        raise UsageError("--check and --swimlane exclude each other")
    if args.check and not out.is_file():
        raise UsageError(f"{out}: no result file to check against", "--check")
    try:
        facts = cal.load_facts(facts_path)
    except cal.CalibrationError as e:
        raise UsageError(str(e)) from None
    source = PyptoCosts(cache=args.cost_cache, offline=True)
    rules = fitted_rules(out if out.is_file() else cal.RESULT)   # a new -o FILE starts from the committed rules
    if args.block_issue is not None:
        rules["block_issue"] = args.block_issue
    if args.early_dispatch is not None:
        rules["early_dispatch"] = args.early_dispatch == "on"
    if args.cross_rank is not None:
        rules["cross_rank"] = args.cross_rank == "on"
    try:
        tasks, costs = cal.swimlane_graph(facts, source)
        if args.swimlane:
            constants = fitted_constants(out) if out.is_file() else {}
            chip = ScheduleParams.chip(**constants, **rules)
            for params in (chip, ScheduleParams()):
                print(cal.swimlane_table(facts, tasks, costs, params)[0] + "\n")
            return 0
        corpus = facts["fit"].get("corpus")
        base = ScheduleParams(block_model=CHIP_BLOCK_MODEL, dispatchers=HARDWARE.aicpu_schedulers, name="chip",
                              **rules)
        sides = cal.corpus_sides(str(corpus), source, base) if corpus else []
        bars = progress_bars(args, " evaluations")       # their number is not known ahead: no total
        bar = bars(None) if bars is not None else None
        try:
            fit = cal.calibrate(facts, tasks, costs, base=base, cases=sides,
                                progress=None if bar is None else lambda: bar.update(1))
        finally:
            if bar is not None:
                bar.close()
    except cal.CalibrationError as e:
        raise UsageError(str(e)) from None
    tables = [cal.swimlane_table(facts, tasks, costs, p) for p in (fit.params, ScheduleParams())]
    print(f"fit: {fit.evaluations} evaluations, loss {fit.loss:.6f}, inputs {fit.digest}")
    for k, v in fit.to_json()["constants"].items():
        print(f"  {k} = {v['value']:g} cycles ({v['us']:g} µs)")
    print("\n" + cal.residual_table(fit) + "\n")
    for text, _ in tables:
        print(text + "\n")
    missing = sorted({t.name for t in tasks if costs[t.id].source == "roofline" and "no cached" in costs[t.id].note})
    if missing:
        print(f"note: not in the cost cache, roofline estimates used: {', '.join(missing)}")
    if args.check:
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            text = cal.write_result(fit, [s for _, s in tables], Path(tmp) / "result.json")
        same = text == out.read_text()
        print(f"check: {'identical to' if same else 'DIFFERS from'} {out}")
        return 0 if same else 1
    cal.write_result(fit, [s for _, s in tables], out)
    print(f"wrote {out}")
    return 0

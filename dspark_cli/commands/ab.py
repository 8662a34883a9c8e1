"""Estimated layer latency per pass configuration: all on, all off, leave-one-out, add-one-in; or an A/B of
pipelines (`-p A -p B`) or of graphs (`dspark ab before.dsir after.dsir -p none`).

Targets are layer names or .dsir files. Without -p, each target gets the toggle matrix of the default pipeline;
with -p (repeatable: default, none, all-off, cleanup, -PASS, +PASS, step:N or a pipeline string with options),
exactly those pipelines, the first being the reference of the A/B line. --enable/--disable/--only/--pass-option
apply to every variant but all-off, --plugin loads passes first (as in `dspark opt`).

For each layer (at one shape: config, TP, batch, S, cache lengths) every variant of the pass pipeline
(perf/ab.py) is lowered and estimated: per-kernel cycles from pypto's cost model (cached by kernel source
hash; kernels without a pypto template get a roofline estimate, flagged), composed by the schedule model
(perf/schedule.py), against the 910B2 roofline (dspark_ir/hardware.py).

Writes into DIR: ab.md (tables), ab.json (every number), onoff.png, waterfall_<layer>.png and
traces/<layer>.<variant>.trace.json (Perfetto / chrome://tracing) for all-off and default.
Kernel simulations run on this machine (--executor local) or on a Dask cluster (--scheduler tcp://HOST:PORT).

--cases FILE|all: instead of layers, the case corpus (perf/cases/*.toml, perf/cases.py): per published hardware
measurement, hardware before -> after beside the prediction, the errors, a verdict and trust flags; writes
DIR/cases.json and DIR/cases.md.
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path

from dspark_ir.fsutil import AtomicOutputDir

from ..common import (
    CommandLine,
    UsageError,
    add_executor_arguments,
    add_progress_argument,
    add_toggle_arguments,
    executor_from_args,
    is_graph_file,
    load_plugins,
    pass_options,
    progress_bars,
    toggle_words,
    versions,
)

NAME = "ab"
HELP = "A/B matrix of the passes: estimated latency, Δ%%, roofline ratio, plots"
DEFAULT_LAYERS = ("decode-swa", "decode-hca", "decode-csa")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("layers", nargs="*", metavar="LAYER|FILE",
                   help=f"layers or .dsir files (default: {' '.join(DEFAULT_LAYERS)})")
    p.add_argument("--config", default="flash", help="model config (default: flash)")
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel size (default: the config's, 4 at flash)")
    p.add_argument("--batch", type=int, default=None,
                   help="decode requests per rank B (default: the config's, 16 at flash)")
    p.add_argument("--seq", type=int, default=None, help="tokens per request S (default: the config's, 8 at flash)")
    g = p.add_argument_group("pipelines")
    g.add_argument("-p", "--pipeline", action="append", default=[], metavar="PIPELINE",
                   help="estimate exactly these pipelines, the first the A/B reference: default, none, all-off, "
                        "cleanup, -PASS (write -p=-PASS), +PASS, step:N or a pipeline string such as "
                        "'canonicalize,split-m-fanout{ways=8},dce' (repeatable; default: the toggle matrix)")
    g.add_argument("--a", metavar="PIPELINE", help="the A side of an A/B of two pipelines (the same as the first -p)")
    g.add_argument("--b", metavar="PIPELINE", help="the B side (the same as a second -p)")
    add_toggle_arguments(g)
    p.add_argument("--csa-context", type=int, default=256, metavar="N",
                   help="max_context of decode-csa (default 256: the seed's published 16 x 256 case; the static "
                        "top-k bypass applies); 0 = the cache capacity")
    p.add_argument("--hca-context", type=int, default=0, metavar="N",
                   help="max_context of decode-hca (default 0 = the cache capacity)")
    p.add_argument("--passes", default=None, metavar="A,B",
                   help="passes for leave-one-out / add-one-in (default: every optimisation pass)")
    p.add_argument("--no-loo", action="store_true", help="skip leave-one-out variants")
    p.add_argument("--no-aoi", action="store_true", help="skip add-one-in variants")
    p.add_argument("--no-steps", action="store_true", help="skip the waterfall's cumulative steps")
    p.add_argument("--source", choices=("pypto", "roofline"), default="pypto",
                   help="per-kernel costs: pypto's cost model (default) or the roofline only")
    p.add_argument("--offline", action="store_true", help="never run pypto: cached cost-model results only")
    p.add_argument("--dispatch-cycles", type=float, default=None, help="per-task dispatch overhead (default 930)")
    p.add_argument("--model", choices=("chip", "legacy"), default="chip",
                   help="schedule model (perf/schedule.py): chip = hop latency, kernel start, block dispatch "
                        "and launch floor fitted by `dspark calibrate` (default); legacy = the model before issue 16")
    p.add_argument("--block-model", choices=("work", "span", "grid"), default=None,
                   help="block rule (perf/schedule.py rule 2) instead of the model's own (chip: grid; legacy: work): "
                        "work = W / B, span = S / waves, grid = max of the two (a sensitivity variant)")
    p.add_argument("--block-issue", choices=("cores", "grid"), default=None,
                   help="blocks a task's dispatch issues (perf/schedule.py rule 7) instead of the model's own (cores): "
                        "cores = min(grid, cores of its kind); grid = every logical block of its SPMD grid")
    p.add_argument("--early-dispatch", choices=("on", "off"), default=None,
                   help="staging of consumers of allow-early-resolve producers (perf/schedule.py rule 9) instead of "
                        "the model's own (chip: as fitted; legacy: off)")
    p.add_argument("--cross-rank", choices=("on", "off"), default=None,
                   help="collectives' link transfer and signal tasks (perf/schedule.py rule 10) instead of the "
                        "model's own (chip: as fitted; legacy: off)")
    p.add_argument("--pypto-program", action="store_true",
                   help="cross-check: run the default and all-off layers' templated parts as one pypto program each")
    p.add_argument("--stage", default=None, metavar="GLOB,GLOB",
                   help="task-name globs of the stage also reported alone (default: each layer's sparse attention, "
                        "the scope of the seed's isolated HCA benchmark; see perf/ab.py STAGES)")
    p.add_argument("--cases", default=None, metavar="FILE|all",
                   help="run the case corpus instead of layers: a case file (.toml) or 'all' (perf/cases/*.toml); "
                        "writes DIR/cases.json and DIR/cases.md")
    p.add_argument("-o", "--output", default="ab-out", metavar="DIR", help="output directory (default: ab-out)")
    p.add_argument("--no-plots", action="store_true", help="no PNG plots")
    p.add_argument("--no-traces", action="store_true", help="no trace JSON files")
    add_progress_argument(p)
    add_executor_arguments(p)


def shape(args: argparse.Namespace) -> tuple[int, int, int]:
    """(TP, B, S): the flags, else the config's (flash: 4, 16, 8; tiny: 2, 4, 4)."""
    from goldens.config import config_by_name

    config = config_by_name(args.config)
    return tuple(getattr(args, k) if getattr(args, k) is not None else getattr(config, k)  # type: ignore[return-value]
                 for k in ("tp", "batch", "seq"))


def command_line(args: argparse.Namespace) -> str:
    line = CommandLine("ab", *args.layers).option("--config", args.config)
    for flag, value in zip(("--tp", "--batch", "--seq"), shape(args)):     # as run, whatever the config's defaults
        line.option(flag, value)
    for flag in ("csa_context", "hca_context", "source"):
        line.option("--" + flag.replace("_", "-"), getattr(args, flag))
    line.add(*(f"-p={text}" for text in args.pipeline))         # "-p=-PASS": a value may start with "-"
    line.add(*toggle_words(args))
    line.option("--passes", args.passes or None).option("--stage", args.stage or None)
    for flag in ("no_loo", "no_aoi", "no_steps", "offline", "pypto_program"):
        line.flag("--" + flag.replace("_", "-"), getattr(args, flag))
    if args.dispatch_cycles is not None:
        line.option("--dispatch-cycles", f"{args.dispatch_cycles:g}")
    if args.model != "chip":
        line.option("--model", args.model)
    line.option("--block-model", args.block_model).option("--block-issue", args.block_issue).option(
        "--early-dispatch", args.early_dispatch).option("--cross-rank", args.cross_rank)
    return str(line.option("-o", args.output))


def _cases(args):
    from perf.ab import Case, Shape

    layers = args.layers or list(DEFAULT_LAYERS)
    tp, batch, seq = shape(args)
    cases = []
    for layer in layers:
        if is_graph_file(layer):
            cases.append(Case.of_file(layer))
            continue
        params = ()
        if layer == "decode-csa" and args.csa_context:
            params = (("max_context", args.csa_context),)
        if layer == "decode-hca" and args.hca_context:
            params = (("max_context", args.hca_context),)
        cases.append(Case(layer, Shape(args.config, tp, batch, seq, params)))
    return cases


def _progress(args: argparse.Namespace, total: int):
    bars = progress_bars(args, "variant")
    return None if bars is None else bars(total)


def run(args: argparse.Namespace) -> int:
    if args.cases is not None:
        if args.layers:
            raise UsageError("--cases: give layers or --cases, not both (the cases name their layers)")
        from perf.cases import load_cases

        corpus = load_cases(args.cases)                # bad case files stop here, before any output
        with AtomicOutputDir(args.output) as out:
            return _run_corpus(args, corpus, out)
    with AtomicOutputDir(args.output) as out:     # DIR is swapped in whole at the end; a failure leaves nothing
        return _ab(args, out)


def _cost_source(args):
    """(cost source, executor or None) of the flags."""
    from perf.costs import PyptoCosts, RooflineCosts

    executor = None if args.source == "roofline" or args.offline else executor_from_args(args)
    source = RooflineCosts() if args.source == "roofline" else PyptoCosts(
        cache=args.cost_cache, offline=args.offline, executor=executor)
    return source, executor


def _params(args):
    from perf.schedule import ScheduleParams

    params = ScheduleParams.named(args.model)
    if args.block_model is not None:
        params = replace(params, block_model=args.block_model)
    if args.block_issue is not None:
        params = replace(params, block_issue=args.block_issue)
    if args.early_dispatch is not None:
        params = replace(params, early_dispatch=args.early_dispatch == "on")
    if args.cross_rank is not None:
        params = replace(params, cross_rank=args.cross_rank == "on")
    return params if args.dispatch_cycles is None else replace(params, dispatch_cycles=args.dispatch_cycles)


def _run_corpus(args: argparse.Namespace, corpus, out: AtomicOutputDir) -> int:
    from perf.cases import run_cases
    from perf.costs import PyptoCosts

    source, executor = _cost_source(args)
    bar = _progress(args, sum(1 for c in corpus if not c.unsupported))
    try:
        report = run_cases(corpus, source, _params(args), progress=bar)
    finally:
        if bar is not None:
            bar.close()
        if executor is not None:
            executor.close()
    line = CommandLine("ab").option("--cases", args.cases).option("--source", args.source).flag(
        "--offline", args.offline)
    if args.model != "chip":
        line.option("--model", args.model)
    line.option("--block-model", args.block_model).option("--block-issue", args.block_issue).option(
        "--early-dispatch", args.early_dispatch).option("--cross-rank", args.cross_rank)
    if args.dispatch_cycles is not None:
        line.option("--dispatch-cycles", f"{args.dispatch_cycles:g}")
    report.notes.append(f"Reproduce: `{line.option('-o', args.output)}`")
    if isinstance(source, PyptoCosts):
        report.notes.append(f"pypto cost model: {source.ran} kernels simulated in this run, {source.hits} cache hits"
                            + ("; offline: uncached kernels are roofline estimates (flagged)" if args.offline else ""))
    written = [out.write_text("cases.json", json.dumps(report.to_json(), indent=1, default=str) + "\n"),
               out.write_text("cases.md", report.markdown())]
    print(report.summary())
    for row in report.table():
        print(row)
    if report.rules:
        print("\nThe model's rules (every case rescheduled under each combination, committed constants, bold = the "
              "one above):")
        for row in report.rule_table():
            print(row)
    print("trust flags: " + "; ".join(f"{k} = {v}" for k, v in _legend().items()))
    print(f"wrote {', '.join(str(out.shown / Path(w).relative_to(out.root)) for w in written)}")
    return 0


def _legend():
    from perf.trust import LEGEND

    return LEGEND


def _ab(args: argparse.Namespace, out: AtomicOutputDir) -> int:
    if (args.a is None) != (args.b is None):
        raise UsageError("give both --a and --b (or -p A -p B)", "--a/--b")
    if args.a is not None:
        args.pipeline = [args.a, args.b, *args.pipeline]
    from perf.ab import Toggles, optimisation_passes, run_ab, variants
    from perf.costs import PyptoCosts
    from perf.trace import write_trace

    known = optimisation_passes()
    chosen = None
    if args.passes:
        chosen = [p.strip() for p in args.passes.split(",") if p.strip()]
        bad = [p for p in chosen if p not in known]
        if bad:
            raise UsageError(f"--passes: '{bad[0]}' is not an optimisation pass of the default pipeline "
                             f"({', '.join(known)})")
    stage = None
    if args.stage is not None:
        globs = [g.strip() for g in args.stage.split(",") if g.strip()]
        if not globs:
            raise UsageError("--stage: give at least one task-name glob, e.g. 'hca.hca_*'")
        stage = ("--stage " + ",".join(globs), globs)
    load_plugins(args.plugin)
    cases = _cases(args)
    if args.pipeline:
        from perf.sweep import pipeline_variant

        vlist = [pipeline_variant(text) for text in dict.fromkeys(args.pipeline)]
    else:
        vlist = variants(chosen, loo=not args.no_loo, aoi=not args.no_aoi, steps=not args.no_steps)
    toggles = Toggles(tuple(args.enable), tuple(args.disable), tuple(args.only), tuple(pass_options(args).items()))
    vlist = [v.toggled(toggles) for v in vlist]
    for v in vlist:
        v.context().effective_pipeline()            # a bad toggle or option: one line now, before any lowering
    source, executor = _cost_source(args)
    runs_on = executor.describe() if executor is not None else ""
    params = _params(args)
    program = None
    if args.pypto_program:
        from perf.program import cross_check

        program = lambda r, c: cross_check(r.tg, r.estimate, params, workers=args.workers,  # noqa: E731
                                          timeout=max(args.timeout, 3600.0))
    bar = _progress(args, len(cases) * len(vlist))
    try:
        report = run_ab(cases, source, params, variant_list=vlist, program=program, stage=stage,
                        progress=bar)
    finally:
        if bar is not None:
            bar.close()
        if executor is not None:
            executor.close()
    if args.pipeline:
        report.compare = [v.name for v in vlist]
    report.notes.append(f"Reproduce: `{command_line(args)}`")
    if any(not c.path for c in cases):
        report.notes.append(_cache_note(args, [c for c in cases if not c.path]))
    report.notes += _file_notes([c for c in report.cases if c.case.path])
    if isinstance(source, PyptoCosts):
        where = f" on {runs_on}" if runs_on and source.ran else ""
        report.notes.append(f"pypto cost model: {source.ran} kernels simulated in this run{where}, {source.hits} "
                            f"cache hits (cache {source.cache})")
    written = [out.write_text("ab.md", report.markdown()),
               out.write_text("ab.json", json.dumps({**report.to_json(), "provenance": _provenance(args, vlist)},
                                                    indent=1, default=str) + "\n")]
    if not args.no_traces:
        for c in report.cases:
            for name in ("all-off", "default"):
                r = c.results.get(name)
                if r is not None:
                    path = out.path(f"traces/{c.case.layer.removesuffix('.dsir')}.{name}.trace.json")
                    path.parent.mkdir(parents=True, exist_ok=True)
                    write_trace(path, r.estimate.schedule, f"{c.case.label()} {name}")
                    written.append(path)
    if not args.no_plots:
        written += report.plots(out.root)
    _print_summary(report)
    shown = [str(out.shown / Path(w).relative_to(out.root)) for w in written[:3]]     # the paths after the swap
    print(f"wrote {', '.join(shown)}{' …' if len(written) > 3 else ''} ({len(written)} files)")
    return 0


def _provenance(args, vlist) -> dict:
    """ab.json's provenance record: every variant's effective pipeline (the environment is not applied: each
    variant says what it runs), the toggles from the flags, versions."""
    record = {"command": command_line(args), "environment": {}, "environment_note": "variants ignore "
              "DSPARK_DISABLE_PASSES", "enabled": list(args.enable), "disabled": list(args.disable),
              "only": list(args.only), "options": list(args.pass_option), "plugins": list(args.plugin),
              "variants": {v.name: str(v.context().effective_pipeline()) for v in vlist}}
    record["versions"] = versions()
    return record


def _file_notes(files) -> list[str]:
    """The A/B of two or more .dsir files: each file's latency under each pipeline, vs the first file."""
    if len(files) < 2:
        return []
    notes = []
    for name in files[0].results:
        ref = files[0].latency(name)
        parts = [f"{files[0].case.layer} {ref:.1f} µs"]
        for c in files[1:]:
            pct = f" ({100 * (ref - c.latency(name)) / ref:+.1f} % vs {files[0].case.layer})" if ref else ""
            parts.append(f"{c.case.layer} {c.latency(name):.1f} µs{pct}")
        notes.append(f"A/B of the files under `{name}`: " + "; ".join(parts))
    return notes


def _cache_note(args, cases) -> str:
    parts = []
    for c in cases:
        ctx = dict(c.shape.params).get("max_context")
        parts.append(f"{c.layer}: {'max_context = ' + str(ctx) if ctx else 'cache capacity (no max_context)'}")
    return "Cache lengths: " + "; ".join(parts) + "."


def _print_summary(report) -> None:
    for note in report.notes:
        if note.startswith("A/B"):
            print(note)
    if report.validation is not None:
        print(report.validation.summary() + " (ab.md: \"How far to believe a Δ\")")
    for c in report.cases:
        print(f"\n{c.case.label()}")
        for line in report._case_table(c):
            print(line)
        for line in report._case_notes(c):
            print(line.strip())

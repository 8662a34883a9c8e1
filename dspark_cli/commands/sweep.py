"""Estimated latency over a grid of shapes × pipelines: one table, plots per swept axis, resumable.

The grid is every combination of the layers, --config, --tp, --batch, --seq and the layer-parameter axes
(--context for max_context, --param NAME=V1,V2 for any other, e.g. a prefill layer's chunk), each lowered
through every -p pipeline (default: default and all-off). A parameter axis applies to the layers that take
it; impossible shapes (a TP the config does not support) are left out with a note.

Writes into DIR: sweep.md (the table), sweep.json (every number), sweep_<layer>_<axis>.png (latency against
each swept axis, one line per pipeline) and points/<id>.json, one per finished point, written as each point
finishes: run the same command again after an interrupt and the finished points are not redone.
Kernel simulations run on this machine (--executor local) or on a Dask cluster (--scheduler tcp://HOST:PORT).
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace

from dspark_ir.fsutil import OutputDir

from ..common import (
    CommandLine,
    UsageError,
    add_executor_arguments,
    add_progress_argument,
    executor_from_args,
    progress_bars,
)

NAME = "sweep"
HELP = "estimated latency over a grid of shapes x pipelines (table, plots; resumable; local or Dask)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("layers", nargs="+", metavar="LAYER", help="layers to sweep (see `dspark list layers`)")
    g = p.add_argument_group("the grid (comma lists; K = 1024, e.g. 8K,16K,128K)")
    g.add_argument("--config", default="flash", metavar="C,C", help="model configs (default: flash)")
    g.add_argument("--tp", default=None, metavar="N,N", help="tensor-parallel sizes (default: the config's)")
    g.add_argument("--batch", default=None, metavar="B,B", help="decode requests per rank (default: the config's)")
    g.add_argument("--seq", default=None, metavar="S,S", help="tokens per request (default: the config's)")
    g.add_argument("--context", default=None, metavar="N,N",
                   help="max_context of the layers that take it (decode-csa, decode-hca; default: the cache capacity)")
    g.add_argument("--param", action="append", default=[], metavar="NAME=V,V",
                   help="any other layer parameter axis, for the layers that take it (repeatable)")
    g.add_argument("-p", "--pipeline", action="append", default=[], metavar="PIPELINE",
                   help="a pipeline: default, all-off, cleanup, -PASS (write -p=-PASS), +PASS, step:N, or a pass "
                        "pipeline string such as 'canonicalize,cse,split-m-fanout{ways=4}' (repeatable; default: "
                        "default and all-off)")
    p.add_argument("--stage", default=None, metavar="GLOB,GLOB",
                   help="estimate only the tasks whose names match, scheduled alone (as dspark ab --stage)")
    p.add_argument("--source", choices=("pypto", "roofline"), default="pypto",
                   help="per-kernel costs: pypto's cost model (default) or the roofline only")
    p.add_argument("--offline", action="store_true", help="never run pypto: cached cost-model results only")
    p.add_argument("--dispatch-cycles", type=float, default=None, help="per-task dispatch overhead (default 930)")
    p.add_argument("--model", choices=("chip", "legacy"), default="chip",
                   help="schedule model: chip (calibrated, default) or legacy (see `dspark ab --help`)")
    p.add_argument("-o", "--output", default="sweep-out", metavar="DIR", help="output directory (default: sweep-out)")
    p.add_argument("--no-plots", action="store_true", help="no PNG plots")
    add_progress_argument(p)
    add_executor_arguments(p)


def grid_from_args(args: argparse.Namespace):
    from perf.sweep import Grid, parse_param, parse_values

    def axis(text, what):
        return (None,) if text is None else parse_values(text, what)

    params = []
    if args.context is not None:
        params.append(("max_context", parse_values(args.context, "--context")))
    for text in args.param:
        name, values = parse_param(text)
        if any(name == n for n, _ in params):
            raise UsageError(f"--param {name}: given twice" + (" (--context sets max_context)"
                                                                if name == "max_context" else ""))
        params.append((name, values))
    configs = tuple(dict.fromkeys(c.strip() for c in args.config.split(",") if c.strip()))
    if not configs:
        raise UsageError("--config: give at least one config (tiny, flash)")
    return Grid(tuple(dict.fromkeys(args.layers)), configs, axis(args.tp, "--tp"), axis(args.batch, "--batch"),
                axis(args.seq, "--seq"), tuple(params), tuple(dict.fromkeys(args.pipeline)) or ("default", "all-off"))


def command_line(args: argparse.Namespace) -> str:
    line = CommandLine("sweep", *args.layers)
    for flag in ("config", "tp", "batch", "seq", "context"):
        line.option(f"--{flag}", getattr(args, flag))
    line.repeated("--param", args.param)
    line.add(*(f"-p={text}" for text in args.pipeline))         # "-p=-PASS": a value may start with "-"
    line.option("--stage", args.stage).option("--source", args.source).flag("--offline", args.offline)
    if args.dispatch_cycles is not None:
        line.option("--dispatch-cycles", f"{args.dispatch_cycles:g}")
    if args.model != "chip":
        line.option("--model", args.model)
    return str(line.option("-o", args.output))


def run(args: argparse.Namespace) -> int:
    from dspark_ir import layers
    from perf.costs import PyptoCosts, RooflineCosts
    from perf.schedule import ScheduleParams
    from perf.sweep import run_sweep

    for layer in args.layers:
        layers.layer_spec(layer)                      # unknown layer: one line with a did-you-mean
    points, skipped = grid_from_args(args).points()
    stage = None
    if args.stage is not None:
        stage = [g.strip() for g in args.stage.split(",") if g.strip()]
        if not stage:
            raise UsageError("--stage: give at least one task-name glob, e.g. 'hca.hca_*'")
    out = OutputDir(args.output)
    params = ScheduleParams.named(args.model)
    if args.dispatch_cycles is not None:
        params = replace(params, dispatch_cycles=args.dispatch_cycles)
    executor = None if args.source == "roofline" or args.offline else executor_from_args(args)
    runs_on = executor.describe() if executor is not None else ""
    source = RooflineCosts() if args.source == "roofline" else PyptoCosts(
        cache=args.cost_cache, offline=args.offline, executor=executor)
    try:
        report = run_sweep(points, source, out, params=params, stage=stage, progress=progress_bars(args, "point"),
                           skipped=skipped)
    finally:
        if executor is not None:
            executor.close()
    report.notes.append(f"Reproduce (and resume): `{command_line(args)}`")
    report.notes.append(f"{len(report.points)} points: {report.resumed} recorded by an earlier run, "
                        f"{len(report.results) - report.resumed} estimated now, {len(report.incomplete)} incomplete")
    if isinstance(source, PyptoCosts):
        where = f" on {runs_on}" if runs_on and report.simulated else ""
        report.notes.append(f"pypto cost model: {report.simulated} kernels simulated in this run{where}; "
                            f"{report.cache_hits} kernel look-ups answered by the cache, {report.cache_misses} "
                            f"not (cache {source.cache})")
    written = [out.write_text("sweep.md", report.markdown()),
               out.write_text("sweep.json", json.dumps(report.to_json(), indent=1, default=str) + "\n")]
    if not args.no_plots:
        written += report.plots(out.root)
    print(report.markdown(), end="")
    print(f"wrote {', '.join(str(w) for w in written[:3])}{' …' if len(written) > 3 else ''} ({len(written)} files)")
    if report.incomplete:
        print(f"dspark: {len(report.incomplete)} points incomplete (a kernel run timed out or crashed); "
              "run the same command again to retry them", file=sys.stderr)
        return 1
    return 0

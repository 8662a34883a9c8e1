"""Estimated latency of one graph: a .dsir file or a layer, through a pipeline (default: the default pipeline;
`-p none`: the graph as written), lowered, each kernel costed by pypto 0.2.0's cost model (cached by kernel
source hash, as `dspark ab`; kernels without a pypto template get the roofline, flagged) or `--source roofline`,
composed by the schedule model against the 910B2 roofline (perf/estimate.py).

    dspark estimate decode-swa --config flash --tp 4
    dspark estimate after.dsir -p none --source roofline
    dspark estimate decode-csa -p 'canonicalize,split-m-fanout{ways=8},dce' --plugin my_passes --json est.json
"""
from __future__ import annotations

import argparse
import json
from dataclasses import replace

from ..common import (
    CommandLine,
    UsageError,
    add_executor_arguments,
    add_progress_argument,
    add_target_arguments,
    add_toggle_arguments,
    emit,
    executor_from_args,
    load_graph,
    load_plugins,
    pass_options,
    progress_bars,
    provenance,
    toggle_words,
)

NAME = "estimate"
HELP = "estimated latency of a graph or layer through a pipeline (pypto cost model or roofline)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_target_arguments(p)
    g = p.add_argument_group("pipeline")
    g.add_argument("-p", "--pipeline", default="default", metavar="PIPELINE",
                   help="'default' (the default pipeline, as opt and compile), 'none' (the graph as written) or a "
                        "pipeline string such as 'canonicalize,split-m-fanout{ways=8},dce' (default: default)")
    add_toggle_arguments(g)
    g.add_argument("--no-env", action="store_true", help="ignore DSPARK_DISABLE_PASSES")
    p.add_argument("--source", choices=("pypto", "roofline"), default="pypto",
                   help="per-kernel costs: pypto's cost model (default) or the roofline only")
    p.add_argument("--offline", action="store_true", help="never run pypto: cached cost-model results only")
    p.add_argument("--model", choices=("chip", "legacy"), default="chip",
                   help="schedule model (perf/schedule.py), as ab: chip = hop latency, kernel start, block dispatch "
                        "and launch floor fitted by `dspark calibrate` (default); legacy = the model before issue 16")
    p.add_argument("--dispatch-cycles", type=float, default=None, help="per-task dispatch overhead (default 930)")
    p.add_argument("--kernels", type=int, default=12, metavar="N", help="kernel rows to print (default 12; 0: none)")
    p.add_argument("--json", metavar="FILE", help="write the estimate (every kernel row) as JSON")
    add_progress_argument(p)
    add_executor_arguments(p)


def command_line(args: argparse.Namespace) -> str:
    line = CommandLine("estimate", args.target).layer(args).option("-p", args.pipeline)
    line.add(*toggle_words(args)).flag("--no-env", args.no_env).option("--source", args.source)
    line.flag("--offline", args.offline).environment(not args.no_env)
    if args.model != "chip":
        line.option("--model", args.model)
    if args.dispatch_cycles is not None:
        line.option("--dispatch-cycles", f"{args.dispatch_cycles:g}")
    return str(line)


def run(args: argparse.Namespace) -> int:
    from lowering import compile
    from passes import PassContext
    from perf.costs import PyptoCosts, RooflineCosts
    from perf.estimate import estimate, kernel_table
    from perf.schedule import ScheduleParams

    if args.kernels < 0:
        raise UsageError(f"--kernels: must be >= 0, got {args.kernels}")
    load_plugins(args.plugin)
    text = args.pipeline.strip()
    ctx = PassContext(pipeline=None if text == "default" else "" if text == "none" else text,
                      enabled=tuple(args.enable), disabled=tuple(args.disable), only=tuple(args.only),
                      options=pass_options(args), use_env=not args.no_env, verify_each=False, origin="cli")
    pipeline = ctx.effective_pipeline()          # a bad pipeline, toggle or option: one line, before any work
    c = compile(load_graph(args), pipeline="default", ctx=ctx, sources=False)
    executor = None if args.source == "roofline" or args.offline else executor_from_args(args)
    source = RooflineCosts() if args.source == "roofline" else PyptoCosts(
        cache=args.cost_cache, offline=args.offline, executor=executor)
    params = ScheduleParams.named(args.model)
    if args.dispatch_cycles is not None:
        params = replace(params, dispatch_cycles=args.dispatch_cycles)
    bar = None if args.source == "roofline" else _bar(args)
    try:
        est = estimate(c.tg, source, params, label=str(c.graph.name), progress=_update(bar))
    finally:
        if bar is not None:
            bar.close()
        if executor is not None:
            executor.close()
    print(est.summary())
    env = "".join(f"; {k}={v}" for k, v in ctx.environment().items())
    print(f"pipeline: {pipeline or 'none'} (key {pipeline.key}{env}); cost source: {source.name}; "
          f"schedule model: {params.name}")
    if args.kernels:
        print(kernel_table(est, args.kernels))
    print(f"Reproduce: {command_line(args)}")
    if args.json:
        record = {"schema": "dspark-estimate/1", "command": command_line(args), "pipeline": str(pipeline),
                  "pipeline_key": pipeline.key, "source": source.name, "schedule_model": params.name,
                  "provenance": provenance(command_line(args), ctx), **est.to_json()}
        emit(json.dumps(record, indent=1, default=str) + "\n", args.json)
    return 0


def _bar(args: argparse.Namespace):
    bars = progress_bars(args, "kernel")
    if bars is None:
        return None
    bar = bars(0)               # the kernels to simulate are known only once the cache is read
    bar.set_description("pypto cost model")
    return bar


def _update(bar):
    if bar is None:
        return None

    def update(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()
    return update

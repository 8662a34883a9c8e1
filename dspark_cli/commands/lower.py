"""Lower a graph to pypto 0.2.0 kernels and an orchestration with explicit task-ID dependencies.

Writes DIR/kernels/<task>.py (one generated pypto kernel per task), DIR/orchestrate.py (submits the tasks
in a valid order, each with deps=[...]), DIR/tasks.json (the task graph: buffers, argument regions, core
kinds, SPMD blocks, deps with their provenance, lint result, cycles) and DIR/tasks.dot. Every file is
written atomically inside DIR, and only after everything was computed.
"""
from __future__ import annotations

import argparse

from ..common import (
    NO_PASSES,
    CommandLine,
    add_progress_argument,
    add_target_arguments,
    load_graph,
    pipeline_provenance,
    progress_bars,
)

NAME = "lower"
HELP = "lower a graph to pypto kernels + orchestration (tasks.json, tasks.dot)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_target_arguments(p)
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="output directory")
    p.add_argument("-p", "--pipeline", help="pass pipeline to run first (passes package syntax; "
                                            "'default' = the default pipeline; none when omitted)")
    p.add_argument("--cycles", action="store_true",
                   help="simulate every templated kernel in pypto and record cost-model cycles in tasks.json")
    p.add_argument("--compile", action="store_true",
                   help="compile every templated kernel to pypto's execute graph; fail if one does not")
    p.add_argument("--static", action="store_true", help="emit static extents only (no pypto.DYNAMIC token dim)")
    p.add_argument("--workers", type=int, default=2, help="pypto worker processes for --cycles/--compile")
    p.add_argument("--ep", type=int, default=None,
                   help="expert-parallel ranks of the moe layer (default: the config's); at EP1 the MoE collectives "
                        "lower to their one-rank pypto forms")
    add_progress_argument(p)


def command_line(args: argparse.Namespace) -> str:
    line = CommandLine("lower", args.target).layer(args, ("tp", "batch", "seq", "ep", "context"))
    line.option("-p", args.pipeline or None).environment(bool(args.pipeline))
    for flag in ("cycles", "compile", "static"):
        line.flag(f"--{flag}", getattr(args, flag))
    return str(line.option("-o", args.output))


def run(args: argparse.Namespace) -> int:
    from lowering import compile
    from lowering.codegen import RUNTIME_SYMBOLS
    from lowering.emit import emit

    runtime = () if args.static else RUNTIME_SYMBOLS
    c = compile(load_graph(args), pipeline=args.pipeline, strict=True, runtime_symbols=runtime,
                command=command_line(args))
    checks = {}
    for mode, wanted in (("compile", args.compile), ("sim", args.cycles)):
        if wanted:
            checks[mode] = _check(c.tg, mode, args.workers, runtime, progress_bars(args, "kernel"))
    g, tg = c.graph, c.tg
    extra = {"layer": g.attributes.get("layer"), "config": g.attributes.get("config"), "tp": g.attributes.get("tp"),
             "pipeline": args.pipeline, "pipeline_key": c.pipeline_key,
             "provenance": pipeline_provenance(command_line(args), args.pipeline),
             "checks": {m: [r.to_json() for r in runs] for m, runs in checks.items()}}
    emit(c, args.output, extra=extra)
    print(f"pipeline: {c.passes.pipeline if c.passes is not None else NO_PASSES}")
    print(f"{args.output}: {len(tg)} tasks ({len(tg.kernels)} kernels, {len(c.templated)} with pypto templates), "
          f"{sum(len(t.deps) for t in tg.tasks)} deps; lint: {c.lint.summary()}")
    failed = [r for runs in checks.values() for r in runs if not r.ok]
    for r in failed:
        print(f"  pypto check failed: task {r.id} '{r.name}': {r.error}")
    if "sim" in checks:
        total = sum(t.cycles or 0 for t in tg.kernels)
        print(f"  cost-model cycles, sum over kernels: {total}")
    return 1 if failed else 0


def _check(tg, mode: str, workers: int, runtime, progress):
    from lowering.pypto_exec import check_kernels

    return check_kernels(tg, mode, workers=workers, runtime_symbols=runtime, progress=progress)

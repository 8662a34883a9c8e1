"""Lower a graph to pypto 0.2.0 kernels and an orchestration with explicit task-ID dependencies.

Writes DIR/kernels/<task>.py (one generated pypto kernel per task), DIR/orchestrate.py (submits the tasks
in a valid order, each with deps=[...]), DIR/tasks.json (the task graph: buffers, argument regions, core
kinds, SPMD blocks, deps with their provenance, lint result, cycles) and DIR/tasks.dot. Every file is
written atomically inside DIR, and only after everything was computed.
"""
from __future__ import annotations

import argparse
import importlib
import shlex

from ..common import UsageError, add_target_arguments, load_graph

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


def apply_pipeline(g, pipeline: str | None):
    """Run `pipeline` through the passes package when it is there; the graph unchanged otherwise."""
    if not pipeline:
        return g, None
    try:
        passes = importlib.import_module("passes")
    except ImportError:
        raise UsageError("-p needs the passes package, which is not installed") from None
    result = passes.run_pipeline(g, None if pipeline == "default" else pipeline)
    return result.graph, getattr(result, "cache_key", None)


def command_line(args: argparse.Namespace) -> str:
    parts = ["dspark", "lower", args.target]
    if not args.target.endswith(".dsir"):
        parts += ["--config", args.config]
        for flag in ("tp", "batch", "seq", "ep"):
            if getattr(args, flag, None) is not None:
                parts += [f"--{flag}", str(getattr(args, flag))]
    if args.pipeline:
        parts += ["-p", args.pipeline]
    for flag in ("cycles", "compile", "static"):
        if getattr(args, flag):
            parts.append(f"--{flag}")
    parts += ["-o", args.output]
    return " ".join(shlex.quote(p) for p in parts)


def run(args: argparse.Namespace) -> int:
    from dspark_ir import verify
    from lowering import LoweringError, build_task_graph, lint
    from lowering.codegen import RUNTIME_SYMBOLS
    from lowering.emit import emit

    g = load_graph(args)
    verify(g)
    g, pipeline_key = apply_pipeline(g, args.pipeline)
    tg = build_task_graph(g)
    report = lint(tg)
    if not report.ok:
        raise LoweringError(f"the lowered deps fail the lint: {report.errors[0]}")
    runtime = () if args.static else RUNTIME_SYMBOLS
    checks = {}
    for mode, wanted in (("compile", args.compile), ("sim", args.cycles)):
        if wanted:
            checks[mode] = _check(tg, mode, args.workers, runtime)
    extra = {"layer": g.attributes.get("layer"), "config": g.attributes.get("config"), "tp": g.attributes.get("tp"),
             "pipeline": args.pipeline, "pipeline_key": pipeline_key,
             "checks": {m: [r.to_json() for r in runs] for m, runs in checks.items()}}
    emit(tg, args.output, command=command_line(args), report=report, extra=extra, runtime_symbols=runtime)
    templated = sum(1 for t in tg.tasks if t.template)
    print(f"{args.output}: {len(tg)} tasks ({len(tg.kernels)} kernels, {templated} with pypto templates), "
          f"{sum(len(t.deps) for t in tg.tasks)} deps; lint: {report.summary()}")
    failed = [r for runs in checks.values() for r in runs if not r.ok]
    for r in failed:
        print(f"  pypto check failed: task {r.id} '{r.name}': {r.error}")
    if "sim" in checks:
        total = sum(t.cycles or 0 for t in tg.kernels)
        print(f"  cost-model cycles, sum over kernels: {total}")
    return 1 if failed else 0


def _check(tg, mode: str, workers: int, runtime):
    from lowering.pypto_exec import check_kernels

    return check_kernels(tg, mode, workers=workers, runtime_symbols=runtime)

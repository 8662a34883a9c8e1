"""Compile a layer end to end: the default pass pipeline (with review dumps), then the lowering.

Writes DIR as a whole (built beside it and swapped in; nothing outside it):
  DIR/dumps/      00_input.dsir, NN_<pass>.dsir per pass application, index.html (side-by-side diffs)
  DIR/opt.dsir    the optimized graph
  DIR/lowered/    kernels/*.py (generated pypto source), orchestrate.py, tasks.json, tasks.dot
  DIR/report.md   what each pass did, the task graph, the dependency lint, pypto template coverage
  DIR/report.json the same, machine-readable
"""
from __future__ import annotations

import argparse
import json

from dspark_ir.fsutil import AtomicOutputDir

from ..common import CommandLine, add_progress_argument, add_target_arguments, load_graph, progress_bars, provenance

NAME = "compile"
HELP = "default pipeline + dumps + lowering + report, into one directory"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_target_arguments(p, "LAYER|FILE")
    p.add_argument("-o", "--output", required=True, metavar="DIR", help="output directory")
    p.add_argument("-p", "--pipeline", help="pipeline string (default: the default pipeline)")
    p.add_argument("--disable", action="append", default=[], metavar="NAME", help="disable a pass (repeatable)")
    p.add_argument("--check-numerics", action=argparse.BooleanOptionalAction, default=None,
                   help="check every pass's numeric contract on seeded inputs (default: on for the tiny config)")
    p.add_argument("--cycles", action="store_true",
                   help="simulate every templated kernel in pypto and record cost-model cycles")
    add_progress_argument(p)


def command_line(args: argparse.Namespace) -> str:
    line = CommandLine("compile", args.target).layer(args).option("-p", args.pipeline or None)
    line.repeated("--disable", args.disable)
    if args.check_numerics is not None:
        line.add("--check-numerics" if args.check_numerics else "--no-check-numerics")
    return str(line.flag("--cycles", args.cycles).option("-o", args.output).environment())


def run(args: argparse.Namespace) -> int:
    with AtomicOutputDir(args.output) as out:     # DIR is swapped in whole at the end; a failure leaves nothing
        return _compile(args, out)


def _compile(args: argparse.Namespace, out: AtomicOutputDir) -> int:
    from dspark_ir import print_graph
    from lowering import compile
    from lowering.emit import emit
    from passes import PassContext

    g = load_graph(args)
    numerics = args.check_numerics
    if numerics is None:
        numerics = g.attributes.get("config") == "tiny"
    ctx = PassContext(pipeline=args.pipeline, disabled=args.disable, verify_each=True, check_numerics=numerics,
                      dump_dir=str(out.path("dumps")), source=command_line(args))
    c = compile(g, pipeline="default", ctx=ctx, strict=True, command=command_line(args))
    checks = {}
    if args.cycles:
        from lowering.pypto_exec import check_kernels

        checks["sim"] = check_kernels(c.tg, "sim", progress=progress_bars(args, "kernel"))
    extra = {"layer": g.attributes.get("layer"), "config": g.attributes.get("config"), "tp": g.attributes.get("tp"),
             "pipeline": str(c.passes.pipeline), "pipeline_key": c.pipeline_key,
             "provenance": provenance(command_line(args), ctx),
             "checks": {m: [r.to_json() for r in runs] for m, runs in checks.items()}}
    emit(c, out.path("lowered"), extra=extra)
    summary = _summary(args, c, numerics)
    summary["provenance"] = provenance(command_line(args), ctx)
    env = [f"environment: {k}={v}" for k, v in ctx.environment().items()]
    out.write_text("opt.dsir", print_graph(c.graph, header=[f"dspark: {command_line(args)}",
                                                             f"pipeline: {c.passes.pipeline}", *env]))
    out.write_text("report.json", json.dumps(summary, indent=1, sort_keys=True) + "\n")
    out.write_text("report.md", _markdown(summary))
    print(f"{args.output}: {summary['passes_changed']} of {len(c.passes.runs)} passes changed the graph; "
          f"{summary['tasks']} tasks ({summary['kernels']} kernels, {summary['templated']} with pypto templates); "
          f"lint: {c.lint.summary()}; see {args.output}/report.md and {args.output}/dumps/index.html")
    return 0


def _summary(args, c, numerics: bool) -> dict:
    """The report's facts: the graph given, what each pass did, the task graph and its lint (c: lowering.Compiled)."""
    g, result, tg = c.input, c.passes, c.tg
    from lowering.splitk import determinism

    cycles = [t.cycles for t in tg.kernels if getattr(t, "cycles", None)]
    return {
        "command": command_line(args),
        "layer": g.attributes.get("layer"), "config": g.attributes.get("config"), "tp": g.attributes.get("tp"),
        "pipeline": str(result.pipeline), "pipeline_key": result.cache_key, "check_numerics": numerics,
        "nodes_in": len(g), "nodes_out": len(result.graph),
        "passes": [{"index": r.index, "pass": r.spec, "status": r.status, "rewrites": len(r.rewrites),
                    "added": len(r.added), "removed": len(r.removed), "note": r.note,
                    "skips": [str(s) for s in r.skips][:8]} for r in result.runs],
        "passes_changed": sum(1 for r in result.runs if r.status == "changed"),
        "tasks": len(tg), "kernels": len(tg.kernels), "templated": len(c.templated),
        "untemplated_ops": c.untemplated_ops,
        "deps": sum(len(t.deps) for t in tg.tasks), "lint": c.lint.summary(), "determinism": determinism(tg.tasks),
        "cycles_sum": sum(cycles) if cycles else None,
    }


def _markdown(s: dict) -> str:
    lines = [f"# dspark compile: {s['layer']} ({s['config']}, tp {s['tp']})", "",
             f"Reproduce: `{s['command']}`", "", f"Pipeline: `{s['pipeline']}` (key `{s['pipeline_key']}`)", "",
             f"Numeric contracts checked after every pass: {'yes' if s['check_numerics'] else 'no'}", "",
             "## Passes", "", "| # | pass | status | rewrites | nodes +/- | why not / note |",
             "|---|---|---|---|---|---|"]
    for p in s["passes"]:
        why = "; ".join(p["skips"][:2]) or p["note"]
        lines.append(f"| {p['index']} | `{p['pass']}` | {p['status']} | {p['rewrites']} | "
                     f"+{p['added']} / -{p['removed']} | {why.replace('|', '/')} |")
    lines += ["", "## Lowering", "",
              f"- nodes: {s['nodes_in']} in, {s['nodes_out']} after the pipeline",
              f"- tasks: {s['tasks']} ({s['kernels']} kernels, {s['templated']} with pypto 0.2.0 templates), "
              f"{s['deps']} explicit deps",
              f"- dependency lint: {s['lint']}",
              f"- determinism: {s['determinism']}",
              f"- op kinds still without a pypto template: {', '.join(s['untemplated_ops']) or 'none'}"]
    if s["cycles_sum"] is not None:
        lines.append(f"- pypto cost-model cycles, serial sum over kernels: {s['cycles_sum']}")
    lines += ["", "Artefacts: `opt.dsir`, `dumps/index.html`, `lowered/tasks.json`, `lowered/tasks.dot`, "
              "`lowered/orchestrate.py`, `lowered/kernels/`."]
    return "\n".join(lines) + "\n"

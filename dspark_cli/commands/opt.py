"""Run a pass pipeline on a graph, like mlir-opt: `dspark opt FILE|LAYER [-p PIPELINE] [options] [-o OUT]`.

The flags build one passes.PassContext (the same object the Python API takes). The output graph goes to
stdout or -o (written atomically, only on success); reports (--time-passes, --explain, bisect traces,
reproducer hints) go to stderr; --print-ir-after* go to stdout.
"""
from __future__ import annotations

import argparse
import os

from dspark_ir.text.printer import print_graph

from ..common import UsageError, add_layer_arguments, add_toggle_arguments, emit, load_graph, load_plugins, pass_options

NAME = "opt"
HELP = "run a pass pipeline on a graph (mlir-opt style)"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", nargs="?", metavar="FILE|LAYER", help="a .dsir file, or a layer name (dspark list)")
    add_layer_arguments(p)
    p.add_argument("-o", "--output", help="write the result here (atomically) instead of stdout")
    g = p.add_argument_group("pipeline")
    g.add_argument("-p", "--pipeline", help='pass pipeline, e.g. "canonicalize,cse,split-m-fanout{ways=4}" '
                                            "(default: the default pipeline, see --print-pipeline)")
    add_toggle_arguments(g)
    g.add_argument("--no-env", action="store_true", help="ignore DSPARK_DISABLE_PASSES")
    g.add_argument("--print-pipeline", action="store_true",
                   help="print the effective pipeline, each entry with why it sits there, and exit")
    c = p.add_argument_group("checks")
    c.add_argument("--verify-each", action=argparse.BooleanOptionalAction, default=True,
                   help="run the verifier after every pass (default: on)")
    c.add_argument("--roundtrip-each", action=argparse.BooleanOptionalAction, default=None,
                   help="check print → parse after every pass (default: $DSPARK_ROUNDTRIP_EACH)")
    c.add_argument("--check-numerics", action=argparse.BooleanOptionalAction, default=None,
                   help="run the reference interpreter before/after each pass and check its numeric contract "
                        "(default: $DSPARK_CHECK_NUMERICS)")
    c.add_argument("--seed", type=int, default=0, help="seed of the sample inputs (default 0)")
    r = p.add_argument_group("reports")
    r.add_argument("--time-passes", action="store_true", help="table of wall time and rewrites per pass (stderr)")
    r.add_argument("--print-ir-after-all", action="store_true", help="print the graph after every pass (stdout)")
    r.add_argument("--print-ir-after", action="append", default=[], metavar="NAME",
                   help="print the graph after this pass (repeatable)")
    r.add_argument("--print-ir-before", action="append", default=[], metavar="NAME",
                   help="print the graph before this pass (repeatable)")
    r.add_argument("--print-ir-after-change", action="store_true",
                   help="print the graph only after passes that changed it (alone: after every such pass)")
    r.add_argument("--pass-stats", action="store_true",
                   help="per pass: sites matched, rewritten, declined, skipped by reason (stderr)")
    r.add_argument("--explain", action="append", default=[], metavar="NAME",
                   help="say what the pass rewrote and why candidates did not fire (stderr)")
    b = p.add_argument_group("bisection and reproducers")
    b.add_argument("--bisect-limit", type=int, metavar="N", help="run only the first N pass applications")
    b.add_argument("--bisect-rewrites", action="store_true", help="--bisect-limit counts single rewrites")
    b.add_argument("--repro", metavar="FILE",
                   help="where a failure writes its reproducer (default: DIR/repro.dsir with --dump-dir, "
                        "else repro.dsir in a new temporary directory; the path is printed)")
    d = p.add_argument_group("dumps")
    d.add_argument("--dump-dir", metavar="DIR", help="write 00_input.dsir, NN_<pass>.dsir and index.html here")
    d.add_argument("--dump", choices=("all", "changed"), default="all", help="snapshot every pass or only changes")
    d.add_argument("--dump-dot", action="store_true", help="also write NN_<pass>.dot")
    d.add_argument("--dump-svg", action="store_true", help="also write NN_<pass>.svg (needs graphviz)")


def context_from_args(args: argparse.Namespace):
    """The PassContext these flags describe."""
    from passes import PassContext
    from passes.infra.context import REPRO_TEMP

    options = pass_options(args)
    if args.bisect_rewrites and args.bisect_limit is None:
        raise UsageError("--bisect-rewrites needs --bisect-limit N")
    repro = args.repro or (None if args.dump_dir else REPRO_TEMP)
    return PassContext(
        pipeline=args.pipeline, disabled=tuple(args.disable), enabled=tuple(args.enable), only=tuple(args.only),
        options=options, use_env=not args.no_env, verify_each=args.verify_each,
        roundtrip_each=args.roundtrip_each, check_numerics=args.check_numerics, seed=args.seed,
        time_passes=args.time_passes, print_ir_after_all=args.print_ir_after_all,
        print_ir_after=tuple(args.print_ir_after), print_ir_before=tuple(args.print_ir_before),
        print_ir_after_change=args.print_ir_after_change, pass_stats=args.pass_stats, explain=tuple(args.explain),
        bisect_limit=args.bisect_limit,
        bisect_rewrites=args.bisect_rewrites, dump_dir=args.dump_dir, dump=args.dump, dump_dot=args.dump_dot,
        dump_svg=args.dump_svg, repro=repro, source=_source(args), plugins=tuple(args.plugin), origin="cli")


def run(args: argparse.Namespace) -> int:
    from passes import run_pipeline

    load_plugins(args.plugin)
    ctx = context_from_args(args)
    if args.print_pipeline:
        print(ctx.describe_pipeline(), end="")
        return 0
    if not args.target:
        raise UsageError("give a FILE or LAYER to optimise (or --print-pipeline)")
    result = run_pipeline(load_graph(args), ctx=ctx)
    limit = "" if result.rewrite_limit is None else f" --bisect-limit {result.rewrite_limit} --bisect-rewrites"
    header = [f"dspark opt -p {_quote(str(result.pipeline))}{limit} · cache key {result.cache_key}"]
    header += [f"environment: {k}={v} (passes it disabled are not in -p above)" for k, v in ctx.environment().items()]
    emit(print_graph(result.graph, header), args.output)
    return 0


def _source(args: argparse.Namespace) -> str:
    """How the input was named, without directories (dump headers stay free of absolute paths)."""
    target = args.target or ""
    if target.endswith(".dsir") or os.path.exists(target) or "/" in target:
        return os.path.basename(target)
    flags = [f"--{k} {v}" for k in ("config", "tp", "batch", "seq") if (v := getattr(args, k, None)) is not None]
    return " ".join([target] + flags)


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)

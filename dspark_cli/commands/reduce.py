"""Shrink a graph to a small .dsir on which a check still fails: `dspark reduce FILE|LAYER --check KIND -o OUT`.

Checks (each candidate is printed and parsed back first, so the written file fails the same way):
  crash        a pass of the pipeline raises (PassError kind `crash`)
  contract     a pass breaks its numeric contract (--check-numerics)
  invalid      a pass produces a graph that does not verify, print back or keep its signature
  race         the optimised graph lowers to a task graph whose dependency lint reports a race
  regression   the pipeline's roofline latency is worse than --against's by more than --threshold percent
The first failure found fixes the failing pass and kind; later candidates must fail the same way. The output's
header says the check and the command that reproduces the failure; the reduction itself is dspark_ir/reduce.py.
"""
from __future__ import annotations

import argparse
import os
import sys

from ..common import UsageError, add_target_arguments, load_graph

NAME = "reduce"
HELP = "shrink a graph to a minimal .dsir on which a check still fails"
CHECKS = ("crash", "contract", "invalid", "race", "regression")
INVALID_KINDS = ("invalid-graph", "roundtrip", "signature", "guarantee", "requirement")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_target_arguments(p)
    p.add_argument("--check", required=True, choices=CHECKS, help="what must keep failing (see the description)")
    p.add_argument("-p", "--pipeline", default=None, help="the pass pipeline (default: the default pipeline)")
    p.add_argument("--plugin", action="append", default=[], metavar="MODULE|FILE.py",
                   help="import a module (or file) that registers extra passes (repeatable)")
    p.add_argument("--pass", dest="pass_name", default=None, metavar="NAME",
                   help="only a failure of this pass counts (default: the first failing pass found)")
    p.add_argument("--seed", type=int, default=0, help="seed of the sample inputs of --check contract (default 0)")
    p.add_argument("--against", default="", metavar="PIPELINE",
                   help="regression: the baseline pipeline (default: none)")
    p.add_argument("--threshold", type=float, default=5.0, metavar="PCT",
                   help="regression: percent slower than the baseline that counts as failing (default 5)")
    p.add_argument("--source", choices=("roofline",), default="roofline",
                   help="regression: per-kernel costs (roofline only: a reduction runs hundreds of estimates)")
    p.add_argument("-o", "--output", default="reduced.dsir", help="the reduced graph (default: reduced.dsir)")


class _Check:
    """fails(graph) for one --check, remembering the signature (pass, kind) of the first failure."""

    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.signature: tuple[str, str] | None = None
        self.detail = ""
        self.quiet = open(os.devnull, "w")      # bisect traces and warnings of the hundreds of runs

    def __call__(self, g) -> bool:
        from dspark_ir import parse_graph, print_graph

        g = parse_graph(print_graph(g))     # the candidate as the written file will be read
        if self.args.check == "race":
            return self._race(g)
        if self.args.check == "regression":
            return self._regression(g)
        return self._pass_failure(g)

    def _context(self, pipeline):
        from passes import PassContext

        return PassContext(pipeline=pipeline, use_env=False, check_numerics=self.args.check == "contract",
                           seed=self.args.seed, repro=None, stderr=self.quiet)

    def _pass_failure(self, g) -> bool:
        from dspark_ir.errors import DsparkError
        from passes import run_pipeline
        from passes.infra.errors import PassError

        try:
            run_pipeline(g, ctx=self._context(self.args.pipeline))
        except PassError as e:
            kinds = {"crash": ("crash",), "contract": ("contract",), "invalid": INVALID_KINDS}[self.args.check]
            if e.kind not in kinds or self.args.pass_name not in (None, e.pass_name):
                return False
            signature = (e.pass_name, e.kind)
            self.signature = self.signature or signature
            if signature != self.signature:
                return False
            self.detail = e.message              # of the latest failing candidate: the smallest so far
            return True
        except DsparkError:
            return False
        return False

    def _race(self, g) -> bool:
        from dspark_ir.errors import DsparkError
        from lowering import build_task_graph
        from lowering.lint import lint
        from passes import run_pipeline

        try:
            races = lint(build_task_graph(run_pipeline(g, ctx=self._context(self.args.pipeline)).graph)).races
        except DsparkError:
            return False
        if races:
            self.detail = races[0].message
        return bool(races)

    def _regression(self, g) -> bool:
        from dspark_ir.errors import DsparkError
        from lowering import build_task_graph
        from passes import run_pipeline
        from perf.costs import RooflineCosts
        from perf.estimate import estimate

        try:
            a, b = (estimate(build_task_graph(run_pipeline(g, ctx=self._context(p)).graph), RooflineCosts())
                    for p in (self.args.against, self.args.pipeline))
        except DsparkError:
            return False
        if a.makespan_us <= 0:
            return False
        worse = (b.makespan_us - a.makespan_us) / a.makespan_us * 100
        if worse > self.args.threshold:
            self.detail = f"{worse:.1f}% slower ({a.makespan_us:.2f} → {b.makespan_us:.2f} us, roofline)"
            return True
        return False


def reproduce_command(args: argparse.Namespace, output: str) -> str:
    """The command that shows the failure on the written file."""
    import shlex

    from passes import DEFAULT_PIPELINE

    plugins = [w for spec in args.plugin for w in ("--plugin", spec)]
    pipeline = args.pipeline if args.pipeline is not None else str(DEFAULT_PIPELINE)
    name = os.path.basename(output)
    if args.check in ("crash", "contract", "invalid"):
        words = ["dspark", "opt", name, "--no-env", "-p", pipeline, *plugins]
        words += ["--check-numerics", "--seed", str(args.seed)] if args.check == "contract" else []
        return " ".join(map(shlex.quote, words)) + " -o /dev/null"
    words = ["dspark", "reduce", name, "--check", args.check, "-p", pipeline, *plugins]
    if args.check == "regression":
        words += ["--against", args.against, "--threshold", f"{args.threshold:g}"]
    return " ".join(map(shlex.quote, words)) + "   # the check fails on this file already"


def run(args: argparse.Namespace) -> int:
    from dspark_ir import print_graph
    from dspark_ir.fsutil import write_file_atomic
    from dspark_ir.reduce import reduce_graph

    from ..common import load_plugin

    if args.threshold < 0:
        raise UsageError(f"--threshold: must be at least 0, got {args.threshold:g}")
    for module in args.plugin:
        load_plugin(module)
    g = load_graph(args)
    check = _Check(args)
    reduced = reduce_graph(g, check, log=lambda s: print(s, file=sys.stderr))
    what = f"{args.check}" + (f" in pass {check.signature[0]}" if check.signature else "")
    header = [f"dspark reduce: {len(g)} → {len(reduced)} nodes; still fails: {what}",
              f"failure: {check.detail}" if check.detail else "failure: see the command below",
              f"reproduce: {reproduce_command(args, args.output)}"]
    write_file_atomic(args.output, print_graph(reduced, header))
    print(f"{args.output}: {len(reduced)} nodes (from {len(g)}); reproduce: "
          f"{reproduce_command(args, args.output)}")
    return 0

"""Instruments: hooks the manager calls around passes (checks, printing, timing, dumps, reproducers).

An instrument implements any of `start(state, g)`, `before_pass(state, run, g)`, `after_pass(state, run, before,
g)` (may raise a PassError via `run.fail(...)`; `before` is None unless the instrument sets `uses_before`),
`fail(state, error, g)` and `finish(state, result)`. Checks run before reports, so a dump never shows a graph
that failed a check as if it were fine.
"""
from __future__ import annotations

from typing import TYPE_CHECKING

from dspark_ir.errors import DsparkError
from dspark_ir.text.parser import parse_graph
from dspark_ir.text.printer import print_graph
from dspark_ir.verifier import verify

from . import properties
from .context import PassContext
from .errors import PassError

if TYPE_CHECKING:
    from dspark_ir.graph import Graph

    from .manager import OptResult, PassRun, RunState


class Instrument:
    uses_before = False    # after_pass reads its `before` graph (the manager copies it only for those that do)

    def start(self, state: "RunState", g: "Graph") -> None:
        pass

    def before_pass(self, state: "RunState", run: "PassRun", g: "Graph") -> None:
        pass

    def after_pass(self, state: "RunState", run: "PassRun", before: "Graph", g: "Graph") -> None:
        pass

    def fail(self, state: "RunState", error: PassError, g: "Graph") -> None:
        pass

    def finish(self, state: "RunState", result: "OptResult") -> None:
        pass


def build_instruments(ctx: PassContext) -> list[Instrument]:
    from .dumps import DumpWriter
    from .numerics import NumericsCheck
    from .reproducer import Reproducer

    chosen: list[Instrument] = []
    if ctx.verify_each:
        chosen.append(VerifyEach())
    if ctx.roundtrip_on:
        chosen.append(RoundTripEach())
    if ctx.numerics_on:
        chosen.append(NumericsCheck())
    if ctx.print_ir_after_all or ctx.print_ir_after or ctx.print_ir_before or ctx.print_ir_after_change:
        chosen.append(PrintIR())
    if ctx.dump_dir:
        chosen.append(DumpWriter(ctx))
    if ctx.explain:
        chosen.append(Explain())
    if ctx.time_passes:
        chosen.append(TimeReport())
    if ctx.pass_stats:
        chosen.append(PassStats())
    chosen.append(Reproducer())
    return chosen


class VerifyEach(Instrument):
    """--verify-each: the verifier after every pass that changed the graph, and its guaranteed properties."""

    def after_pass(self, state, run, before, g):
        if run.changed:
            try:
                verify(g)
            except DsparkError as e:
                raise run.fail("invalid-graph", f"produced an invalid graph: {e.message}", e.location) from None
        if run.partial:  # --bisect-rewrites stopped the pass early: its guarantees need not hold yet
            return
        broken = properties.broken(run.pass_.guarantees, g)
        if broken is not None:
            raise run.fail("guarantee", f"guarantees '{broken[0]}', but {broken[1]}")


class RoundTripEach(Instrument):
    """print → parse → structurally equal and print → parse → print identical: the input, then after every
    pass that changed the graph."""

    def start(self, state, g):
        text = print_graph(g)
        again = parse_graph(text, "<input>")
        if not again.structurally_equal(g) or print_graph(again) != text:
            raise DsparkError("the input graph does not survive print → parse", f"graph '@{g.name}'")

    def after_pass(self, state, run, before, g):
        if not run.changed:
            return
        text = print_graph(g)
        try:
            again = parse_graph(text, f"<after {run.name}>")
        except DsparkError as e:
            raise run.fail("roundtrip", f"produced a graph whose text does not parse: {e}") from None
        if not again.structurally_equal(g) or print_graph(again) != text:
            raise run.fail("roundtrip", "produced a graph that does not survive print → parse")


class PrintIR(Instrument):
    """The graph to stdout: --print-ir-before NAME (before each application of the pass), --print-ir-after-all,
    --print-ir-after NAME, and --print-ir-after-change (only after passes that changed the graph; alone, after
    every such pass)."""

    def before_pass(self, state, run, g):
        if run.name in state.ctx.print_ir_before:
            state.stdout.write(f"# -----// IR before #{run.index} {run.spec} //----- #\n")
            state.stdout.write(print_graph(g))

    def after_pass(self, state, run, before, g):
        ctx = state.ctx
        chosen = ctx.print_ir_after_all or run.name in ctx.print_ir_after
        if ctx.print_ir_after_change:
            chosen = run.changed and (chosen or not (ctx.print_ir_after_all or ctx.print_ir_after))
        if not chosen:
            return
        state.stdout.write(f"# -----// IR after #{run.index} {run.spec} ({run.status}) //----- #\n")
        state.stdout.write(print_graph(g))


class EndReport(Instrument):
    """An instrument that prints one report when the pipeline ends, whether it finished or failed."""

    def finish(self, state, result):
        self.report(state)

    def fail(self, state, error, g):
        self.report(state)

    def report(self, state):
        raise NotImplementedError


class Explain(EndReport):
    """--explain NAME: what the pass rewrote and, for candidates that did not fire, why (stderr)."""

    def report(self, state):
        out = state.stderr
        for name in state.ctx.explain:
            runs = [r for r in state.runs if r.name == name]
            if not runs:
                print(f"explain: '{name}' is not in the effective pipeline: {state.pipeline}", file=out)
            for r in runs:
                note = f" ({r.note})" if r.note else ""
                print(f"explain: #{r.index} {r.spec}: {r.status}{note}, {len(r.rewrites)} rewrites", file=out)
                for rec in r.rewrites:
                    print(f"  rewrote  {rec}", file=out)
                for limit in r.limits:
                    print(f"  stopped  {limit}", file=out)
                for skip in r.skips:
                    print(f"  skipped  {skip}", file=out)


class PassStats(EndReport):
    """--pass-stats: per pass application, the sites its match() yielded, how many it rewrote, declined (the
    rewrite no longer applied, or an earlier rewrite replaced the node), and the candidates it skipped, counted
    by reason (stderr)."""

    def report(self, state):
        out = state.stderr
        print("===- pass statistics -===", file=out)
        for r in state.runs:
            if not r.ran:
                print(f"  #{r.index} {r.spec}: {r.status}{f' ({r.note})' if r.note else ''}", file=out)
                continue
            print(f"  #{r.index} {r.spec}: {r.matched} matched, {len(r.rewrites)} rewritten, {r.declined} declined, "
                  f"{len(r.skips)} skipped", file=out)
            reasons: dict[str, int] = {}
            for skip in r.skips:
                reasons[skip.reason] = reasons.get(skip.reason, 0) + 1
            for reason, count in sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])):
                print(f"      {count:>4} skipped: {reason}", file=out)


class TimeReport(EndReport):
    """--time-passes: wall time of each pass and of its checks, rewrite counts and node deltas (stderr)."""

    def report(self, state):
        rows = [("#", "pass", "status", "wall ms", "checks ms", "rewrites", "nodes", "+add -rm ~mod")]
        for r in state.runs:
            nodes = f"{r.nodes_before}→{r.nodes_after}" if r.ran else ""
            rows.append((str(r.index), r.spec, r.status, f"{r.seconds * 1e3:.3f}", f"{r.check_seconds * 1e3:.3f}",
                         str(len(r.rewrites)), nodes, r.delta() if r.ran else ""))
        total = sum(r.seconds for r in state.runs), sum(r.check_seconds for r in state.runs)
        rows.append(("", "total", "", f"{total[0] * 1e3:.3f}", f"{total[1] * 1e3:.3f}",
                     str(sum(len(r.rewrites) for r in state.runs)), "", ""))
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        right = {0, 3, 4, 5}
        out = state.stderr
        print("===- pass execution timing report -===", file=out)
        for row in rows:
            cells = [c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths))]
            print("  " + "  ".join(cells).rstrip(), file=out)

"""The pass manager: runs the effective pipeline on a copy of a graph, with checks and instruments.

    result = run_pipeline(g, "canonicalize,cse", check_numerics=True)      # or PassManager(...).run(g)
    result.graph, result.runs[i].status / .rewrites / .added / .removed, result.pipeline.key

Each pipeline entry is one pass application (numbered from 1, the unit of --bisect-limit). Before a pass:
its `layer:` requirements (not applicable → skipped) and its required properties. After it: the input and
return signature is unchanged, then the instruments run (verifier, round trip, numeric contract, dumps,
printing). Any failure becomes a PassError that names the pass; instruments see it first (dumps mark the
run failed, the reproducer writes the input snapshot and the remaining pipeline).
"""
from __future__ import annotations

import hashlib
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from dspark_ir.errors import DsparkError
from dspark_ir.graph import EditLog, Graph
from dspark_ir.verifier import verify

from . import properties
from .analysis import open_analyses
from .base import Pass, RewriteRecord, Skip
from .context import PassContext
from .driver import Budget, drive
from .errors import PassError
from .pipeline import Pipeline


@dataclass
class PassRun:
    """What one pass application did."""

    index: int
    pass_: Pass
    status: str = "pending"        # changed | no-op | skipped | not-applicable | failed
    note: str = ""
    rewrites: list[RewriteRecord] = field(default_factory=list)
    skips: list[Skip] = field(default_factory=list)    # why candidates did not fire (not the nodes it rewrote)
    limits: list[Skip] = field(default_factory=list)   # why a node it rewrote went no further ("already X" dropped)
    matched: int = 0                # sites match() yielded (--pass-stats)
    declined: int = 0               # of those, rewrite() returned None or an earlier rewrite replaced the node
    added: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    modified: list[str] = field(default_factory=list)
    nodes_before: int = 0
    nodes_after: int = 0
    seconds: float = 0.0
    check_seconds: float = 0.0
    partial: bool = False           # --bisect-rewrites stopped inside this pass
    rewrites_before: int = 0        # global rewrite count before this pass (--bisect-rewrites)
    rewrites_used: int = 0          # global rewrite count after this pass
    snapshot: str = ""              # dump file written for it

    @property
    def name(self) -> str:
        return self.pass_.name

    @property
    def spec(self) -> str:
        return str(self.pass_)

    @property
    def changed(self) -> bool:
        return self.status == "changed"

    @property
    def ran(self) -> bool:
        return self.status in ("changed", "no-op", "failed")

    def delta(self) -> str:
        return f"+{len(self.added)} -{len(self.removed)} ~{len(self.modified)}"

    def fail(self, kind: str, what: str, location: str = "") -> PassError:
        """Mark this run failed and make the error that names it."""
        self.status = "failed"
        return PassError(f"pass '{self.name}' (#{self.index}) {what}", location, kind=kind, pass_name=self.name,
                         index=self.index)


@dataclass
class OptResult:
    """The result of a run. Under a bisect limit, `pipeline` is the part that ran (up to the last pass applied)
    and `rewrite_limit` the rewrite budget of --bisect-rewrites: the cache key is that of the graph produced."""
    graph: Graph
    pipeline: Pipeline
    runs: list[PassRun]
    rewrite_limit: int | None = None

    @property
    def changed(self) -> bool:
        return any(r.changed for r in self.runs)

    @property
    def rewrites(self) -> int:
        return sum(len(r.rewrites) for r in self.runs)

    @property
    def cache_key(self) -> str:
        if self.rewrite_limit is None:
            return self.pipeline.key
        text = f"{self.pipeline.key}\nrewrites<={self.rewrite_limit}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class RunState:
    """Shared by the manager and its instruments during one run."""

    ctx: PassContext
    pipeline: Pipeline
    input: Graph
    budget: Budget
    runs: list[PassRun] = field(default_factory=list)
    failure: PassError | None = None
    edits: EditLog | None = None                # what the current pass's edits touched (dspark_ir/graph.py)
    graph_key: tuple = (-1, ())                 # (graph version, graph.graph_key()) when last taken
    topo_index: dict[str, int] | None = None    # the graph's topological positions before the current pass

    @property
    def before(self) -> Graph | None:
        """The graph as it was before the current pass (rebuilt from the edit log on first use)."""
        if self.edits is None or self.edits.blind:      # an edit in place left nothing to rebuild it from
            return None
        return self.edits.graph_before()

    def current_graph_key(self, graph: Graph) -> tuple:
        if self.graph_key[0] != graph.version:
            self.graph_key = (graph.version, graph.graph_key())
        return self.graph_key[1]

    @property
    def stdout(self):
        return self.ctx.stdout or sys.stdout

    @property
    def stderr(self):
        return self.ctx.stderr or sys.stderr


class PassManager:
    def __init__(self, pipeline: str | Pipeline | None = None, ctx: PassContext | None = None):
        self.ctx = ctx or PassContext.current()
        self.pipeline = self.ctx.effective_pipeline(pipeline)
        self.ctx.check_report_names()

    def run(self, g: Graph) -> OptResult:
        from dspark_ir.gctools import paused_gc

        with paused_gc():                 # graphs are reference cycles: see dspark_ir/gctools.py
            return self._run(g)

    def _run(self, g: Graph) -> OptResult:
        from .instruments import build_instruments

        ctx = self.ctx
        verify(g)  # a bad input is the input's fault, not a pass's
        budget = Budget(ctx.bisect_limit if ctx.bisect_rewrites else None)
        state = RunState(ctx, self.pipeline, g, budget)     # the input is only read: the passes edit a copy
        if ctx.bisect_rewrites and ctx.bisect_limit is not None:
            budget.on_rewrite = lambda n, p, rec: print(f"bisect: rewrite {n} ({p.name}: {rec})", file=state.stderr)
        instruments = build_instruments(ctx)
        graph = g.clone()
        for inst in instruments:
            inst.start(state, graph)
        try:
            self._run_all(state, graph, instruments)
            graph.stop_recording()
            if not ctx.verify_each:
                _final_verify(graph)
        except PassError as e:
            state.failure = e
            for inst in instruments:
                inst.fail(state, e, graph)
            raise
        finally:
            graph.stop_recording()
        result = OptResult(graph, *self._executed(state))
        for inst in instruments:
            inst.finish(state, result)
        return result

    def _executed(self, state: RunState) -> tuple[Pipeline, list[PassRun], int | None]:
        """The pipeline that ran under a bisect limit (the full one without), its runs, the rewrite budget."""
        ctx = state.ctx
        if ctx.bisect_limit is None:
            return self.pipeline, state.runs, None
        if not ctx.bisect_rewrites:
            return self.pipeline[:ctx.bisect_limit], state.runs, None
        ran = [r.index for r in state.runs if r.status != "skipped"]
        return self.pipeline[:max(ran, default=0)], state.runs, ctx.bisect_limit

    def _run_all(self, state: RunState, graph: Graph, instruments: list) -> None:
        established: set[str] = set()
        for index, p in enumerate(self.pipeline, 1):
            run = PassRun(index, p, nodes_before=len(graph), nodes_after=len(graph))
            state.runs.append(run)
            if not self._admit(state, run):
                continue
            # the change record is made of what the pass's edits touched (the graph records them), the graph-level
            # key and the topological positions before the pass (for the order of the removed nodes)
            state.current_graph_key(graph)
            state.topo_index = graph.topo_index()
            state.edits = graph.record_edits()
            for inst in instruments:
                inst.before_pass(state, run, graph)
            self._apply(state, run, graph, established)
            t0 = time.perf_counter()
            before = state.before if any(getattr(inst, "uses_before", True) for inst in instruments) else None
            for inst in instruments:
                inst.after_pass(state, run, before, graph)
            run.check_seconds = time.perf_counter() - t0
            _update_properties(established, p, run.changed, run.partial)

    def _admit(self, state: RunState, run: PassRun) -> bool:
        """Bisect limits and layer applicability; prints the bisect trace."""
        ctx, p = state.ctx, run.pass_
        limited = ctx.bisect_limit is not None
        if limited and not ctx.bisect_rewrites and run.index > ctx.bisect_limit:
            run.status, run.note = "skipped", f"bisect limit {ctx.bisect_limit}"
        elif limited and ctx.bisect_rewrites and state.budget.exhausted:
            run.status, run.note = "skipped", f"bisect limit of {ctx.bisect_limit} rewrites reached"
        if limited and not ctx.bisect_rewrites:
            verb = "NOT running" if run.status == "skipped" else "running"
            print(f"bisect: {verb} #{run.index} {run.spec}", file=state.stderr)
        if run.status == "skipped":
            return False
        reason = properties.applicability(p.requires, state.input)
        if reason is not None:
            run.status, run.note = "not-applicable", reason
            return False
        return True

    def _apply(self, state: RunState, run: PassRun, graph: Graph, established: set[str]) -> None:
        p = run.pass_
        missing = properties.unmet(p.requires, established, graph)
        if missing is not None:
            raise run.fail("requirement", f"requires '{missing[0]}': {missing[1]}")
        run.rewrites_before = state.budget.used
        t0 = time.perf_counter()
        try:
            with open_analyses(graph):          # the pass's analysis cache, dropped when it ends
                outcome = drive(p, graph, state.budget)
        except PassError as e:
            raise run.fail(e.kind, e.message, e.location) from None
        except DsparkError as e:
            raise run.fail("error", f"failed: {e.message}", e.location) from None
        except Exception as e:  # a bug in the pass: name it, keep the traceback as the cause
            raise run.fail("crash", f"crashed: {type(e).__name__}: {e}") from e
        run.seconds = time.perf_counter() - t0
        run.rewrites, run.partial = outcome.rewrites, outcome.stopped
        run.matched, run.declined = outcome.matched, outcome.declined + outcome.stale
        run.rewrites_used = state.budget.used
        before_key = state.graph_key[1]
        _record_changes(state, run, graph)
        # a fixpoint round after a rewrite sees the nodes it made: those are no candidates that did not fire
        # (--explain, report.md, --pass-stats); "already X" there is the rewrite itself and is dropped, any other
        # reason says why the rewrite stopped where it did (widen-tile: "a 16-row tile would exceed the 8 rows")
        made = {rec.at for rec in run.rewrites} | set(run.added) | set(run.modified)
        run.skips = [skip for skip in outcome.skips if skip.at not in made]
        run.limits = [skip for skip in outcome.skips if skip.at in made and "already" not in skip.reason]
        _check_signature(run, before_key, state.current_graph_key(graph))


def run_pipeline(g: Graph, pipeline: str | Pipeline | None = None, *, ctx: PassContext | None = None,
                 **settings: Any) -> OptResult:
    """Run `pipeline` (default: the context's, else the default pipeline) on a copy of `g`.
    `settings` override fields of the context: run_pipeline(g, "cse", check_numerics=True, dump_dir="d")."""
    ctx = ctx or PassContext.current()
    if settings:
        ctx = ctx.replace(**settings)
    return PassManager(pipeline, ctx).run(g)


# ---- helpers ------------------------------------------------------------------------------------
def _record_changes(state: RunState, run: PassRun, graph: Graph) -> None:
    """Added/removed/modified nodes (each list in print order: the removed ones in the graph's before the pass)
    and the changed bit: the same as comparing every node's key by name before and after the pass (the node
    part of the structural key), then the graph-level part. Only the names the pass's edits touched can differ."""
    edits = state.edits
    if edits.blind:
        raise run.fail("crash", "edited the graph in place (Graph.touch / Graph.invalidate): edit through "
                                "set_attrs / set_operands / set_deps so the change record sees what changed")
    undefined = edits.undefined()
    if undefined is not None:
        raise run.fail("invalid-graph", f"left a use of an undefined value {undefined}")
    added, removed, modified = edits.changes()
    if added or modified:
        after = graph.topo_index()
        added.sort(key=after.__getitem__)
        modified.sort(key=after.__getitem__)
    removed.sort(key=state.topo_index.__getitem__)
    run.added, run.removed, run.modified = added, removed, modified
    run.nodes_after = len(graph)
    changed = bool(added or removed or modified) or state.graph_key[1] != state.current_graph_key(graph)
    run.status = "changed" if changed else "no-op"


def node_keys(g: Graph) -> dict[str, tuple]:
    """name → everything that defines the node, in print order."""
    return {n.name: g.node_key(n) for n in g.topo_order()}


def _check_signature(run: PassRun, before: tuple, after: tuple) -> None:
    """`before`, `after`: graph_key() before and after the pass."""
    if before[3] != after[3]:
        raise run.fail("signature", "changed the graph's parameters")
    if len(before[4]) != len(after[4]):
        raise run.fail("signature", f"changed the number of returned values "
                                      f"({len(before[4])} → {len(after[4])})")


def _update_properties(established: set[str], p: Pass, changed: bool, partial: bool) -> None:
    if changed:
        established.intersection_update(p.preserves)
    if not partial:
        established.update(p.guarantees)


def _final_verify(graph: Graph) -> None:
    try:
        verify(graph)
    except DsparkError as e:
        raise PassError(f"the pipeline produced an invalid graph (rerun with --verify-each to find the pass): "
                        f"{e.message}", e.location, kind="invalid-graph") from None

"""Automatic bisection: the first pass application (then the first rewrite) that makes a graph bad.

    found = bisect_pipeline(g, is_bad=lambda out: not matches_golden(out))
    found.index, found.pass_name, found.rewrite, found.record

`is_bad(graph) -> bool` judges a pipeline output; a run that raises a PassError counts as bad. The search
runs the pipeline with `bisect_limit` (pass applications), then with `bisect_rewrites` inside the first
bad pass: the same mechanism as `dspark opt --bisect-limit N [--bisect-rewrites]`.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from dspark_ir.graph import Graph

from .base import RewriteRecord
from .context import PassContext
from .errors import PassError
from .manager import run_pipeline
from .pipeline import Pipeline


@dataclass(frozen=True)
class BisectResult:
    index: int                       # 1-based pass application; 0: the input itself is bad
    pass_name: str
    rewrite: int | None = None       # global rewrite number (1-based) that first makes it bad
    record: RewriteRecord | None = None

    def __str__(self) -> str:
        if self.index == 0:
            return "the input graph is already bad"
        text = f"first bad pass application: #{self.index} {self.pass_name}"
        return text + (f"; first bad rewrite: {self.rewrite} ({self.record})" if self.record else "")


def bisect_pipeline(g: Graph, is_bad: Callable[[Graph], bool], pipeline: str | Pipeline | None = None,
                    ctx: PassContext | None = None, rewrites: bool = True) -> BisectResult | None:
    """None when the full pipeline's output is not bad."""
    base = (ctx or PassContext.current()).replace(dump_dir=None, repro=None, time_passes=False, explain=(),
                                                  print_ir_after_all=False, print_ir_after=(), check_numerics=False)
    effective = base.effective_pipeline(pipeline)
    quiet = base.replace(pipeline=effective, use_env=False, disabled=(), enabled=(), only=(), options={},
                         stderr=_Null())

    def bad(limit: int, by_rewrite: bool = False) -> bool:
        try:
            out = run_pipeline(g, ctx=quiet.replace(bisect_limit=limit, bisect_rewrites=by_rewrite))
        except PassError:
            return True
        return is_bad(out.graph)

    if bad(0):
        return BisectResult(0, "")
    if not bad(len(effective)):
        return None
    index = _first_true(1, len(effective), bad)
    found = BisectResult(index, effective[index - 1].name)
    if not rewrites:
        return found
    first, last = _rewrite_span(g, quiet, index)
    if last < first:
        return found
    n = _first_true(first, last, lambda k: bad(k, by_rewrite=True))
    record = _record(g, quiet, n)
    return BisectResult(index, found.pass_name, n, record)


def _first_true(lo: int, hi: int, pred: Callable[[int], bool]) -> int:
    """Smallest k in [lo, hi] with pred(k), given pred(hi) and monotonicity."""
    while lo < hi:
        mid = (lo + hi) // 2
        if pred(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def _rewrite_span(g: Graph, ctx: PassContext, index: int) -> tuple[int, int]:
    """Global numbers of the first and last rewrite of pass application `index`."""
    before = _rewrite_count(g, ctx.replace(bisect_limit=index - 1))
    upto = _rewrite_count(g, ctx.replace(bisect_limit=index))
    return before + 1, upto


def _rewrite_count(g: Graph, ctx: PassContext) -> int:
    try:
        return run_pipeline(g, ctx=ctx).rewrites
    except PassError:
        return 0


def _record(g: Graph, ctx: PassContext, n: int) -> RewriteRecord | None:
    try:
        runs = run_pipeline(g, ctx=ctx.replace(bisect_limit=n, bisect_rewrites=True)).runs
    except PassError:
        return None
    records = [rec for r in runs for rec in r.rewrites]
    return records[n - 1] if len(records) >= n else None


class _Null:
    def write(self, _text: str) -> int:
        return 0

    def flush(self) -> None:
        pass

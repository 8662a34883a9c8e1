"""The standard driver: walk a pass's match() sites, rewrite them, repeat to a fixpoint, count rewrites."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from dspark_ir.graph import Graph, Node

from .base import Pass, RewriteRecord, Skip
from .errors import PassError

MAX_ROUNDS = 100


class Budget:
    """The rewrite counter behind --bisect-rewrites: `limit` rewrites in total, then nothing fires."""

    def __init__(self, limit: int | None = None, on_rewrite: Callable[[int, Pass, RewriteRecord], None] | None = None):
        self.limit = limit
        self.used = 0
        self.on_rewrite = on_rewrite

    @property
    def exhausted(self) -> bool:
        return self.limit is not None and self.used >= self.limit

    @property
    def remaining(self) -> int | None:
        return None if self.limit is None else self.limit - self.used

    def take(self, p: Pass, record: RewriteRecord) -> None:
        self.used += 1
        if self.on_rewrite is not None:
            self.on_rewrite(self.used, p, record)


@dataclass
class DriveResult:
    rewrites: list[RewriteRecord] = field(default_factory=list)
    skips: list[Skip] = field(default_factory=list)
    stopped: bool = False   # the budget ran out inside this pass
    matched: int = 0        # sites match() yielded, over every round (rewritten, declined or stale)
    declined: int = 0       # sites whose rewrite() returned None (no longer applied)
    stale: int = 0          # sites whose node an earlier rewrite of the round replaced


def drive(p: Pass, g: Graph, budget: Budget) -> DriveResult:
    if p.whole_graph():
        return _run_whole(p, g, budget)
    result = DriveResult()
    for _ in range(MAX_ROUNDS):
        applied, skips = _round(p, g, budget, result)
        result.skips = skips
        if result.stopped or not applied or not p.fixpoint:
            return result
    raise PassError(f"did not reach a fixpoint in {MAX_ROUNDS} rounds", kind="error")


def _round(p: Pass, g: Graph, budget: Budget, result: DriveResult) -> tuple[int, list[Skip]]:
    applied = 0
    skips: list[Skip] = []
    for site in p.match(g):
        if isinstance(site, Skip):
            skips.append(site)
            continue
        result.matched += 1
        if _stale(g, site):
            result.stale += 1
            continue
        if budget.exhausted:
            result.stopped = True
            break
        record = p.rewrite(g, site)
        if record is None:
            result.declined += 1
            continue
        result.rewrites.append(record)
        budget.take(p, record)
        applied += 1
    return applied, _unique(skips)


def _run_whole(p: Pass, g: Graph, budget: Budget) -> DriveResult:
    """A whole-graph pass runs atomically: only while the budget has room, counting its records."""
    if budget.exhausted:
        return DriveResult(stopped=True)
    records = list(p.run(g) or [])
    for record in records:
        budget.take(p, record)
    return DriveResult(rewrites=records, matched=len(records))


def _stale(g: Graph, site: Any) -> bool:
    node = site if isinstance(site, Node) else getattr(site, "node", None)
    return isinstance(node, Node) and g.nodes.get(node.name) is not node


def _unique(skips: list[Skip]) -> list[Skip]:
    return list(dict.fromkeys(skips))

"""Analyses a pass reuses across its sites, kept by the pass manager for one pass application.

A pass that would recompute the same facts at every site (which waits link to a notifier, which sites a
node has) keeps them in the analysis cache of the run instead of a module global:

    memo = analyses(g)
    sites = memo.get(("sites", wait.name), lambda: list(self._sites_of(g, wait)))
    memo.invalidate(keep=("linked",))        # after a rewrite that makes the other entries stale

The manager opens one cache per pass application (`open_analyses`, around the pass's match/rewrite walk);
it starts empty and is dropped when the pass ends, so no entry outlives the graph version it was computed on
by more than the pass that made it. Within the pass, the pass invalidates what its own rewrites make stale:
it alone knows which of its facts depend on what it changed. Outside a managed run (a test calling
`match` directly, or another graph than the one the run edits) `analyses(g)` is a cache that keeps nothing:
every `get` computes afresh, exactly as without a cache.
"""
from __future__ import annotations

from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Hashable, Iterable, Iterator

from dspark_ir.graph import Graph


class AnalysisCache:
    """Key → value facts about one graph, for one pass application (`keeps = False`: remembers nothing)."""

    def __init__(self, graph: Graph, keeps: bool = True):
        self.graph = graph
        self.keeps = keeps
        self._entries: dict[Hashable, Any] = {}

    def get(self, key: Hashable, compute: Callable[[], Any]) -> Any:
        """The cached value of `key`, computed (and kept) on first use."""
        if key in self._entries:
            return self._entries[key]
        value = compute()
        if self.keeps:
            self._entries[key] = value
        return value

    def peek(self, key: Hashable, default: Any = None) -> Any:
        """The cached value of `key`, or `default` when it is not cached (nothing is computed)."""
        return self._entries.get(key, default)

    def invalidate(self, keep: Iterable[Hashable] = ()) -> None:
        """Drop every entry except those in `keep` (which the pass keeps up to date itself)."""
        kept = {k: self._entries[k] for k in keep if k in self._entries}
        self._entries = kept

    def __len__(self) -> int:
        return len(self._entries)


_CURRENT: ContextVar[AnalysisCache | None] = ContextVar("dspark_pass_analyses", default=None)


@contextmanager
def open_analyses(g: Graph) -> Iterator[AnalysisCache]:
    """The cache of one pass application on `g` (the manager opens it around the pass)."""
    cache = AnalysisCache(g)
    token = _CURRENT.set(cache)
    try:
        yield cache
    finally:
        _CURRENT.reset(token)


def analyses(g: Graph) -> AnalysisCache:
    """The open cache of the pass application running on `g`; else one that keeps nothing."""
    cache = _CURRENT.get()
    if cache is not None and cache.graph is g:
        return cache
    return AnalysisCache(g, keeps=False)

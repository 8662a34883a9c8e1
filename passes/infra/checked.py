"""`CheckedPass`: a pass that judges one node at a time: `check` gives the node's site or why it does not qualify."""
from __future__ import annotations

from typing import Any, ClassVar, Iterator, Mapping

from dspark_ir.graph import Graph, Node
from dspark_ir.ops.base import OpDef

from .base import Pass, RewriteRecord, Skip


class CheckedPass(Pass):
    """A match/rewrite pass whose every site is one node that `check` judges.

    Declare the ops whose nodes are candidates (`candidates`, or override `is_candidate`) and, for --explain,
    the ops a reader might expect it to touch with why they are not candidates (`not_candidates`, or override
    `not_a_candidate` when the reason depends on more than the op). Then write two methods:

        check(g, node) -> site | str    the site (an object with `.node`) or why the node does not qualify
        apply(g, site) -> RewriteRecord the rewrite of a site `check` has just returned

    `match` walks the graph in topological order: a node with a `not_a_candidate` reason is a Skip with that
    reason; a candidate is `check`'s site, or a Skip with `check`'s reason. `rewrite` checks the site's node
    again (the graph may have changed since the match) and applies the fresh site, or declines (None) when
    the node no longer qualifies.
    """

    candidates: ClassVar[tuple[type[OpDef], ...]] = ()
    not_candidates: ClassVar[Mapping[type[OpDef], str]] = {}

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.check is CheckedPass.check or cls.apply is CheckedPass.apply:
            raise TypeError(f"{cls.__module__}.{cls.__qualname__}: a CheckedPass implements check() and apply()")

    def is_candidate(self, node: Node) -> bool:
        return node.opdef in self.candidates

    def not_a_candidate(self, g: Graph, node: Node) -> str | None:
        """Why --explain names `node` though the pass does not check it, or None: it says nothing of it."""
        return self.not_candidates.get(node.opdef)

    def check(self, g: Graph, node: Node) -> Any:
        raise NotImplementedError

    def apply(self, g: Graph, site: Any) -> RewriteRecord | None:
        raise NotImplementedError

    def match(self, g: Graph) -> Iterator[Any]:
        for node in g.topo_order():
            reason = self.not_a_candidate(g, node)
            if reason is not None:
                yield Skip(node.name, reason)
            elif self.is_candidate(node):
                verdict = self.check(g, node)
                yield Skip(node.name, verdict) if isinstance(verdict, str) else verdict

    def rewrite(self, g: Graph, site: Any) -> RewriteRecord | None:
        fresh = self.check(g, site.node)
        return None if isinstance(fresh, str) else self.apply(g, fresh)

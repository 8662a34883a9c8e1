"""topk-merge-stage: widen a staged top-k sort until its widest merge stage covers the score prefix."""
from __future__ import annotations

from dataclasses import dataclass

from dspark_ir.graph import Graph, Node
from dspark_ir.ops.indexer import IdxTopk, score_prefix, unsorted_prefix

from .infra import policy
from .infra.base import RewriteRecord, register_pass
from .infra.checked import CheckedPass
from .infra.contracts import EXACT_INDICES
from .infra.options import option
from .infra.rewriting import set_attrs


@dataclass(frozen=True)
class Site:
    node: Node
    added: tuple[int, ...]     # the merge stages appended to its sort_stages


@register_pass
@dataclass(frozen=True)
class TopkMergeStage(CheckedPass):
    """Append the 1024 merge stage to a staged top-k sort whose score prefix exceeds its widest stage.

    The prefill indexer sorts each score row in stages (dspark-model.md §6(h)): sort32, then mrgsort with run
    widths 64 and 256 (`sort_stages = [32, 64, 256]` on `idx_topk`). After the widest stage W the row is ordered
    only within runs of W entries, and the kernel takes the first k entries of the row. With a score prefix
    (min(score_len, max_visible): the cap INDEXER_SCORE_CAP = 2·T / ratio) of at most W all visible entries sit in
    the first run and the result is the top-k. Past W the first run's entries crowd out better keys later in the
    row and the top-k silently picks the wrong keys. The seed's fix adds `mrgsort(block_len = 1024)` when the cap
    exceeds 256; the pass appends that stage (`stage`), and further ×4 stages (mrgsort's fan-in) while the
    prefix still exceeds it (a cap past 1024: T > 2048 at ratio 4).

    Why the result is right: a merge of ordered runs is the ordered run of their union, so with a widest stage
    ≥ prefix the visible entries are one ordered run and its first min(k, visible) entries are the top-k. It
    establishes `topk-sorts-prefix` (checked with --verify-each). It leaves alone: top-ks without sort_stages
    (decode: one full sort), those whose stages already cover the prefix, and a `stage` that does not merge
    whole runs of the widest stage (not a multiple of it).

    Contract: exact-indices against the top-k's intended meaning. The pass changes values (that is the repair),
    so --check-numerics compares its output with the input graph whose flagged top-ks sort in full (no stages),
    computed by the reference's plain argsort, not through the staged sort the pass relies on."""

    name = "topk-merge-stage"
    origin = "seed PR (dspark-model.md §6(h)): the prefill indexer top-k's extra 1024 merge stage"
    contract = EXACT_INDICES
    guarantees = frozenset({"topk-sorts-prefix"})
    candidates = (IdxTopk,)
    stage: int = option(policy.TOPK_MERGE_STAGE, min=2)

    def apply(self, g: Graph, site: Site) -> RewriteRecord:
        node = site.node
        before = list(node.attrs["sort_stages"])
        set_attrs(g, node, sort_stages=before + list(site.added))
        return RewriteRecord("merge-stage", node.name,
                             f"score prefix {score_prefix(node.attrs)} > widest stage {before[-1]}: sort_stages "
                             f"{before} → {list(node.attrs['sort_stages'])}")

    def intended(self, g: Graph) -> Graph:
        full = g.clone()
        for node in full.ops(IdxTopk.name):
            if unsorted_prefix(node.attrs) is not None:
                node.attrs = IdxTopk.normalize_attrs({k: v for k, v in node.attrs.items() if k != "sort_stages"})
        full.touch()
        return full

    def check(self, g: Graph, node: Node) -> Site | str:
        stages = node.attrs.get("sort_stages")
        if stages is None:
            return "no sort_stages: one full sort of the row (decode)"
        prefix, widest = score_prefix(node.attrs), stages[-1]
        if unsorted_prefix(node.attrs) is None:
            return f"its widest merge stage {widest} covers the score prefix {prefix}"
        if self.stage <= widest or self.stage % widest:
            return (f"stage = {self.stage} does not merge whole runs of the widest stage {widest} "
                    f"(needs a larger multiple of it)")
        added = [self.stage]
        while added[-1] < prefix:
            added.append(added[-1] * policy.TOPK_MERGE_FAN_IN)
        return Site(node, tuple(added))

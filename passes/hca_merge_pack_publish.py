"""hca-merge-pack-publish: the HCA merge-pack puts its packed tiles straight into the O path's exchange windows."""
from __future__ import annotations

from dataclasses import dataclass

from dspark_ir.graph import Graph, Node
from dspark_ir.ops.collective import HcaStreamMergePackPublish, OGroupA2A
from dspark_ir.ops.sparse import HcaStreamMerge, HcaStreamMergePack

from .infra import policy
from .infra.base import RewriteRecord, register_pass
from .infra.checked import CheckedPass
from .infra.contracts import BITWISE
from .infra.options import option
from .infra.rewriting import is_returned, replace_node


@dataclass(frozen=True)
class Site:
    merge_pack: Node    # hca_stream_merge_pack: the packed heads [G, T, hg·HD] in GM (removed)
    node: Node          # o_group_a2a of them: put + barrier 1 (the node checked; replaced)


@register_pass
@dataclass(frozen=True)
class HcaMergePackPublish(CheckedPass):
    """Fuse `hca_stream_merge_pack` and the `o_group_a2a` of its packed heads into one
    `hca_stream_merge_pack_publish`: the merge workers put their tiles into the owners' exchange windows.

    Before (the seed's fused merge, dspark-model.md §6(c), then the TP O path §3.5): the merge-pack's 48 workers
    write the packed bf16 heads [G, T, hg·HD] to GM (8 MiB at flash TP4), and the exchange reads them back and
    puts each O group's rows into its owner's window, then barrier 1. pypto-lib's publish path before #1170 did
    the same with the put in the pack workers: each item packed into the GM `attention_grouped` and put its
    ATTENTION_PUBLISH_T_TILE (8) rows from there. After (#1170 (b), decode_hca `hca_stream_merge_pack_publish`):
    `workers` workers take items of `publish_tokens` (4) tokens; each merges, rotates back and rounds its heads in
    its buffers and puts them from there, one contiguous row block per O group (the item's rows are consecutive
    in the owner's window: row local_group·GROUP_T_PAD + src_rank·T + t), then the notify and barrier 1. No packed
    tensor in GM, no second read of it, no separate put task.

    Equal values: the window holds the bytes the exchange would have copied from the packed tensor (the same
    merge, rotation and bf16 rounding per element; only where the tile travels through changes). Contract:
    bitwise. The fused task is a rendezvous collective in the exchange's place: it keeps the exchange's deps and
    the merge-pack's (the raw/compressed branches and the RoPE tables), so the ranks meet in the same order and
    every reader of the window (the O-A tiles, the gather or the window release) reads it unchanged.

    Left alone, with the reason: a TP1 merge-pack (its packed heads feed the local O projection: no exchange to
    publish into), an unfused hca_stream_merge (fuse-merge-rope-pack makes the merge-pack this pass needs), a
    merge-pack whose heads are staged through GM (`stage_heads`: the publish tiles start from the heads in the
    worker's buffers, #1229's on-chip form), packed heads that another task reads or the graph returns, and an
    exchange of another producer's heads (SWA / CSA merge_norm: #1170 changed HCA only).
    """

    name = "hca-merge-pack-publish"
    origin = "pypto-lib #1170 (b) (decode_hca hca_stream_merge_pack_publish, ATTENTION_PUBLISH_T_TILE = 4)"
    contract = BITWISE
    preserves = frozenset({"canonical", "no-dead-nodes", "no-common-subexpressions"})
    candidates = (OGroupA2A,)
    workers: int = option(policy.ATTENTION_PUBLISH_WORKERS, min=1)
    publish_tokens: int = option(policy.ATTENTION_PUBLISH_TOKENS, min=1)

    def not_a_candidate(self, g: Graph, node: Node) -> str | None:
        if node.opdef is HcaStreamMerge:
            return ("the merge and the pack are separate tasks: fuse-merge-rope-pack makes the merge-pack this pass "
                    "publishes from")
        if node.opdef is HcaStreamMergePack and not any(u.opdef is OGroupA2A for u in g.users(node.result)):
            return ("no o_group_a2a reads its packed heads (TP1: they feed the local O projection, there is no "
                    "exchange window to publish into)")
        return None

    def apply(self, g: Graph, site: Site) -> RewriteRecord:
        merge_pack, exchange = site.merge_pack, site.node
        deps = list(dict.fromkeys([*merge_pack.deps, *exchange.deps]))
        attrs = {"o_groups": merge_pack.attrs["o_groups"], "tp": exchange.attrs["tp"],
                 "t_pad": exchange.attrs["t_pad"], "publish_tokens": self.publish_tokens,
                 "blocks": self.workers, "workers": self.workers}
        if "tile" in merge_pack.attrs:
            attrs["tile"] = merge_pack.attrs["tile"]
        fused = g.add_op(HcaStreamMergePackPublish.name, list(merge_pack.operands), attrs,
                         names=g.fresh_name(merge_pack.name + "_publish"), deps=deps, near=exchange)
        replace_node(g, exchange, fused.results)
        g.remove_node(merge_pack)
        return RewriteRecord("publish", exchange.name,
                             f"%{fused.name}: {self.workers} workers put {self.publish_tokens}-token tiles of "
                             f"%{merge_pack.name} into the owners' windows (no packed tensor in GM)")

    def check(self, g: Graph, exchange: Node) -> Site | str:
        """The site, or why this exchange is not one."""
        producer = exchange.operands[0].producer
        if producer is None or producer.opdef is not HcaStreamMergePack:
            what = "a graph input" if producer is None else f"%{producer.name} ({producer.op})"
            return f"its packed heads come from {what}, not an hca_stream_merge_pack (#1170 changed HCA only)"
        if producer.attrs.get("stage_heads"):
            return (f"%{producer.name} stages its heads through GM (stage_heads): the publish tiles start from the "
                    "heads in the worker's buffers")
        if is_returned(g, producer) or any(u is not exchange for u in g.users(producer.result)):
            return f"the packed heads %{producer.result.name} have other readers (they must stay in GM)"
        return Site(producer, exchange)

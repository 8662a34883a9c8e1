"""hca-cmp-gather-pages: the HCA compressed-KV gather on blocks of several cache pages (pypto-lib #1227)."""
from __future__ import annotations

from dataclasses import dataclass

from dspark_ir import dims as D
from dspark_ir.graph import Graph, Node
from dspark_ir.ops.attention import QkPv
from dspark_ir.ops.sparse import CsaQkPv, HcaCmpWorkGather

from .infra import policy
from .infra.base import RewriteRecord, register_pass
from .infra.checked import CheckedPass
from .infra.contracts import BITWISE
from .infra.options import option
from .infra.rewriting import set_attrs


@dataclass(frozen=True)
class Site:
    node: Node
    per_block: int      # (request, work item) pairs per block
    items: int          # B · works at the graph's B
    blocks: D.Dim


@register_pass
@dataclass(frozen=True)
class HcaCmpGatherPages(CheckedPass):
    """Run `hca_cmp_work_gather` on blocks of `pages` compressed-cache pages instead of one block per
    (request, work item).

    Before (the seed): spmd B·works, each block gathering one work item (CMP_PAGES_PER_WORK pages of block_size
    rows) of one request: at 128K context upstream that is 512 tiny copy blocks, each paying a dispatch. After
    (pypto-lib #1227, CMP_GATHER_WORK_TILE): the (request, work item) pairs in order, max(1, pages //
    pages_per_work) of them per block, spmd ceil(B·works / that) (512 → 64 blocks at 128K); the last block takes
    the remainder (a ragged B·works is fine: a block stops at the last pair).

    Every pair still copies the same rows to the same place of `rows` / `phys`; the grid changes which block
    copies a pair, never the data. Contract: bitwise. Our pypto template gathers request by request whatever
    the grid, so the kernel source is the same and the schedule model sees the smaller grid. Left alone: a work
    item that already holds `pages` pages, a grid of one pair, an unbound B, a gather already grouped. CSA has no
    separate compressed gather (csa.qk_pv reads the compressed rows through the table itself): --explain says so.
    """

    name = "hca-cmp-gather-pages"
    origin = "pypto-lib #1227 (decode_sparse_attn_hca CMP_GATHER_WORK_TILE: 8 pages per gather block)"
    contract = BITWISE
    preserves = frozenset({"canonical", "no-dead-nodes"})
    candidates = (HcaCmpWorkGather,)
    not_candidates = {QkPv: "SWA attends over the raw window only: no compressed KV to gather",
                      CsaQkPv: "CSA gathers its compressed rows inside qk_pv (no separate gather task)"}
    pages: int = option(policy.CMP_GATHER_PAGES, min=1)

    def apply(self, g: Graph, site: Site) -> RewriteRecord:
        node = site.node
        before = node.attrs["blocks"].value(g.env)
        set_attrs(g, node, items_per_block=site.per_block, blocks=site.blocks)
        return RewriteRecord("group", node.name,
                             f"{before} -> {site.blocks.value(g.env)} blocks ({site.items} work items, "
                             f"{site.per_block} per block)")

    def check(self, g: Graph, node: Node) -> Site | str:
        if node.attrs.get("items_per_block", 1) > 1:
            return f"already {node.attrs['items_per_block']} work items per block"
        bs, wr, works = (node.attrs[k] for k in ("block_size", "work_rows", "works"))
        pages_per_work = -(-wr // bs)
        per_block = max(1, self.pages // pages_per_work)
        if per_block < 2:
            return f"a work item already holds {pages_per_work} pages (pages = {self.pages}): nothing to group"
        requests = node.operands[1].type.shape[0]
        b = requests.value(g.env)
        if b is None:
            return f"the request count {requests} is not bound"
        items = b * works
        if items < 2:
            return "one work item: one block already"
        blocks = D.ceildiv(D.mul(requests, works), per_block)
        return Site(node, min(per_block, items), items, blocks)

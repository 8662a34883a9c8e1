"""hca-cmp-wide-k-tile: HCA's compressed QK/PV on work items of several cache pages (one wide K tile each)."""
from __future__ import annotations

from dataclasses import dataclass

from dspark_ir.graph import Graph, Node
from dspark_ir.ops.sparse import HcaCmpQkPv, HcaCmpWorkGather, HcaStreamMerge, HcaStreamMergePack

from .infra import policy
from .infra.base import RewriteRecord, register_pass
from .infra.checked import CheckedPass
from .infra.contracts import approx
from .infra.options import option
from .infra.rewriting import is_returned, replace_node

MERGES = (HcaStreamMerge, HcaStreamMergePack)


@dataclass(frozen=True)
class Site:
    node: Node      # hca_cmp_qk_pv
    gather: Node    # its hca_cmp_work_gather
    rows: int       # the wide K tile (rows per work item)
    works: int      # work items per request after the rewrite


@register_pass
@dataclass(frozen=True)
class HcaCmpWideKTile(CheckedPass):
    """Widen HCA's compressed work items from one cache page to a `k_tile`-row tile of several pages.

    Before (the seed's TP1 sparse_attn_hca, pypto-lib before #1228: CMP_ATTN_K_TILE = 32 = one page): per request,
    `hca_cmp_work_gather` copies the compressed rows work item by work item and `hca_cmp_qk_pv` runs one item per
    (token, item) block: a 32-row q·Kᵀ, a masked softmax and a 32-row p·V per item, T·ceil(n/32) blocks (flash,
    128K context: 32 items per request, 4096 blocks at T = 128), each with its own partial (m, l, o) that the
    stream merge folds in. After (#1228, TP1: CMP_ATTN_K_TILE = 128): one item holds k_tile/page pages in one
    K tile, each row masked by its own page's mapping and the visibility bound (the template masks row by row:
    phys ≥ 0 and c < n[t], which is the per-page mask for whole pages); 4× fewer items, blocks and partials, and
    4× wider matmuls. `work_rows` is the kernel template's K tile (kernels/sparse.py reads it), so the pass sets
    the template option and the work counts; the gather and qk_pv keep their names.

    Why it is close, not bitwise: a wider item changes the online-softmax grouping: its max, its exp sums and the
    bf16 rounding of p = exp(s − m_item) are taken over four pages at once, then merged once instead of four
    times. Each form is the same softmax up to f32/bf16 rounding; the layer output stays within approx(rtol,
    atol) below, measured on tiny decode-hca (3 seeds, TP1/2/4). Which candidates it leaves alone: items already
    at least k_tile rows, a k_tile that is not whole pages or not a multiple of the current item, graphs above
    `max_tp` (upstream keeps one-page items at TP > 1: more items for the cores), gathered rows or partials read
    by anything but the qk_pv / the stream merge. `k_tile = 0` takes the tile from the graph's config
    (policy.cmp_k_tile_rows: 128 at flash).
    """

    name = "hca-cmp-wide-k-tile"
    origin = "later pypto-lib form: #1228 (TP1 CMP_ATTN_K_TILE 32 → 128 with per-page masks)"
    contract = approx(rtol=2e-2, atol=2e-2)
    candidates = (HcaCmpQkPv,)
    k_tile: int = option(0, min=0)
    max_tp: int = option(policy.CMP_MAX_TP, min=1)

    def apply(self, g: Graph, site: Site) -> RewriteRecord:
        node, gather = site.node, site.gather
        before = gather.attrs["works"]
        g_names = [v.name for v in gather.results]
        q_names = [v.name for v in node.results]
        batch = gather.operands[1].type.shape[0]
        new_gather = g.add_op(HcaCmpWorkGather.name, gather.operands,
                              {**gather.attrs, "work_rows": site.rows, "works": site.works,
                               "blocks": batch * site.works},
                              names=[g.fresh_name(n) for n in g_names], deps=gather.deps, near=gather)
        tokens = node.operands[0].type.shape[0]
        ops = [node.operands[0], *new_gather.results, *node.operands[3:]]
        new_qk = g.add_op(HcaCmpQkPv.name, ops, {**node.attrs, "work_rows": site.rows, "blocks": tokens * site.works},
                          names=[g.fresh_name(n) for n in q_names], deps=node.deps, near=node)
        replace_node(g, node, new_qk.results)
        replace_node(g, gather, new_gather.results)
        for value, name in zip([*new_gather.results, *new_qk.results], g_names + q_names):
            g.rename(value, name)
        return RewriteRecord("widen", q_names[0], f"{before} -> {site.works} work items of {site.rows} rows per "
                                                  "request (per-row page masks)")

    def check(self, g: Graph, node: Node) -> Site | str:
        tp = int(g.attributes.get("tp", 1))
        if tp > self.max_tp:
            return (f"TP {tp} > max_tp = {self.max_tp}: upstream keeps one-page work items at TP > 1 (more items for "
                    "the cores)")
        rows_v, phys_v = node.operands[1], node.operands[2]
        gather = rows_v.producer
        if gather is None or gather.opdef is not HcaCmpWorkGather or phys_v.producer is not gather:
            return "its compressed rows do not come from one hca_cmp_work_gather"
        wr, page = int(node.attrs["work_rows"]), int(gather.attrs["block_size"])
        want = self.k_tile or policy.cmp_k_tile_rows(g)
        if wr >= want:
            return f"its work items are already {wr} rows (≥ the {want}-row K tile)"
        if want % page or want % wr:
            return f"a {want}-row K tile is not whole {page}-row pages or not whole {wr}-row items"
        for v in gather.results:
            others = [u for u in g.users(v) if u is not node]
            if others or is_returned(g, gather):
                who = f"%{others[0].name}" if others else "the graph's return"
                return f"the gathered compressed rows %{v.name} are also read by {who}"
        for v in node.results:
            other = next((u for u in g.users(v) if u.opdef not in MERGES), None)
            if other is not None or is_returned(g, node):
                who = f"%{other.name} ({other.op})" if other else "the graph's return"
                return f"the work-item partials %{v.name} are read by {who}, not only the stream merge"
        works = -(-int(gather.attrs["works"]) * wr // want)
        return Site(node, gather, want, works)

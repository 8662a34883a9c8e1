"""dequant-into-owner-windows: the TP O path's O-B dequant publishes straight into the reduce-scatter windows."""
from __future__ import annotations

from dataclasses import dataclass

from dspark_ir.graph import Graph, Node
from dspark_ir.ops.collective import TpODequantReduceScatter, TpOReduceScatter
from dspark_ir.ops.oproj import OProjBDequant

from .infra import policy
from .infra.base import RewriteRecord, register_pass
from .infra.checked import CheckedPass
from .infra.contracts import BITWISE
from .infra.options import option
from .infra.rewriting import is_returned, replace_node


@dataclass(frozen=True)
class Site:
    dequant: Node       # o_proj_b_dequant: the f32 partial [tp·T, hidden] (removed)
    node: Node          # tp_o_reduce_scatter of that partial (the node checked; replaced)


@register_pass
@dataclass(frozen=True)
class DequantIntoOwnerWindows(CheckedPass):
    """Fuse the TP O path's `o_proj_b_dequant` (f32 partial) and `tp_o_reduce_scatter` into one
    `tp_o_dequant_reduce_scatter`: the dequant writes straight into the reduce-scatter owners' windows.

    Before (dspark-model.md §3.5): `tp_o_b_dequant` (spmd ceil(tp·T/8)·(D/512) = 512 blocks at flash TP4) writes
    the whole f32 partial [tp·T, D] to GM; the reduce-scatter (one `pl.at` core group) reads it back, puts each
    owner's rows into the owner's window, meets the peers, sums the lanes and rounds. After (pypto-lib #980,
    decode_sharded_o_projection_reduce_scatter): `workers` publish workers dequantise their O-B tiles of every
    owner's rows and store them into the owner's window (no f32 partial in GM, no re-read), notify after the
    stores drained; the owner waits, `reduce_workers` workers sum its window's source lanes in ascending rank
    order in f32 and round once; then barrier 2 and the credit reset. #998 adds cross-core slots on the publish
    scope (`slots`, a scheduling hint recorded on the task; 0 = #980 alone).

    Equal values: each element is o_proj_b_dequant's Σ_g f32(acc_g)·s_g (groups ascending) · wo_b_scale, and
    each output row the sum of the source ranks' rows in ascending rank order, rounded once: the same f32
    operations in the same order as before (the fixed-order reduce keeps it deterministic). Contract: bitwise.
    The fused task is a rendezvous collective in the reduce-scatter's place: it keeps the reduce-scatter's
    deps (the a2a release) and the dequant's, so the ranks still meet their peers in one order.

    Left alone, with the reason: a reduce-scatter whose partial is not an o_proj_b_dequant result, a partial
    that something else reads or the graph returns, and a `tp` that does not divide `workers` or
    `reduce_workers` (#980's own checks: every owner gets whole workers). At TP1 the O path has no
    reduce-scatter (the dequant writes attn_out in bf16): each TP1 dequant says so.
    """

    name = "dequant-into-owner-windows"
    origin = "a later public pypto-lib form (#980 / #998: decode_sharded_o_projection_reduce_scatter)"
    contract = BITWISE
    preserves = frozenset({"canonical", "no-dead-nodes", "no-common-subexpressions"})
    candidates = (TpOReduceScatter,)
    workers: int = option(policy.OWNER_PUBLISH_WORKERS, min=1)
    reduce_workers: int = option(policy.OWNER_REDUCE_WORKERS, min=1)
    slots: int = option(policy.OWNER_PUBLISH_SLOTS, min=0)

    def not_a_candidate(self, g: Graph, node: Node) -> str | None:
        if node.opdef is OProjBDequant and node.attrs.get("out") == "bf16":
            return "TP1 O path: the dequant writes attn_out (bf16), there is no reduce-scatter"
        return None

    def apply(self, g: Graph, site: Site) -> RewriteRecord:
        dequant, scatter = site.dequant, site.node
        deps = list(dict.fromkeys([*dequant.deps, *scatter.deps]))
        attrs = {"tp": scatter.attrs["tp"], "out": scatter.attrs["out"], "workers": self.workers,
                 "blocks": self.workers, "reduce_workers": self.reduce_workers, "slots": self.slots}
        fused = g.add_op(TpODequantReduceScatter.name, list(dequant.operands), attrs,
                         names=g.fresh_name(dequant.name + "_publish"), deps=deps, near=scatter)
        replace_node(g, scatter, fused.results)
        g.remove_node(dequant)
        slots = f", {self.slots} cross-core slots" if self.slots else ""
        return RewriteRecord("publish", scatter.name,
                             f"%{fused.name}: {self.workers} publish workers dequantise into the owners' windows "
                             f"(no f32 partial %{dequant.name}), {self.reduce_workers} reduce workers{slots}")

    def check(self, g: Graph, scatter: Node) -> Site | str:
        """The site, or why this reduce-scatter is not one."""
        dequant = scatter.operands[0].producer
        if dequant is None or dequant.opdef is not OProjBDequant:
            return "its partial is not an o_proj_b_dequant result"
        if is_returned(g, dequant) or any(u is not scatter for u in g.users(dequant.result)):
            return f"the f32 partial %{dequant.name} has other readers (it must stay in GM)"
        tp = scatter.attrs["tp"]
        for option_name, count in (("workers", self.workers), ("reduce_workers", self.reduce_workers)):
            if count % tp:
                return f"tp {tp} does not divide {option_name} = {count}"
        return Site(dequant, scatter)

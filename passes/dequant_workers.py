"""dequant-workers: the fused q dequant + RMSNorm + RoPE over cyclic workers (a later pypto-lib form)."""
from __future__ import annotations

from dataclasses import dataclass

from dspark_ir.graph import Graph, Node
from dspark_ir.ops.qkv import QprojDequantRmsNopeRope

from .infra import policy
from .infra.base import RewriteRecord, register_pass
from .infra.checked import CheckedPass
from .infra.contracts import BITWISE
from .infra.options import option
from .infra.rewriting import set_attrs


@dataclass(frozen=True)
class Site:
    node: Node
    workers: int        # min(workers, the (8-token, head tile) units)


@register_pass
@dataclass(frozen=True)
class DequantWorkers(CheckedPass):
    """Run `qproj_dequant_rms_nope_rope` on `workers` cyclic workers instead of one block per head tile.

    Before (the seed): spmd H / Q_ROPE_H_TILE = 16 blocks at flash, each block dequantising, normalising and
    rotating its 4 heads for every token, so 16 of the 48 vector cores carry the whole q side's last step,
    which sits on the decode critical path between qproj_matmul and the attention. After (the form of a later
    public pypto-lib `qkv_proj_rope`: Q_DEQUANT_WORKERS = 48): `workers = blocks = min(workers, units)` cyclic
    workers over the (8-token, head tile) units; the head tile stays the seed's.

    Each (token, head) row is normalised and rotated on its own (its inverse RMS is its own sum), so the grid
    changes which core computes a row, never its value. Contract: bitwise. A task that already runs on at least
    `workers` blocks, or already on workers, is left alone.
    """

    name = "dequant-workers"
    origin = "a later public pypto-lib form (qkv_proj_rope Q_DEQUANT_WORKERS)"
    contract = BITWISE
    preserves = frozenset({"canonical", "no-dead-nodes"})
    candidates = (QprojDequantRmsNopeRope,)
    workers: int = option(policy.DEQUANT_WORKERS, min=1)

    def apply(self, g: Graph, site: Site) -> RewriteRecord:
        node, workers = site.node, site.workers
        before = node.attrs["blocks"]
        set_attrs(g, node, workers=workers, blocks=workers)
        return RewriteRecord("workers", node.name, f"{before} blocks -> {workers} cyclic workers")

    def check(self, g: Graph, node: Node) -> Site | str:
        """The node with its worker count, or why it is not a site."""
        if self.workers < 2:
            return f"workers = {self.workers}: nothing to spread"
        if "workers" in node.attrs:
            return f"already on {node.attrs['workers']} workers"
        blocks = node.attrs.get("blocks")
        count = None if blocks is None else blocks.value(g.env)
        if count is None:
            return f"the block count {blocks} is not bound"
        tokens = node.operands[0].type.shape[0].value(g.env)
        if tokens is None:
            return f"the token count {node.operands[0].type.shape[0]} is not bound"
        units = -(-tokens // policy.DEQUANT_TOKEN_TILE) * count
        workers = min(self.workers, units)
        if count >= workers:
            return f"already {count} blocks for {units} (token, head) units (workers = {self.workers})"
        return Site(node, workers)

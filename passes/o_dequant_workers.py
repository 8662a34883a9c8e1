"""o-dequant-workers: the TP O path's O-B dequant on cyclic workers (a later public pypto-lib form)."""
from __future__ import annotations

from dataclasses import dataclass

from dspark_ir.graph import Graph, Node
from dspark_ir.ops.oproj import OProjBDequant

from .infra import policy
from .infra.base import RewriteRecord, register_pass
from .infra.checked import CheckedPass
from .infra.contracts import BITWISE
from .infra.options import option
from .infra.rewriting import set_attrs


@dataclass(frozen=True)
class Site:
    node: Node
    items: int          # [rows, n] tiles of the task
    workers: int        # cyclic workers (never more than there are tiles)
    ragged: bool        # the last row tile is partial


@register_pass
@dataclass(frozen=True)
class ODequantWorkers(CheckedPass):
    """Run the TP O path's `tp_o_b_dequant` on `workers` cyclic workers instead of one block per [8, 512] tile.

    Before (the seed, decode_o_proj at 634e77bd): `pl.spmd(act_rows·(D/ACT_N_TILE))`, one block per
    (ACT_T_TILE = 8 rows, 512 columns) tile of the f32 partial: ceil(tp·T/8)·(D/512) = 512 blocks at flash TP4.
    After (the later public decode_o_proj, #1070's per-owner form: `pl.spmd(O_RS_DEQUANT_WORKERS = 12)` per
    reduce-scatter owner, "4 owners -> one AIV wave", worker w taking the owner's [16, 512] tiles w, w + 12, …):
    for our one dequant over all tp·T rows, the owners' workers together, `workers` (48 = 12 × 4) cyclic
    workers over [`rows`, 512] tiles: `tile = [rows, n]`, `workers = blocks = min(workers, tiles)`; a row count
    that is not a multiple of the tile clamps the last tile (`tail = clamp`).

    Every output element is its own Σ_g f32(acc_g)·s_g · wo_b_scale (groups ascending), so the grid changes which
    core computes it, never its value; our template already runs the rows as one row block per vector core and
    does not read the grid. Contract: bitwise. Left alone: the TP1 dequant (`proj_b_act`, bf16 out: upstream
    keeps one block per 32-token tile there), a task already on workers or on no more blocks than `workers`, and
    unbound extents.
    """

    name = "o-dequant-workers"
    origin = "a later public pypto-lib form (decode_o_proj O_RS_DEQUANT_WORKERS = 12 per owner, ACT_T_TILE = 16)"
    contract = BITWISE
    preserves = frozenset({"canonical", "no-dead-nodes"})
    candidates = (OProjBDequant,)
    workers: int = option(policy.O_DEQUANT_WORKERS, min=1)
    rows: int = option(policy.O_DEQUANT_ROWS, min=1)

    def apply(self, g: Graph, site: Site) -> RewriteRecord:
        node = site.node
        n = node.attrs["tile"][1] if node.attrs.get("tile") else node.result.type.shape[1].value(g.env)
        set_attrs(g, node, tile=[self.rows, n], workers=site.workers, blocks=site.workers,
                  **({"tail": "clamp"} if site.ragged else {}))
        return RewriteRecord("workers", node.name, f"{site.workers} cyclic workers over {site.items} tiles of "
                                                   f"[{self.rows}, {n}]{' (last clamped)' if site.ragged else ''}")

    def check(self, g: Graph, node: Node) -> Site | str:
        if node.attrs.get("out") == "bf16":
            return "TP1 O path (proj_b_act, bf16 out): upstream keeps one block per token tile there"
        if "workers" in node.attrs:
            return f"already on {node.attrs['workers']} workers"
        blocks = node.attrs.get("blocks")
        count = None if blocks is None else blocks.value(g.env)
        rows_dim, n_dim = node.result.type.shape
        rows, width = rows_dim.value(g.env), n_dim.value(g.env)
        if count is None or rows is None or width is None:
            return f"the block count {blocks} or the extent [{rows_dim}, {n_dim}] is not bound"
        n = node.attrs["tile"][1] if node.attrs.get("tile") else width
        items = -(-rows // self.rows) * -(-width // n)
        workers = min(self.workers, items)
        if count <= workers:
            return f"already {count} blocks for {items} tiles of [{self.rows}, {n}] (workers = {self.workers})"
        return Site(node, items, workers, rows % self.rows != 0)

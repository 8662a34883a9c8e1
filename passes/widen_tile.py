"""widen-tile: give a scheduling-bound row-tiled vector task more rows per block (dspark-model §6(d))."""
from __future__ import annotations

import math
from dataclasses import dataclass

from dspark_ir import dims as D
from dspark_ir.graph import Graph, Node, Value

from .infra import policy
from .infra.base import RewriteRecord, register_pass
from .infra.checked import CheckedPass
from .infra.contracts import BITWISE
from .infra.options import option
from .infra.rewriting import selected

WORK_F32_ROWS = 2   # hidden f32 working rows per tile row (squares, normalised values) in the UB estimate


@dataclass(frozen=True)
class Site:
    node: Node
    tile: int                       # the new row tile
    followers: tuple[Node, ...]     # producers that share the token tile and widen with it


@register_pass
@dataclass(frozen=True)
class WidenTile(CheckedPass):
    """Widen the row tile of a scheduling-bound vector task by `factor` until it holds `min_rows` rows.

    `kv_rms_norm_rope` runs ceil(T/KV_RMS_T_TILE) blocks of 8 rows at flash: each block does little
    work, so the task is bound by dispatch and per-block setup (gamma load, reductions), not by the
    vector units. The seed PR doubled the tile (8 → 16): half the blocks, the same per-row math. This
    pass multiplies the row tile by `factor` (repeatedly, one rewrite each) while it is below
    `min_rows`, and sets `blocks = ceil(rows/tile)` and `tail = clamp` when the new tile does not divide
    the rows (the last block is clamped, a valid_shape tile).

    It stops (Skip with the reason) when the wider tile would exceed the row extent, or when its UB
    estimate would exceed `max_ub_bytes` (pypto 0.2.0 budgets ~192 KB per op including hidden buffers,
    notes/pypto-0.2.0-ops.md §5). The estimate: per tile row, every row-tiled operand and result
    plus `WORK_F32_ROWS` f32 working copies of the widest row; operands without the row axis (gamma)
    stay resident. At flash 16 rows of kv_rms_norm_rope take ~117 KB, 32 rows ~233 KB, so the budget
    itself stops the widening at 16.

    KV_RMS_T_TILE is also the token tile of the rope-row materialisers: a producer of one of the task's
    operands whose op kind is in `follow` and whose row tile equals the task's old tile (same rows) is
    widened with it (its blocks halve too), so the two keep one token tile.

    Which tasks: op kinds, stage names or node names in `ops`, with a one-entry row tile.
    Contract: bitwise. Tiling splits rows between blocks; every row is computed by the same math.
    """

    name = "widen-tile"
    origin = "seed PR (dspark-model.md §6(d)): KV_RMS_T_TILE 8 -> 16"
    contract = BITWISE
    preserves = frozenset({"canonical", "no-dead-nodes"})
    ops: tuple[str, ...] = policy.WIDEN_OPS
    min_rows: int = option(policy.WIDEN_MIN_ROWS, min=1)
    factor: int = option(policy.WIDEN_FACTOR, min=2)
    max_ub_bytes: int = option(policy.WIDEN_MAX_UB_BYTES, min=1)
    follow: tuple[str, ...] = policy.WIDEN_FOLLOW

    def is_candidate(self, node: Node) -> bool:
        return selected(node, self.ops)

    def apply(self, g: Graph, site: Site) -> RewriteRecord:
        old = site.node.attrs["tile"][0]
        for node in (site.node, *site.followers):
            _retile(g, node, site.tile)
        also = "; also " + ", ".join(f"%{f.name}" for f in site.followers) if site.followers else ""
        return RewriteRecord("widen", site.node.name,
                             f"row tile {old} -> {site.tile}, blocks {site.node.attrs['blocks']}{also}")

    def check(self, g: Graph, node: Node) -> Site | str:
        rows = _row_extent(g, node)
        if isinstance(rows, str):
            return rows
        tile = node.attrs["tile"][0]
        if tile >= self.min_rows:
            return f"already {tile} rows per block (min_rows = {self.min_rows})"
        if self.factor < 2:
            return f"factor = {self.factor}: nothing to widen"
        wide = tile * self.factor
        if wide > rows:
            return f"a {wide}-row tile would exceed the {rows} rows"
        ub = ub_bytes(g, node, wide, rows)
        if ub > self.max_ub_bytes:
            return f"a {wide}-row tile needs ~{ub} B of UB > max_ub_bytes = {self.max_ub_bytes}"
        return Site(node, wide, self._followers(g, node, tile, rows))

    def _followers(self, g: Graph, node: Node, tile: int, rows: int) -> tuple[Node, ...]:
        found: dict[str, Node] = {}
        for v in node.operands:
            p = v.producer
            if p is None or p.op not in self.follow or p.name in found:
                continue
            if p.attrs.get("tile") == (tile,) and _row_extent(g, p) == rows:
                found[p.name] = p
        return tuple(found.values())



def _row_extent(g: Graph, node: Node) -> int | str:
    """The bound extent of the node's single tiled axis, or why there is none."""
    tile = node.attrs.get("tile")
    if tile is None or len(tile) != 1:
        return f"no one-entry row tile (tile = {list(tile) if tile else None})"
    axes = node.opdef().tile_axes([v.type for v in node.operands], [v.type for v in node.results], node.attrs)
    if len(axes) != 1:
        return f"{node.op} tiles {len(axes)} axes"
    rows = axes[0][1].value(g.env)
    if rows is None:
        return f"the row extent {axes[0][1]} is not bound"
    return rows


def _row_bytes(g: Graph, v: Value, rows: int) -> int | None:
    """Bytes of one row of `v` when its leading axis is the tiled rows, else None."""
    shape = [d.value(g.env) for d in v.type.shape]
    if not shape or shape[0] != rows or any(s is None for s in shape):
        return None
    return math.prod(shape[1:]) * v.type.dtype.itemsize


def ub_bytes(g: Graph, node: Node, tile: int, rows: int) -> int:
    """UB estimate of one block of `tile` rows: row-tiled operands and results, f32 working rows, and
    the resident operands (those without the row axis)."""
    per_row, resident, widest = 0, 0, 0
    for v in [*node.operands, *node.results]:
        row = _row_bytes(g, v, rows)
        if row is None:
            resident += _full_bytes(g, v)
            continue
        per_row += row
        widest = max(widest, row // v.type.dtype.itemsize)
    return tile * (per_row + WORK_F32_ROWS * 4 * widest) + resident


def _full_bytes(g: Graph, v: Value) -> int:
    return v.type.nbytes(g.env) or 0


def _retile(g: Graph, node: Node, tile: int) -> None:
    """tile = [tile], blocks = ceil(rows/tile), tail = clamp exactly when the tile does not divide the rows."""
    extent = node.opdef().tile_axes([v.type for v in node.operands], [v.type for v in node.results],
                                    node.attrs)[0][1]
    attrs = {k: v for k, v in node.attrs.items() if k != "tail"}
    attrs.update(tile=(tile,), blocks=D.ceildiv(extent, tile))
    if extent.value(g.env) % tile:
        attrs["tail"] = "clamp"
    g.set_attrs(node, node.opdef.normalize_attrs(attrs))

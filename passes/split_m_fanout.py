"""split-m-fanout: fan the M-tile loop of an under-occupied matmul out across SPMD blocks (dspark-model §6(d))."""
from __future__ import annotations

from dataclasses import dataclass

from dspark_ir import dims as D
from dspark_ir.graph import Graph, Node
from dspark_ir.ops.core import Matmul

from .infra import policy
from .infra.base import RewriteRecord, register_pass
from .infra.checked import CheckedPass
from .infra.contracts import BITWISE
from .infra.options import option
from .infra.rewriting import selected, set_attrs


@dataclass(frozen=True)
class Site:
    node: Node
    ways: int           # effective M split (clamped so that every block gets at least one M tile)
    per_block: int      # M tiles each block loops over (the last block may get fewer)
    ragged: bool        # the last block's M range is clamped


@register_pass
@dataclass(frozen=True)
class SplitMFanout(CheckedPass):
    """Split the M-tile loop of an under-occupied matmul across `ways` times more SPMD blocks (KV_OM).

    Before, `kv_proj_matmul` runs (N/n_tile)·k_split blocks (16 at flash) and every block loops over all
    ceil(M/m_tile) M tiles (8 at T = 128), atomically adding its K slice into the seeded f32 accumulator;
    with 24 cube cores, 8 idle. After, the block id decodes to (n group, k split, M part): `m_split = ways`
    and `blocks` ×ways (64 at flash), each block looping over ceil(m_tiles/ways) M tiles. Edges are
    unchanged: the seed (`zeros`) stays an operand of the task, so it precedes every block, and the
    explicit deps (`late_dep`) stay as they were.

    Shape-aware: a block never gets less than one M tile. `ways` is clamped to ceil(m_tiles/per_block)
    with per_block = ceil(m_tiles/ways), so no block is empty; when that leaves the last block fewer M
    tiles it is marked `tail = clamp` (ceil plus a clamped M range). A matmul whose M extent is a single
    tile, whose M extent is not bound, whose grid already includes the M tiles (blocks ≠ n_tiles·k_split),
    that already has `m_split > 1`, or that already runs on at least `cores` blocks is left alone, with
    the reason (`--explain split-m-fanout`).

    Which matmuls: those whose stage name (the node name after its block, e.g. `kv_proj_matmul`), full
    name or op kind is in `ops` (empty: every matmul), and that run on fewer than `cores` blocks.

    Contract: bitwise. Every output element still receives exactly the k_split partial sums it received
    before (the M split only changes which block computes which rows), and the reference adds them in
    ascending split order whatever the grid. On hardware the atomic adds land in completion order both
    before and after, so the fan-out adds no reassociation that the atomic accumulation did not already
    allow (the shuffled executor varies that order for both graphs alike).
    """

    name = "split-m-fanout"
    origin = "seed PR (dspark-model.md §6(d)): KV_OM, the kv_proj M-tile fan-out"
    contract = BITWISE
    preserves = frozenset({"canonical", "no-dead-nodes"})
    candidates = (Matmul,)
    ways: int = option(policy.SPLIT_M_WAYS, min=1)
    cores: int = option(policy.SPLIT_M_CORES, min=1)
    ops: tuple[str, ...] = policy.SPLIT_M_OPS

    def apply(self, g: Graph, site: Site) -> RewriteRecord:
        node = site.node
        before = node.attrs["blocks"]
        attrs = {"m_split": site.ways, "blocks": D.mul(before, site.ways)}
        if site.ragged:
            attrs["tail"] = "clamp"
        set_attrs(g, node, **attrs)
        clamped = " (last block clamped)" if site.ragged else ""
        return RewriteRecord("split-m", node.name, f"m_split {site.ways}: {before} -> {node.attrs['blocks']} "
                                                   f"blocks, {site.per_block} M tile(s) per block{clamped}")

    def check(self, g: Graph, node: Node) -> Site | str:
        """The site, or why this matmul is not one."""
        if self.ops and not selected(node, self.ops):
            return f"not selected by ops=[{','.join(self.ops)}]"
        if self.ways < 2:
            return f"ways = {self.ways}: nothing to split"
        if node.attrs.get("m_split", 1) != 1:
            return f"already split (m_split = {node.attrs['m_split']})"
        tile, blocks = node.attrs.get("tile"), node.attrs.get("blocks")
        if tile is None or len(tile) != 3 or blocks is None:
            return "no tile = [m, n, k] and blocks to re-grid"
        axes = dict(node.opdef().tile_axes([v.type for v in node.operands], [], node.attrs))
        m, n, nblocks = axes["m"].value(g.env), axes["n"].value(g.env), blocks.value(g.env)
        if m is None or n is None or nblocks is None:
            return "M, N or the block count is not bound (cannot check that every block keeps an M tile)"
        m_tiles, grid = -(-m // tile[0]), -(-n // tile[1]) * node.attrs.get("k_split", 1)
        if m_tiles < 2:
            return f"the M extent ({m} rows) is a single {tile[0]}-row tile"
        if nblocks != grid:
            return f"{nblocks} blocks != (N/n_tile)·k_split = {grid}: the grid already covers M (or is unknown)"
        if nblocks >= self.cores:
            return f"already {nblocks} blocks >= {self.cores} cores"
        per_block = -(-m_tiles // min(self.ways, m_tiles))
        ways = -(-m_tiles // per_block)
        return Site(node, ways, per_block, ragged=m_tiles % per_block != 0)


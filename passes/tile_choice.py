"""tile-choice: give a weight-streaming matmul the largest M tile its cube buffers allow (fewer weight re-reads)."""
from __future__ import annotations

import math
from dataclasses import dataclass

from dspark_ir.graph import Graph, Node
from dspark_ir.hardware import HARDWARE

from .infra import policy
from .infra.base import RewriteRecord, register_pass
from .infra.checked import CheckedPass
from .infra.contracts import BITWISE
from .infra.options import option
from .infra.rewriting import selected, set_attrs


@dataclass(frozen=True)
class Site:
    node: Node
    tile: int               # the new M tile
    before: float           # modelled GM bytes with the old tile
    after: float            # with the new one


@register_pass
@dataclass(frozen=True)
class TileChoice(CheckedPass):
    """Raise the M (row) tile of a matmul whose weight is re-streamed once per M tile.

    A matmul block loops over its rows M tiles at a time and, for each M tile, streams the weight panel
    it multiplies through L1/L0B: the weight crosses HBM ceil(M / m_tile) times. Decode matmuls have few
    rows (T = 128 at flash) and large weights (4096 × 1024 bf16 for qr_proj), so with the 16-row tiles of
    the seed the weight traffic is 8× the weight, far above the roofline (the cost model shows
    qr_proj_matmul at ~20× its HBM bound). This pass picks the largest M tile that
      * divides M (or is M),
      * keeps every M-split part at least one tile (m_tile ≤ M / m_split, so split-m-fanout's grid stays
        valid),
      * fits the cube buffers: m_tile × MIN_K × itemsize ≤ L0A and m_tile × N × 4 ≤ L0C (N: the policy's
        TILE_CHOICE_N; MIN_K: the cube's narrowest K step, dspark_ir.hardware), and is at
        most `max_m_tile` (128: a 128×256 bf16 L0A tile and a 128×128 fp32 L0C tile, the largest tiles
        pypto's cube templates use),
    and applies it only when the modelled GM traffic (A once, the weight once per M tile, the output once,
    an atomic accumulator read and written once per K split) drops by at least `min_gain`.
    The SPMD grid (`blocks`) is unchanged: only the per-block loop over M tiles gets fewer, larger steps.

    Which matmuls: op kinds or stage names in `ops` (default: every `matmul`) with a three-entry tile
    (m, n, k) and a bound M extent.
    Contract: bitwise. Every output element is the same dot product over K in the same K order; the M tile
    only decides which rows a cube step computes together.
    """

    name = "tile-choice"
    origin = "ours: a GM-traffic model of matmul M tiles (perf A/B; not in the seed)"
    contract = BITWISE
    preserves = frozenset({"canonical", "no-dead-nodes"})
    ops: tuple[str, ...] = policy.TILE_CHOICE_OPS
    max_m_tile: int = option(policy.TILE_CHOICE_MAX_M, min=1)
    min_gain: float = option(policy.TILE_CHOICE_MIN_GAIN, min=1.0)

    def is_candidate(self, node: Node) -> bool:
        return selected(node, self.ops)

    def apply(self, g: Graph, site: Site) -> RewriteRecord:
        old = site.node.attrs["tile"]
        set_attrs(g, site.node, tile=(site.tile, *old[1:]))
        return RewriteRecord("retile", site.node.name,
                             f"M tile {old[0]} -> {site.tile}: modelled GM traffic {site.before / 2**20:.1f} -> "
                             f"{site.after / 2**20:.1f} MiB ({site.before / site.after:.1f}x less)")

    def check(self, g: Graph, node: Node) -> Site | str:
        tile = node.attrs.get("tile")
        if tile is None or len(tile) != 3:
            return f"no (m, n, k) tile (tile = {list(tile) if tile else None})"
        shapes = _shapes(g, node)
        if isinstance(shapes, str):
            return shapes
        m, k, n, item_a, item_b = shapes
        m_split = int(node.attrs.get("m_split", 1) or 1)
        best = self._best_tile(m, m_split, item_a)
        if best is None:
            return f"no M tile fits M = {m} with m_split = {m_split}"
        old = int(tile[0])
        if best <= old:
            return f"M tile {old} is already the largest that fits (M = {m}, m_split = {m_split})"
        before = traffic(node, m, k, n, item_a, item_b, old)
        after = traffic(node, m, k, n, item_a, item_b, best)
        if before < self.min_gain * after:
            return f"M tile {best} would cut modelled traffic only {before / after:.2f}x (< min_gain {self.min_gain})"
        return Site(node, best, before, after)

    def _best_tile(self, m: int, m_split: int, item_a: int) -> int | None:
        limit = min(self.max_m_tile, m // max(m_split, 1))
        limit = min(limit, HARDWARE.l0a_bytes // (HARDWARE.min_k_tile(item_a) * item_a),
                    HARDWARE.l0c_bytes // (policy.TILE_CHOICE_N * 4))
        for t in range(limit, 0, -1):
            if m % t == 0 and (t % 16 == 0 or t == m):
                return t
        return None


def traffic(node: Node, m: int, k: int, n: int, item_a: int, item_b: int, m_tile: int) -> float:
    """Modelled GM bytes of the matmul with M tile `m_tile` (see the pass docstring)."""
    out_item = 4
    acc = node.attrs.get("accumulate") == "atomic"
    k_split = int(node.attrs.get("k_split", 1) or 1)
    bytes_ = m * k * item_a + math.ceil(m / m_tile) * k * n * item_b
    bytes_ += (2 * k_split if acc else 1) * m * n * out_item
    return float(bytes_)


def _shapes(g: Graph, node: Node):
    if len(node.operands) < 2:
        return "not a two-operand product"
    a, b = node.operands[0].type, node.operands[1].type
    if a.rank != 2 or b.rank != 2:
        return "operands are not matrices"
    m, k = a.shape[0].value(g.env), a.shape[1].value(g.env)
    n_dim = b.shape[0] if node.attrs.get("trans_b") else b.shape[1]
    n = n_dim.value(g.env)
    if m is None or k is None or n is None:
        return f"extents not bound (M = {a.shape[0]}, K = {a.shape[1]}, N = {n_dim})"
    return m, k, n, a.dtype.itemsize, b.dtype.itemsize


"""quant-workers: spread the TP O path's per-row int8 quantisation over cyclic workers (a later pypto-lib form)."""
from __future__ import annotations

import re
from dataclasses import dataclass

from dspark_ir.graph import Graph, Node
from dspark_ir.ops.oproj import QuantRows

from .infra import policy
from .infra.base import RewriteRecord, register_pass
from .infra.checked import CheckedPass
from .infra.contracts import BITWISE
from .infra.options import option
from .infra.rewriting import not_one_block, selected, set_attrs

GROUP_SUFFIX = re.compile(r"\.g\d+$")     # the layers name one task per local O group: `tp_o_a_quant.g0`


@dataclass(frozen=True)
class Site:
    node: Node
    items: int          # row tiles of the task
    workers: int        # cyclic workers (never more than there are row tiles)


@register_pass
@dataclass(frozen=True)
class QuantWorkers(CheckedPass):
    """Run each local O group's `tp_o_a_quant` on `workers` cyclic workers instead of one core group.

    Before (the seed): `tp_o_a_quant` is a `pl.at` task, one core group quantising all tp·T rows of its
    group's o_proj_a output (per row: amax, scale 127/amax, round to int8), so the group's o_proj_b waits
    for one core to stream 2 MiB at TP4. After (the form of a later public pypto-lib decode_o_proj:
    `tp_o_a_quant` as `pl.spmd(O_A_QUANT_WORKERS)` over QUANT_T_TILE = 8-row tiles, 6 workers for each of
    the 4 owners' rows of a group): `tile = [rows]`, `workers = blocks = min(workers, row tiles)`, worker w
    quantising the row tiles w, w + workers, …; a row count that is not a multiple of the tile clamps the
    last tile (`tail = clamp`).

    Rows are independent (each row's scale is its own amax), so the grid changes which core quantises a row,
    never its value. Contract: bitwise. Which tasks: `quant_rows` nodes whose stage name, full name or op
    kind is in `ops`, with or without its `.g<N>` group suffix (default the TP O path's `tp_o_a_quant`; the TP1 path's
    `quant`, which the later version
    keeps as one `pl.at`, is left alone) and that are still one block with no row tile.
    """

    name = "quant-workers"
    origin = "a later public pypto-lib form (decode_o_proj O_A_QUANT_WORKERS)"
    contract = BITWISE
    preserves = frozenset({"canonical", "no-dead-nodes"})
    candidates = (QuantRows,)
    workers: int = option(policy.QUANT_WORKERS, min=1)
    rows: int = option(policy.QUANT_ROWS, min=1)
    ops: tuple[str, ...] = policy.QUANT_OPS

    def apply(self, g: Graph, site: Site) -> RewriteRecord:
        node = site.node
        ragged = {"tail": "clamp"} if site.items * self.rows != node.operands[0].type.shape[0].value(g.env) else {}
        set_attrs(g, node, tile=[self.rows], workers=site.workers, blocks=site.workers, **ragged)
        return RewriteRecord("workers", node.name, f"{site.workers} cyclic workers over {site.items} tiles of "
                                                   f"{self.rows} rows{' (last clamped)' if ragged else ''}")

    def _chosen(self, node: Node) -> bool:
        stage = GROUP_SUFFIX.sub("", node.name.split(".", 1)[-1])
        return selected(node, self.ops) or stage in self.ops

    def check(self, g: Graph, node: Node) -> Site | str:
        """The site, or why this quant_rows is not one."""
        if self.workers < 1 or self.rows < 1:
            return f"workers = {self.workers} and rows = {self.rows} must both be at least 1"
        if self.ops and not self._chosen(node):
            return f"not one of ops = {list(self.ops)}"
        if "tile" in node.attrs or "workers" in node.attrs:
            return "already tiled over rows"
        refusal = not_one_block(g, node)
        if refusal is not None:
            return refusal
        rows_dim = node.operands[0].type.shape[0]
        rows = rows_dim.value(g.env)
        if rows is None:
            return f"the row extent {rows_dim} is not bound"
        items = -(-rows // self.rows)
        if items < 2:
            return f"{rows} rows are one tile of {self.rows}"
        return Site(node, items, min(self.workers, items))

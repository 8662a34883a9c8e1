"""o-proj-valid-rows: the TP1 O projection's int8 proj_b on the T valid rows instead of the padded capacity."""
from __future__ import annotations

from dataclasses import dataclass

from dspark_ir import dims as D
from dspark_ir.graph import Graph, Node
from dspark_ir.ops.oproj import OProjB, OProjBDequant, QuantRows

from .infra.base import RewriteRecord, register_pass
from .infra.checked import CheckedPass
from .infra.contracts import BITWISE
from .infra.options import option
from .infra.rewriting import is_returned, replace_node


@dataclass(frozen=True)
class Site:
    node: Node      # o_proj_b over the padded rows
    quant: Node     # its quant_rows (pad_rows > 0)
    rows: int       # the valid rows (the quant's x rows, bound)
    tile: int       # proj_b's row tile


@register_pass
@dataclass(frozen=True)
class OProjValidRows(CheckedPass):
    """Shrink each O group's padded int8 proj_b (and its quant's zero padding) to the rows that hold tokens.

    Before (the seed's decode_o_proj_tp1, pypto-lib before #1226): the TP1 buffers are sized for the compiled token
    capacity T_PAD (ceil16 of LOCAL_T); with T < T_PAD tokens in the step, each group's `quant` zeroes the int8
    rows T … T_PAD and `proj_b_mm` runs T_PAD/128 row blocks × D/512 column blocks (flash, capacity 512, any
    T ≤ 128: 32 blocks per group, 256 for the 8 groups), three of four row blocks multiplying zeros; the dequant
    (`proj_b_act`) reads only the first T rows. In the IR: `quant_rows {pad_rows = T_PAD}` → i8[T_PAD, ·],
    `o_proj_b` over T_PAD rows, `o_proj_b_dequant` with one output row per scale row.
    After (#1226): the quant writes T rows, proj_b covers ceil(T/tile) row blocks (8 per group, 64 in all at
    T ≤ 128; a T that is not a multiple of the tile clamps its last block, `tail = clamp`); the node names stay
    the seed's, so the graph is the one the layer builds without a capacity.

    Why it is bitwise: the padded rows are zeros that only ever reach the rows of the accumulator the dequant
    does not read; every row it reads is the same int8 product of the same int8 row. Which candidates it leaves
    alone: an o_proj_b whose int8 rows are not a padded quant's (the TP path's exchanged tp·T rows, or a TP1 graph
    built without a capacity: nothing to shrink), a padded buffer that another task reads or the graph returns, an
    accumulator read by anything but the dequant (it might read the padded rows), and unbound T.
    `row_tile = 0` keeps proj_b's row tile (the seed's 128).
    """

    name = "o-proj-valid-rows"
    origin = "later pypto-lib form: #1226 (decode_o_proj_tp1 proj_b_mm over ceil(T/128) row blocks)"
    contract = BITWISE
    candidates = (OProjB,)
    row_tile: int = option(0, min=0)

    def apply(self, g: Graph, site: Site) -> RewriteRecord:
        node, quant = site.node, site.quant
        x, wo_b = quant.operands[0], node.operands[1]
        names = [v.name for v in quant.results]
        q_attrs = {k: v for k, v in quant.attrs.items() if k != "pad_rows"}
        new_q = g.add_op(QuantRows.name, [x], q_attrs, names=[g.fresh_name(n) for n in names], deps=quant.deps,
                         near=quant)
        tile = node.attrs["tile"]
        n_tile = tile[1] if len(tile) > 1 else wo_b.type.shape[0].value(g.env)
        hidden = wo_b.type.shape[0].value(g.env)
        rows_dim = x.type.shape[0]
        b_attrs = {k: v for k, v in node.attrs.items() if k not in ("blocks", "tail", "tile")}
        b_attrs["tile"] = [site.tile, *tile[1:]]
        b_attrs["blocks"] = D.ceildiv(rows_dim, site.tile) * D.ceildiv(hidden, n_tile)
        if site.rows % site.tile:
            b_attrs["tail"] = "clamp"
        b_name = node.result.name
        new_b = g.add_op(OProjB.name, [new_q.results[0], wo_b], b_attrs, names=g.fresh_name(b_name),
                         deps=node.deps, near=node)
        before = node.attrs["blocks"].value(g.env)
        replace_node(g, node, new_b.results)
        replace_node(g, quant, new_q.results)
        for value, name in zip(new_q.results, names):
            g.rename(value, name)
        g.rename(new_b.result, b_name)
        after = new_b.attrs["blocks"].value(g.env)
        clamped = ", last block clamped" if site.rows % site.tile else ""
        return RewriteRecord("shrink", b_name, f"{before} -> {after} blocks over the {site.rows} valid rows "
                                               f"(%{names[0]} pads no rows{clamped})")

    def check(self, g: Graph, node: Node) -> Site | str:
        x = node.operands[0]
        quant = x.producer
        if quant is None or quant.opdef is not QuantRows or not quant.attrs.get("pad_rows"):
            return (f"its int8 rows %{x.name} are all valid (no padded quant: the TP path's exchanged rows, or a "
                    "TP1 graph without a token capacity)")
        if is_returned(g, quant):
            return f"the padded int8 rows %{x.name} are returned by the graph"
        others = [u for u in g.users(x) if u is not node]
        if others:
            return f"the padded int8 rows %{x.name} are also read by %{others[0].name} ({others[0].op})"
        if is_returned(g, node):
            return f"the padded accumulator %{node.result.name} is returned by the graph"
        readers = g.users(node.result)
        other = next((u for u in readers if u.opdef is not OProjBDequant or node.result not in u.operands), None)
        if other is not None:
            return (f"the padded accumulator %{node.result.name} is read by %{other.name} ({other.op}), which "
                    "might read its padded rows")
        rows = quant.operands[0].type.shape[0].value(g.env)
        if rows is None:
            return f"the valid rows {quant.operands[0].type.shape[0]} are not bound (the row blocks need them)"
        tile = node.attrs.get("tile")
        if not tile:
            return "proj_b has no row tile (its row blocks are not known)"
        return Site(node, quant, rows, self.row_tile or int(tile[0]))

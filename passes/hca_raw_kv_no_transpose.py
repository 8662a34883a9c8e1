"""hca-raw-kv-no-transpose: the HCA raw-window attention reads the gathered rows; the GM Kᵀ copy goes (#1035)."""
from __future__ import annotations

from dataclasses import dataclass

from dspark_ir.graph import Graph, Node
from dspark_ir.ops.attention import QkPv
from dspark_ir.ops.sparse import CsaQkPv, HcaRawAttn, HcaRawAttnDirect, HcaRawTranspose

from .infra.base import RewriteRecord, register_pass
from .infra.checked import CheckedPass
from .infra.contracts import BITWISE
from .infra.rewriting import erase_if_dead, is_returned, replace_node


@dataclass(frozen=True)
class Site:
    node: Node          # hca_raw_attn
    transpose: Node     # the hca_raw_transpose that makes its Kᵀ operand


@register_pass
@dataclass(frozen=True)
class HcaRawKvNoTranspose(CheckedPass):
    """Replace hca_raw_attn(q, rows, hca_raw_transpose(rows), indices) by hca_raw_attn_direct(q, rows, indices).

    Before (dspark-model.md §3.3 8b/8e): `hca_raw_transpose` copies every token's gathered window rows
    [T, W, HD] into a Kᵀ buffer [T, HD, W] in GM (spmd T·W/RAW_K_TILE, 512 blocks at flash TP4: T·W·HD·2 bytes
    read and written again), and `hca_raw_attn` waits for it. Our hca_raw_attn template never reads that copy
    (its key-major cube matmul K·qᵀ takes the rows), so the task is pure overhead here.
    After (pypto-lib #1035): `hca_raw_attn_direct` reads only the rows; its kernel loads them into the cube's
    buffer and uses a transposed view for QK. The transpose task, its buffer and the edge gather → transpose →
    attention go (the attention now waits on the gather only).
    Why it is bitwise: rows_t = rows with the last two axes swapped (exact), so Σ_d q·Kᵀ over it is the same sum
    of the same products; the reference is hca_raw_attn's with the keys taken from the rows.
    It does not fire when the Kᵀ operand is not hca_raw_transpose of the same rows (another producer's values
    could differ). The transpose stays when something else reads it or the graph returns it. SWA's qk_pv and
    CSA's csa_qk_pv already read their keys without a transposed copy (--explain says so); MoE has no candidate.
    """

    name = "hca-raw-kv-no-transpose"
    origin = "pypto-lib #1035: load raw KV into the cube buffer, QK on a transposed view; no GM transpose task"
    contract = BITWISE
    candidates = (HcaRawAttn,)
    not_candidates = {**{op: f"{op.name} reads its gathered keys directly already (no transposed copy)"
                         for op in (QkPv, CsaQkPv)},
                      HcaRawAttnDirect: "already reads the rows directly (no Kᵀ operand)"}

    def apply(self, g: Graph, site: Site) -> RewriteRecord:
        node = site.node
        q, rows, _rows_t, indices = node.operands
        direct = g.add_op(HcaRawAttnDirect.name, [q, rows, indices], dict(node.attrs),
                          names=[g.fresh_name(v.name + "_direct") if i == 0 else g.fresh_name(v.name + ".direct")
                                 for i, v in enumerate(node.results)],
                          deps=node.deps, near=node)
        transpose = site.transpose
        replace_node(g, node, direct.results)
        gone = erase_if_dead(g, transpose)
        kept = "" if gone else (" (the transpose stays: it is returned)" if is_returned(g, transpose)
                                else " (the transpose stays: it has other readers)")
        return RewriteRecord("direct", node.name, f"-> %{direct.name} on %{rows.name}; "
                                                  f"%{transpose.name} {'removed' if gone else 'kept'}{kept}")

    def check(self, g: Graph, node: Node) -> Site | str:
        rows, rows_t = node.operands[1], node.operands[2]
        producer = rows_t.producer
        if producer is None or producer.opdef is not HcaRawTranspose:
            what = "a graph input" if producer is None else f"made by %{producer.name} ({producer.op})"
            return (f"its Kᵀ operand %{rows_t.name} is {what}, not hca_raw_transpose of its rows: dropping it could "
                    "change the keys")
        if producer.operands[0] is not rows:
            return (f"its Kᵀ operand %{rows_t.name} transposes %{producer.operands[0].name}, not its rows "
                    f"%{rows.name}: dropping it could change the keys")
        return Site(node, producer)

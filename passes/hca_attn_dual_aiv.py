"""hca-attn-dual-aiv: HCA attention on 64-head tiles, CMP on 24 workers with its softmax on both AIVs (#1187)."""
from __future__ import annotations

from dataclasses import dataclass

from dspark_ir import dims as D
from dspark_ir.graph import Graph, Node
from dspark_ir.ops.attention import QkPv
from dspark_ir.ops.sparse import CsaQkPv, HcaCmpQkPv, HcaRawAttn, HcaRawAttnDirect

from .infra import policy
from .infra.base import RewriteRecord, register_pass
from .infra.checked import CheckedPass
from .infra.contracts import BITWISE
from .infra.options import option
from .infra.rewriting import set_attrs


@dataclass(frozen=True)
class Site:
    node: Node
    attrs: dict         # the attributes to set
    what: str           # the record's detail


@register_pass
@dataclass(frozen=True)
class HcaAttnDualAiv(CheckedPass):
    """Re-grid the HCA attention tasks the way pypto-lib #1187 did, and split the compressed softmax over both AIVs.

    * `hca_raw_attn`: one block per (token, 16-head tile) → one per (token, `head_tile`-head tile): each query's
      q·Kᵀ and p·V become one 64-head matmul (a flash rank's 64 heads: 512 → 128 blocks at TP4).
    * `hca_cmp_qk_pv`: one block per (token, work item) → `cmp_workers` cyclic workers (24: one per core group,
      upstream went 16 → 24), and `aiv_split = 2`: the template runs the vector softmax of each group of tokens
      as two independent subgraphs (halves of the group's tokens), the two AIVs of a core group, where the
      seed ran it as one.
    * `hca_raw_attn` (or `hca_raw_attn_direct`, its #1035 form; both carry the option on to the per-request form
      of raw-kv-gather-per-request): `lookahead` (a kernel-template option, 0 = off): upstream's QK look-ahead of
      2 across queries (QK_PRE_LAUNCH = 2: the cube issues query i + 2's q·Kᵀ before query i's P·V, the scores and
      probabilities passing through 3 transfer slots with cross-core events). Our template emits that order:
      in each loop iteration's unrolled queries, the q·Kᵀ of the unit `lookahead` queries ahead comes before the
      softmax and P·V of the current unit, each unit's scores in a tile of its own. What pypto 0.2.0 cannot
      express: the events and slots (its runtime dispatches tasks by data dependencies, so the emitted order is
      the program order it partitions, not a schedule it must keep), and a look-ahead across loop iterations
      (each iteration is its own set of subgraphs), so the look-ahead spans the 4 queries of one iteration.

    The softmax reduces over the keys of one (token, head) column; splitting the columns between subgraphs or
    the heads between blocks changes which core computes a column, never its value; the look-ahead only changes
    the program order of independent tasks. Contract: bitwise. Left alone: a raw task already on `head_tile` heads
    (or all of them) with the look-ahead already `lookahead`, a compressed task already on workers. CSA's
    qk_pv already runs on NUM_QK_CORES cyclic workers and was not changed by #1187 (--explain says so).
    """

    name = "hca-attn-dual-aiv"
    origin = ("pypto-lib #1187 (decode_sparse_attn_hca: 64-head matmuls, split_aiv(2), CMP on 24 workers, "
              "QK_PRE_LAUNCH = 2)")
    contract = BITWISE
    preserves = frozenset({"canonical", "no-dead-nodes"})
    candidates = (HcaRawAttn, HcaRawAttnDirect, HcaCmpQkPv)
    not_candidates = {QkPv: "SWA's window attention: #1187 changed the HCA attention templates only",
                      CsaQkPv: "CSA's qk_pv already runs on cyclic workers (#1187 changed HCA only)"}
    head_tile: int = option(policy.HCA_ATTN_HEAD_TILE, min=1)
    aiv_split: int = option(policy.HCA_ATTN_AIV_SPLIT, min=1)
    cmp_workers: int = option(policy.HCA_CMP_WORKERS, min=1)
    lookahead: int = option(policy.HCA_RAW_QK_LOOKAHEAD, min=0)

    def apply(self, g: Graph, site: Site) -> RewriteRecord:
        set_attrs(g, site.node, **site.attrs)
        return RewriteRecord("regrid", site.node.name, site.what)

    def check(self, g: Graph, node: Node) -> Site | str:
        return self._cmp(g, node) if node.opdef is HcaCmpQkPv else self._raw(g, node)

    def _raw(self, g: Graph, node: Node) -> Site | str:
        tokens, heads_dim = node.operands[0].type.shape[:2]
        heads = heads_dim.value(g.env)
        tile = node.attrs.get("tile")
        if heads is None or tokens.value(g.env) is None:
            return f"the tokens {tokens} or heads {heads_dim} are not bound"
        if tile is None or len(tile) != 2:
            return "no [tokens, heads] tile"
        want = min(self.head_tile, heads)
        attrs, what = {}, []
        if tile[1] >= want:
            regrid = f"already {tile[1]} of {heads} heads per block (head_tile = {self.head_tile})"
        elif heads % want:
            regrid = f"head_tile {want} does not divide the {heads} heads"
        else:
            regrid = None
            blocks = D.mul(D.ceildiv(tokens, tile[0]), heads // want)
            attrs.update(tile=[tile[0], want], blocks=blocks)
            what.append(f"{node.attrs['blocks'].value(g.env)} -> {blocks.value(g.env)} blocks of {want} heads")
        if (node.attrs.get("lookahead") or 0) != self.lookahead:
            attrs["lookahead"] = self.lookahead
            what.append(f"QK look-ahead {self.lookahead}" if self.lookahead else "QK look-ahead off")
        if not attrs:
            return f"{regrid} and QK look-ahead {self.lookahead}"
        return Site(node, attrs, ", ".join(what))

    def _cmp(self, g: Graph, node: Node) -> Site | str:
        if "workers" in node.attrs:
            return f"already on {node.attrs['workers']} workers"
        blocks = node.attrs.get("blocks")
        items = None if blocks is None else blocks.value(g.env)
        if items is None:
            return f"the block count {blocks} is not bound"
        workers = min(self.cmp_workers, items)
        if workers == items and self.aiv_split < 2:
            return f"already {items} blocks and aiv_split = {self.aiv_split}: nothing to change"
        return Site(node, {"workers": workers, "blocks": workers, "aiv_split": self.aiv_split},
                    f"{items} blocks -> {workers} cyclic workers, softmax over {self.aiv_split} AIV subgraphs")

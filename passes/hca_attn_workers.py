"""hca-attn-workers: the HCA raw attention on cyclic token workers and the compressed QK/PV one block per request."""
from __future__ import annotations

from dataclasses import dataclass

from dspark_ir import dims as D
from dspark_ir.graph import Graph, Node
from dspark_ir.ops.sparse import HcaCmpQkPv, HcaRawAttn, HcaRawAttnDirect, HcaRawAttnRequest

from .infra import policy
from .infra.base import RewriteRecord, register_pass
from .infra.checked import CheckedPass
from .infra.contracts import BITWISE
from .infra.options import option
from .infra.rewriting import set_attrs


@dataclass(frozen=True)
class Site:
    node: Node
    attrs: dict         # the grid attributes to set
    what: str           # the record's detail


@register_pass
@dataclass(frozen=True)
class HcaAttnWorkers(CheckedPass):
    """Re-grid the HCA sparse attention's two mixed tasks the way the code of the chip swimlane ran them.

    * raw attention (`hca_raw_attn`, `_direct`, `_request`): one block per (token, 16-head tile), T·H/16 = 512 at
      flash TP4 (the seed's `stream_block_count`) → `raw_workers` cyclic workers over the tokens, worker w taking
      tokens w, w + raw_workers, … with all of a token's heads (pypto-lib decode_sparse_attn_hca at fa5bf7e:
      `pl.spmd(RAW_WORKERS = 20)`, `pl.range(worker, t_dim, RAW_WORKERS)`, the heads in 32-head tiles inside;
      the capture shows 20 raw AIC records): `tile = [1, H]`, `workers = blocks = min(raw_workers, T)`.
    * compressed QK/PV (`hca_cmp_qk_pv`): one block per (token, work item), T·works = 128 → one block per
      (request, work item): the request's `seq` tokens share the block's compressed-KV load (upstream's
      CMP_T_TILE = 8 grouping; the fa5bf7e capture shows 16 AIC + 32 AIV records at 16×8): `tile = [seq]`,
      `blocks = ceil(T / seq)·works`. Our template already loads each request's rows once and runs its tokens
      together; only the grid the schedule sees was the seed's.

    Attributes only: the templates do not read these grids (pypto 0.2.0 costs the whole task as one program; the
    schedule model spreads it over the grid), so the kernels and their values are unchanged. Contract: bitwise.
    Left alone: a task already on cyclic workers (hca-attn-dual-aiv's compressed workers, or this pass's), a grid
    already no wider than the target, unbound extents, and a compressed task whose T is not a whole number of
    requests.
    """

    name = "hca-attn-workers"
    origin = ("pypto-lib decode_sparse_attn_hca as the fa5bf7e chip swimlane ran it (RAW_WORKERS = 20; "
              "hca_cmp_qk_pv per request, CMP_T_TILE = 8)")
    contract = BITWISE
    preserves = frozenset({"canonical", "no-dead-nodes"})
    candidates = (HcaRawAttn, HcaRawAttnDirect, HcaRawAttnRequest, HcaCmpQkPv)
    raw_workers: int = option(policy.HCA_RAW_WORKERS, min=1)
    cmp_per_request: bool = True

    def apply(self, g: Graph, site: Site) -> RewriteRecord:
        set_attrs(g, site.node, **site.attrs)
        return RewriteRecord("regrid", site.node.name, site.what)

    def check(self, g: Graph, node: Node) -> Site | str:
        if "workers" in node.attrs:
            return f"already on {node.attrs['workers']} cyclic workers"
        blocks = node.attrs.get("blocks")
        count = None if blocks is None else blocks.value(g.env)
        tokens_dim = node.operands[0].type.shape[0]
        tokens = tokens_dim.value(g.env)
        if count is None or tokens is None:
            return f"the block count {blocks} or the token count {tokens_dim} is not bound"
        if node.opdef is HcaCmpQkPv:
            return self._cmp(g, node, count, tokens)
        return self._raw(node, count, tokens)

    def _raw(self, node: Node, count: int, tokens: int) -> Site | str:
        heads = node.operands[0].type.shape[1].value()
        workers = min(self.raw_workers, tokens)
        if count <= workers:
            return f"already {count} blocks for {tokens} tokens (raw_workers = {self.raw_workers})"
        return Site(node, {"tile": [1, heads], "workers": workers, "blocks": workers},
                    f"{count} blocks -> {workers} cyclic workers over the {tokens} tokens")

    def _cmp(self, g: Graph, node: Node, count: int, tokens: int) -> Site | str:
        if not self.cmp_per_request:
            return "cmp_per_request = false"
        seq = node.attrs["seq"]
        if tokens % seq:
            return f"T = {tokens} is not a whole number of requests of {seq} tokens"
        tile = node.attrs.get("tile") or [1]
        if tile[0] >= seq:
            return f"already {tile[0]} tokens per block (a request is {seq})"
        works = node.operands[1].type.shape[1].value() // node.attrs["work_rows"]
        blocks = D.mul(D.floordiv(node.operands[0].type.shape[0], seq), works)
        return Site(node, {"tile": [seq], "blocks": blocks},
                    f"{count} blocks -> {blocks.value(g.env)} (one per request of {seq} tokens and work item)")

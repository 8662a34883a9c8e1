"""raw-kv-gather-per-request: the HCA raw-window rows gathered once per request, not once per token (#1098)."""
from __future__ import annotations

from dataclasses import dataclass

from dspark_ir import dims as D
from dspark_ir.graph import Graph, Node
from dspark_ir.ops.attention import SwaGatherKv
from dspark_ir.ops.sparse import HcaRawAttn, HcaRawAttnDirect, HcaRawAttnRequest, HcaRequestKvGather

from .infra.base import RewriteRecord, register_pass
from .infra.checked import CheckedPass
from .infra.contracts import BITWISE
from .infra.options import option
from .infra.rewriting import erase_if_dead, replace_node


@dataclass(frozen=True)
class Site:
    node: Node      # hca_raw_attn_direct
    gather: Node    # the swa_gather_kv of its rows
    seq: int        # S, tokens per request


@register_pass
@dataclass(frozen=True)
class RawKvGatherPerRequest(CheckedPass):
    """Gather the HCA raw window once per request: swa_gather_kv → hca_raw_attn_direct becomes
    hca_request_kv_gather → hca_raw_attn_request.

    Before: `hca.hca_gather_kv` copies W rows per token, T·W rows (spmd T·GATHER_SPLITS): the S speculative tokens
    of a request copy nearly the same window S times, since token k's window is token 0's slid by k rows.
    After (pypto-lib #1098): one gather task per request copies the W + S − 1 rows its tokens attend (the first
    token's window, then each later token's newest row: B·(W + S − 1) rows, ~S× fewer bytes), and the raw
    attention takes token k's W keys from its request's rows at offset d_t = e_{t0} + k − e_t (e = one past the
    last index of the token's window row). The mask stays the token's own (indices ≥ 0).
    `contiguous` (pypto-lib #1170 (a), a template option on the gather): when a request's W + S − 1 cache rows are
    consecutive, its kernel copies them as one run instead of row runs; the values are the same either way, so
    the option only changes the kernel (and its cost), and it toggles here: `raw-kv-gather-per-request{
    contiguous=false}` keeps the row runs.
    Why it is bitwise: under the decode layer's input contract (goldens/inputs.py: each token's window row lists
    its visible positions oldest first with a −1 tail, and a request's tokens sit at consecutive positions), the
    key rows each token reads are the ones its own gather produced, zero where masked, so the attention sums
    the same terms; hence the pass requires the decode-hca layer (whose inputs keep that contract), not any graph
    with these ops. It does not fire with S = 1 (nothing is shared), when T is not a bound multiple of S, when the
    attention reads a transposed copy (run hca-raw-kv-no-transpose first), or when the attention's rows are not
    swa_gather_kv of its own indices. The per-token gather stays when something else reads it.
    """

    name = "raw-kv-gather-per-request"
    origin = "pypto-lib #1098 (one raw-KV gather per request) with #1170 (a) (one contiguous W+S-1-row copy)"
    contract = BITWISE
    requires = frozenset({"layer:decode-hca"})
    candidates = (HcaRawAttnDirect,)
    not_candidates = {HcaRawAttn: "reads a transposed copy of its rows (Kᵀ operand): run hca-raw-kv-no-transpose "
                                  "first, the per-request rows have no transposed form",
                      HcaRawAttnRequest: "already reads per-request rows"}
    contiguous: bool = option(True)

    def apply(self, g: Graph, site: Site) -> RewriteRecord:
        node, gather, seq = site.node, site.gather, site.seq
        q, rows, indices = node.operands
        kv_cache = gather.operands[0]
        prefix = f"{node.block}." if node.block else ""
        tokens = indices.type.shape[0]
        request = g.add_op(HcaRequestKvGather.name, [kv_cache, indices],
                           {"seq": seq, "contiguous": self.contiguous, "blocks": D.floordiv(tokens, seq)},
                           names=g.fresh_name(prefix + "hca_request_kv_gather"), deps=gather.deps, near=gather)
        attn = g.add_op(HcaRawAttnRequest.name, [q, request.result, indices], {**node.attrs, "seq": seq},
                        names=[g.fresh_name(v.name + ".request") if i else g.fresh_name(prefix + "hca_raw_attn_request")
                               for i, v in enumerate(node.results)],
                        deps=node.deps, near=node)
        replace_node(g, node, attn.results)
        gone = erase_if_dead(g, gather)
        width = indices.type.shape[1].value(g.env)
        return RewriteRecord("per-request", node.name,
                             f"%{request.name} ({request.attrs['blocks']} blocks of {width} + {seq - 1} rows"
                             f"{', one run when consecutive' if self.contiguous else ', row runs'}) -> %{attn.name}; "
                             f"%{gather.name} {'removed' if gone else 'kept (other readers)'}")

    def check(self, g: Graph, node: Node) -> Site | str:
        q, rows, indices = node.operands
        gather = rows.producer
        if gather is None or gather.opdef is not SwaGatherKv:
            what = "a graph input" if gather is None else f"made by %{gather.name} ({gather.op})"
            return f"its rows %{rows.name} are {what}, not a window gather (swa_gather_kv)"
        if gather.operands[1] is not indices:
            return (f"its rows are gathered with %{gather.operands[1].name}, its mask reads %{indices.name}: the "
                    "request rows would not line up with the mask")
        seq = g.env.get("S")
        tokens = indices.type.shape[0].value(g.env)
        if seq is None or tokens is None:
            return "the tokens per request S or the token count T is not bound"
        if seq == 1:
            return "S = 1: one token per request, its window gather is already the request's"
        if tokens % seq:
            return f"T = {tokens} is not a whole number of requests of S = {seq} tokens"
        return Site(node, gather, seq)

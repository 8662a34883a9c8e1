"""pool-fanout: the compressor's scatter_softmax_pool as an SPMD grid over requests (a later pypto-lib form)."""
from __future__ import annotations

from dataclasses import dataclass

from dspark_ir import dims as D
from dspark_ir.graph import Graph, Node
from dspark_ir.ops.compressor import CmpScatterSoftmaxPool

from .infra import policy
from .infra.base import RewriteRecord, register_pass
from .infra.checked import CheckedPass
from .infra.contracts import BITWISE
from .infra.options import option
from .infra.rewriting import not_one_block, set_attrs


@dataclass(frozen=True)
class Site:
    node: Node
    batch: D.Dim        # the request count B, as written in the graph
    ragged: bool        # B is not a multiple of `requests`: the last block is clamped


@register_pass
@dataclass(frozen=True)
class PoolFanout(CheckedPass):
    """Fan the compressor's `scatter_softmax_pool` out from one core group to one SPMD block per `requests`.

    Before (the seed): one `pl.at` task walks the B requests one after the other: it scatters each request's
    S new tokens into that request's paged ring state and, when the request crosses a pooling boundary,
    pools its window. At B = 16 that serial walk sits between the score projection and the compressed cache
    write, on the compressed attention's critical path. After (the form of a later public pypto-lib
    `decode_compressor_ratio128`: `pl.spmd(ceil(B / POOL_REQUEST_TILE))` with POOL_REQUEST_TILE = 2): `tile =
    [requests]`, `blocks = ceil(B / requests)`, block i taking requests [i·requests, min((i+1)·requests, B))
    (`tail = clamp` when B is not a multiple of `requests`). The ratio-4 compressor of that version uses
    min(B, 48) cyclic workers, which at B ≤ 48 is `requests = 1`.

    Sound because requests share no written element: a request's tokens go to the state rows its own block
    table row maps (the batch contract: no state page belongs to two requests) and it pools only its own
    window into its own pooled row. Contract: bitwise, each request's arithmetic is unchanged.
    """

    name = "pool-fanout"
    origin = "a later public pypto-lib form (decode_compressor POOL_REQUEST_TILE)"
    contract = BITWISE
    preserves = frozenset({"canonical", "no-dead-nodes"})
    candidates = (CmpScatterSoftmaxPool,)
    requests: int = option(policy.POOL_REQUESTS, min=1)

    def apply(self, g: Graph, site: Site) -> RewriteRecord:
        node = site.node
        tail = {"tail": "clamp"} if site.ragged else {}
        set_attrs(g, node, tile=[self.requests], blocks=D.ceildiv(site.batch, self.requests), **tail)
        return RewriteRecord("fanout", node.name, f"{node.attrs['blocks']} blocks of {self.requests} "
                                                  f"request(s){', last clamped' if site.ragged else ''}")

    def check(self, g: Graph, node: Node) -> Site | str:
        """The site, or why this pool is not one."""
        if "tile" in node.attrs:
            return f"already {node.attrs['tile'][0]} request(s) per block"
        refusal = not_one_block(g, node)
        if refusal is not None:
            return refusal
        batch = node.operands[4].type.shape[0]
        count = batch.value(g.env)
        if count is None:
            return f"the request count {batch} is not bound"
        if count <= self.requests:
            return f"{count} request(s) fit one block of {self.requests}"
        return Site(node, batch, count % self.requests != 0)

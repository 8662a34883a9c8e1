"""early-resolve-csa-producers: the six CSA decode producers of pypto-lib #915 get `aer = true` (early resolve)."""
from __future__ import annotations

from dataclasses import dataclass

from dspark_ir.graph import Graph, Node
from dspark_ir.ops.sparse import CsaQkPv, KvTouch

from .infra import policy
from .infra.base import Pass, RewriteRecord, Skip, register_pass
from .infra.contracts import BITWISE
from .infra.rewriting import selected, set_attrs


@register_pass
@dataclass(frozen=True)
class EarlyResolveCsaProducers(Pass):
    """Mark the CSA decode producers `stages` allow-early-resolve: a scheduling hint, no value or edge changes.

    Before: `cmp.rmsnorm_rope_cache_write`, `idx.weights_proj_reduce`, `icmp.kv_and_cache_write`,
    `csa.kv_touch`, `csa.qk_pv` and `csa.rope_cs` wait, like any task without the hint, until every producer they
    depend on has completed before the scheduler places them. After (pypto-lib #915, `allow_early_resolve=True`
    on exactly these six scopes): a task whose explicit deps are done may be dispatched once the producers it
    reaches only through inferred (TensorMap) hazards have all their blocks placed; its blocks park on their
    cores and start when those producers complete, so the consumer is staged while they run. The lowering
    records the hint in the task graph (`attrs.aer`, tasks.json) and the multi-rank simulator dispatches by it
    (lowering/simulate/engine.py "Dispatch"); the task's explicit deps are unchanged, so the dependency lint
    sees the same edges.

    Values: the hint changes when a task is dispatched, never what it reads (it still starts after all of its
    deps are done). Contract: bitwise. Left alone, with the reason: a listed task already marked, and the same
    stages in a graph without CSA's sparse attention (`csa_qk_pv`) or its WAR marker (`kv_touch`): #915
    deliberately left the kernels SWA, HCA and prefill share unmarked.
    """

    name = "early-resolve-csa-producers"
    origin = ("pypto-lib #915 (allow_early_resolve on six CSA decode producers), merged before the studied "
              "snapshot 634e77bd: the seeds' base had it, so the builders emit the form before it and the seed "
              "cases run this pass on both sides")
    contract = BITWISE
    preserves = frozenset({"canonical", "no-dead-nodes", "no-common-subexpressions"})
    stages: tuple[str, ...] = policy.EARLY_RESOLVE_CSA_STAGES

    def match(self, g: Graph):
        csa = any(node.opdef in (CsaQkPv, KvTouch) for node in g.nodes.values())
        for node in g.topo_order():
            if selected(node, self.stages):
                verdict = _refusal(node) if csa else CSA_ONLY
                yield node if verdict is None else Skip(node.name, verdict)

    def rewrite(self, g: Graph, node: Node) -> RewriteRecord | None:
        if _refusal(node) is not None:
            return None
        set_attrs(g, node, aer=True)
        return RewriteRecord("early-resolve", node.name, "aer = true (dispatched while its inferred producers run)")


CSA_ONLY = "not a CSA graph (no csa_qk_pv or kv_touch): #915 marks CSA's producers only"


def _refusal(node: Node) -> str | None:
    if node.attrs.get("aer"):
        return "already allows early resolve (aer = true)"
    return None

"""deterministic-split-k: per-split partial buffers reduced in ascending K order instead of FP32 atomics."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dspark_ir import dims as D
from dspark_ir.graph import Graph, Node
from dspark_ir.ops import OpDef
from dspark_ir.ops.core import Matmul, Zeros
from dspark_ir.ops.hc import HcPreLinear, HcPreLinearReduce
from dspark_ir.ops.splitk import MatmulPartials, SplitReduce

from .infra.base import Pass, RewriteRecord, Skip, register_pass
from .infra.contracts import bounded_reassoc
from .infra.rewriting import erase_if_dead

# op kind of the atomic form → (op kind of the partials, op kind of the ascending reduction)
FORMS: dict[type[OpDef], tuple[type[OpDef], type[OpDef]]] = {
    HcPreLinear: (HcPreLinear, HcPreLinearReduce),
    Matmul: (MatmulPartials, SplitReduce),
}
# Attributes of an atomic matmul that do not carry over to matmul_partials (the partials are always f32).
MATMUL_ONLY = ("out", "accumulate")


@dataclass(frozen=True)
class Site:
    node: Node


@register_pass
@dataclass(frozen=True)
class DeterministicSplitK(Pass):
    """Replace FP32 atomic split-K accumulation by per-split partials summed in ascending K order.

    Before (dspark-model.md §6(f)): a seed task zeroes the accumulator, then the k_split blocks of the
    split-K task AtomicAdd their partial sums into it. The adds land in completion order, so two runs of the
    same inputs can differ in the last bits. After, as in the seed PR (#982): every split writes its own
    disjoint row block of a partials buffer [k_split·T, N] (`hc_pre_linear {accumulate = ordered}`, or
    `matmul_partials`) and a new reduce task (`hc_pre_linear_reduce`, `split_reduce`; one block per tile of
    rows of the split-K task) adds the blocks in ascending split order. The seed task is removed when nothing
    else reads it. The golden uses the same order (dsv4-math §2.1: cube MAD groups of 4 inside a split, the
    splits added in ascending order), and so does the reference of the atomic form.

    Which reductions (`targets`): `hc` (default) rewrites hc_pre's linear only, as the seed PR did. `all`
    also rewrites the atomic core `matmul`s (qkv's qr_proj and kv_proj). That is off by default because the
    seed PR's deterministic qkv was reverted: the partial buffers and the extra reduce task sit on the
    prefill critical path and cost time there (hc_pre alone already cost 167.0 → 199.5 µs at 512 prefill rows,
    decode unchanged), while the qkv atomics' last-bit noise is absorbed by the layer tolerances
    (goldens/tolerances.py: the qr ±1 LSB row allowance). Use `all` for bitwise-reproducible runs.

    Contract: bitwise the same on every schedule (the shuffled executor's split orders included). Against the
    interpreter's atomic form (ascending splits) it is exact. Against a hardware run of the atomic form, whose
    splits land in any order, each accumulator element moves by at most (k_split − 1) ulp of Σ|partials|:
    k_split − 1 roundings, each at most half an ulp of a partial sum, for each of the two orders. Without
    cancellation that is (k_split − 1) ulp of the result. The declared bound, 3 ulp, is that for LINEAR_OK = 4
    (qr_proj's k_split = 2 and kv_proj's 4 stay within it).

    Refused (Skip), with the reason: k_split = 1 (a single add into zeros is already order-independent), an
    accumulator that is not a fresh `zeros` seed (the partials form has no initial value), a matmul whose
    `out` is not f32, and a result that a later op updates in place (the reduce result is not an allocated
    buffer). Names: the partials keep the split-K node's name, the reduce is `<name>_reduce`.
    """

    name = "deterministic-split-k"
    origin = "seed PR #982 (dspark-model.md §6(f)): ordered split-K partials"
    contract = bounded_reassoc(3)
    fixpoint = False     # one sweep: a rewrite creates no new candidate (so --explain shows the input's skips)
    targets: Literal["hc", "all"] = "hc"

    def match(self, g: Graph):
        for node in g.topo_order():
            if node.opdef not in FORMS:
                continue
            mode = node.attrs.get("accumulate", "none")
            if mode != "atomic":
                if node.opdef is HcPreLinear or mode == "ordered":
                    yield Skip(node.name, f"accumulate = {mode}: already deterministic")
                continue
            reason = self.refusal(g, node)
            if reason is not None:
                yield Skip(node.name, reason)
                continue
            yield Site(node)

    def refusal(self, g: Graph, node: Node) -> str | None:
        """Why the atomic split-K task `node` is not rewritten, or None."""
        if node.opdef is Matmul and self.targets == "hc":
            return "atomic matmul left as is (targets = hc; targets = all rewrites it)"
        k_split = node.attrs.get("k_split", 1)
        if k_split == 1:
            return "k_split = 1: one atomic add per element into zeros is already order-independent"
        if node.opdef is Matmul and str(node.attrs.get("out")) != "f32":
            return f"out = {node.attrs.get('out')}: the atomic reference accumulates in f32"
        seed = node.operands[-1].producer
        if seed is None or seed.opdef is not Zeros:
            what = "a graph parameter" if seed is None else f"%{seed.name} ({seed.op})"
            return (f"accumulates into {what}, not a fresh zeros seed: the partials form would drop its "
                    "initial value")
        for user in g.users(node.result):
            if any(v is node.result for v in _in_place_operands(user)):
                return f"%{user.name} updates the result in place (the reduce result is not an allocated buffer)"
        return None

    def rewrite(self, g: Graph, site: Site) -> RewriteRecord | None:
        node = site.node
        if node.name not in g.nodes or node.attrs.get("accumulate") != "atomic" or self.refusal(g, node):
            return None
        partial_op, reduce_op = FORMS[node.opdef]
        seed = node.operands[-1].producer
        k_split = node.attrs["k_split"]
        partials = g.add_op(partial_op.name, node.operands[:-1], _partial_attrs(node),
                            names=g.fresh_name(node.name + ".partials"), deps=list(node.deps), near=node)
        reduce = g.add_op(reduce_op.name, [partials.result], _reduce_attrs(g, node),
                          names=g.fresh_name(node.name + "_reduce"), near=node)
        g.replace_uses(node.result, reduce.result)
        g.remove_node(node)
        g.rename(partials.result, node.name)
        seed_note = f", seed %{seed.name} removed" if erase_if_dead(g, seed) else ""
        return RewriteRecord("ordered-partials", node.name,
                             f"{k_split} disjoint partials reduced in ascending order by %{reduce.name}{seed_note}")


def _partial_attrs(node: Node) -> dict:
    attrs = dict(node.attrs)
    if node.opdef is HcPreLinear:
        attrs["accumulate"] = "ordered"
        return attrs
    for key in MATMUL_ONLY:
        attrs.pop(key, None)
    return attrs


def _reduce_attrs(g: Graph, node: Node) -> dict:
    """k_split, and one block per row tile of the split-K task (clamped when the tile does not divide)."""
    attrs: dict = {"k_split": node.attrs["k_split"]}
    if node.attrs.get("aer"):
        attrs["aer"] = True    # as its split-K task: upstream's hc_pre_linear_reduce allows early resolve (#982)
    tile = node.attrs.get("tile")
    if not tile:
        return attrs
    rows = node.result.type.shape[0]
    attrs["tile"] = [tile[0]]
    attrs["blocks"] = D.ceildiv(rows, tile[0])
    n = rows.value(g.env)
    clamp = node.attrs.get("tail") == "clamp" if n is None else n % tile[0] != 0
    if clamp:
        attrs["tail"] = "clamp"
    return attrs


def _in_place_operands(node: Node) -> list:
    return [node.operands[o] for o in node.opdef.aliases.values() if o < len(node.operands)]

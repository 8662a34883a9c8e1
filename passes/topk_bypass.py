"""topk-bypass: skip the CSA indexer's scoring and sorting when the compressed cache fits within IDX_TOPK."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dspark_ir.errors import DsparkError
from dspark_ir.graph import Graph, Node, infer_types
from dspark_ir.ops.indexer import IdxTopk, IdxTopkBounded
from dspark_ir.ops.sparse import CsaSlotsBuildValidQkPlan
from dspark_ir.ops.topk_bypass import IdxTopkSelect
from dspark_ir.types import TensorType

from .infra.base import RewriteRecord, register_pass
from .infra.checked import CheckedPass
from .infra.contracts import exact_indices
from .infra.rewriting import is_returned, replace_node

VISIBILITY = ("ratio", "seq", "score_len", "k")
TILING = ("tile", "blocks", "tail", "aer")  # the writers keep the top-k's per-token task shape

# x_out moves only by the summation order of the attention over the same keys; the bound is the CSA layer's
# token-row allowance (goldens/tolerances.py, x_out_csa row_max 0.05: |a − e| ≤ 0.05 · max(|e|, 1)).
ROW_MAX = 0.05


@dataclass(frozen=True)
class Site:
    node: Node          # the idx_topk node
    form: str           # "static" | "guarded"
    bound: int | None   # the static bound on visible (None: none is known)


@register_pass
@dataclass(frozen=True)
class TopkBypass(CheckedPass):
    """Replace the indexer's score + top-k by bounded indices 0 … visible−1 when visible ≤ IDX_TOPK.

    The rewrite (dspark-model.md §6(a)). Per token, visible = min(kv_seq_len // r, (pos+1) // r, score_len)
    compressed entries are visible. When visible ≤ k the top-k of `idx_topk` is all of them: a permutation of
    0 … visible−1 followed by −1. Scoring (`idx_score`, spmd T·2) and the 4096-wide sort buy nothing, so:
    * static   when visible ≤ k is provable for every token (`max_visible` ≤ k, or score_len ≤ k), `idx_topk` is
               replaced by the bounded writer `idx_topk_bounded`. `idx_score` is left unused. If nothing else
               reads it, dce then removes it, and with it the whole indexer query side and `weights_proj(_reduce)`.
               The inner compressor stays: its `idx_kv_cache` / `idx_kv_scale` writes are in-place layer outputs,
               which dce never removes.
    * guarded  otherwise (the default cache extent; flash: positions < ~2048 bypass, longer ones do not), the
               per-token runtime branch `idx_topk_select(%idx.topk, positions, kv_seq_len)` is inserted. It writes the
               bounded row where visible ≤ k, the boundary visible == k included, and keeps the top-k row elsewhere.
               The long-cache path stays exact. Score and top-k stay in the graph: a lowering can predicate their
               rows of bypassed tokens away, because the select never reads them.
    `mode=static` only fires when the bound is provable. `mode=guarded` (the default) also does that, and adds
    the select everywhere else. It is the default because the seed PR's measured case (CSA TP4) has no static
    bound: the cache extent allows 2048 entries against k = 512. A static-only pass would never fire on the
    default layers.

    Why the bound is the plan stage's. Both writers compute `visible` exactly as `idx_topk` does, from its own
    positions, kv_seq_len and attributes. Every written index is < visible ≤ (pos+1) // r, so it survives the
    mask `raw < (pos+1) // r` of `csa_slots_build_valid_qk_plan`. An index never points at a speculative second
    boundary that was not pooled this step. The pass requires the plan to mask with the same positions, ratio
    and seq, and to read at least k columns.

    What "exact indices" means here (the contract). The unbypassed order is score-descending. Reproducing it
    needs the scores that the bypass removes. So per token row the pass keeps:
    * the −1 padding positions, exactly: min(visible, k) valid entries first, then −1;
    * the index set of the valid prefix, exactly.
    The order inside the prefix becomes ascending. That is sound only because every consumer is
    order-insensitive up to floating-point summation order. The pass refuses any other consumer, and it refuses
    when the indices are a graph output. The plan stage masks by value and maps rows; its valid_block_mask,
    sparse_bias and qk_order depend only on where the valid entries are, so they are bitwise equal.
    cmp_sparse_indices becomes a per-row permutation. qk_pv / merge_norm then attend to the same keys in a
    different order. On the graph outputs: every cache is bitwise equal (the pass touches no cache write).
    x_out differs at most by that reassociation: an f32 last-bit change of a softmax sum that may flip one bf16
    rounding of the attention output, and the O projection's int8 requantisation can spread that flip across the
    token's row. So the declared contract is exact-indices: integer outputs identical, floats within the CSA
    token-row bound (`ROW_MAX`). The tests also check the index-level contract above at every intermediate value.
    """

    name = "topk-bypass"
    origin = "seed PR (dspark-model.md §6(a)): the CSA indexer top-k bypass"
    contract = exact_indices(rtol=ROW_MAX, atol=ROW_MAX)
    candidates = (IdxTopk,)
    mode: Literal["guarded", "static"] = "guarded"

    def apply(self, g: Graph, site: Site) -> RewriteRecord:
        if site.form == "static":
            return _bypass(g, site)
        return _guard(g, site)

    # ---- the candidate check ----------------------------------------------------------------------------
    def check(self, g: Graph, node: Node) -> Site | str:
        users = g.users(node.result)
        guards = [u for u in users if u.opdef is IdxTopkSelect]
        if guards:
            return f"already guarded by %{guards[0].name}"
        if is_returned(g, node):
            return "its indices are a graph output: the bypass writes them in ascending instead of score order"
        if not users:
            return "its indices are unused (dce removes it)"
        for user in users:
            why = _order_insensitive(node, user)
            if why is not None:
                return why
        k, bound = node.attrs["k"], static_bound(node)
        if bound is not None and bound <= k:
            why = _same_shape_writer(g, node)
            return why if why is not None else Site(node, "static", bound)
        if self.mode == "static":
            return (f"visible ≤ k = {k} is not provable ({_bound_text(node)}); "
                    f"mode=guarded keeps the top-k as a per-token fallback")
        return Site(node, "guarded", bound)


def static_bound(node: Node) -> int | None:
    """The static bound on visible: min(score_len, max_visible) (score_len when max_visible is unset)."""
    score_len, max_visible = node.attrs["score_len"], node.attrs.get("max_visible")
    return score_len if max_visible is None else min(score_len, max_visible)


def _bound_text(node: Node) -> str:
    max_visible = node.attrs.get("max_visible")
    if max_visible is None:
        return f"no max_visible, score_len = {node.attrs['score_len']}"
    return f"max_visible = {max_visible}"


def _order_insensitive(topk: Node, user: Node) -> str | None:
    """None when `user` reads the top-k list in a way that does not depend on its order (the plan stage,
    masking with the very same visibility bound); else why not."""
    if user.opdef is not CsaSlotsBuildValidQkPlan:
        return (f"%{user.name} ({user.op}) may depend on the index order; only {CsaSlotsBuildValidQkPlan.name} "
                "is known not to")
    if user.operands[0] is not topk.result or any(v is topk.result for v in user.operands[1:]):
        return f"%{user.name} reads the indices as another operand than `topk`"
    if user.operands[1] is not topk.operands[1]:
        return f"%{user.name} masks with %{user.operands[1].name}, the top-k's visibility uses %{topk.operands[1].name}"
    for attr in ("ratio", "seq"):
        if user.attrs[attr] != topk.attrs[attr]:
            return (f"%{user.name} masks with {attr} = {user.attrs[attr]}, the top-k's visibility uses "
                    f"{topk.attrs[attr]}: the bypass bound would differ from the plan's")
    if user.attrs["idx_topk"] < topk.attrs["k"]:
        return (f"%{user.name} keeps only the first {user.attrs['idx_topk']} of k = {topk.attrs['k']} entries: "
                f"truncating ascending indices keeps other entries than truncating the score order")
    return None


def _same_shape_writer(g: Graph, node: Node) -> str | None:
    """None when idx_topk_bounded on the top-k's operands has the top-k's exact type; else why not."""
    attrs = {a: node.attrs[a] for a in VISIBILITY}
    try:
        (t,) = infer_types(IdxTopkBounded, [node.operands[1].type, node.operands[2].type], attrs,
                           node.name)
    except DsparkError as e:
        return f"the bounded writer does not apply: {e.message}"
    if not _same_type(g, t, node.result.type):
        return f"the bounded writer would make {t}, the top-k is {node.result.type}"
    return None


def _same_type(g: Graph, a: TensorType, b: TensorType) -> bool:
    if a.dtype != b.dtype or len(a.shape) != len(b.shape):
        return False
    return all(x == y or (x.value(g.env) is not None and x.value(g.env) == y.value(g.env))
               for x, y in zip(a.shape, b.shape))


def _writer_attrs(node: Node) -> dict:
    return {a: node.attrs[a] for a in VISIBILITY} | {a: node.attrs[a] for a in TILING if a in node.attrs}


# ---- the two forms --------------------------------------------------------------------------------------
def _bypass(g: Graph, site: Site) -> RewriteRecord:
    node = site.node
    score = node.operands[0].producer
    pos, kv_len = node.operands[1], node.operands[2]
    writer = g.add_op(IdxTopkBounded.name, [pos, kv_len], _writer_attrs(node),
                      names=g.fresh_name(node.name + ".bounded"), deps=list(node.deps), near=node)
    replace_node(g, node, [writer.result])
    left = f"; %{score.name} is left to dce" if score is not None else ""
    return RewriteRecord("static", node.name, f"visible ≤ {site.bound} ≤ k = {node.attrs['k']} for every token: "
                                              f"%{writer.name} writes 0 … visible−1{left}")


def _guard(g: Graph, site: Site) -> RewriteRecord:
    node = site.node
    pos, kv_len = node.operands[1], node.operands[2]
    select = g.add_op(IdxTopkSelect.name, [node.result, pos, kv_len], _writer_attrs(node),
                      names=g.fresh_name(node.name + ".select"), near=node)
    g.replace_uses(node.result, select.result, skip=select)
    return RewriteRecord("guarded", node.name, f"{_bound_text(node)} > k = {node.attrs['k']}: %{select.name} "
                                               f"writes 0 … visible−1 where visible ≤ k, else %{node.name}'s row")

"""fuse-merge-rope-pack: the HCA stream merge and the inverse-RoPE group pack as one cyclic-worker task."""
from __future__ import annotations

from dataclasses import dataclass

from dspark_ir.graph import Graph, Node
from dspark_ir.ops.sparse import HcaStreamMerge, HcaStreamMergePack, HcaStreamPack

from .infra import policy
from .infra.base import RewriteRecord, register_pass
from .infra.checked import CheckedPass
from .infra.contracts import BITWISE
from .infra.options import option
from .infra.rewriting import is_returned, replace_node


@dataclass(frozen=True)
class Site:
    node: Node      # hca_stream_merge
    pack: Node      # its only reader, hca_stream_pack
    head_tile: int  # heads per item (H_TILE)


@register_pass
@dataclass(frozen=True)
class FuseMergeRopePack(CheckedPass):
    """Fuse hca_stream_merge → hca_stream_pack into one hca_stream_merge_pack task over `workers` cyclic workers.

    Before (dspark-model.md §3.3 8h-8i): the merge (spmd T·H/H_TILE) folds the compressed work-item partials into
    the raw-window stream, applies the sink and writes normalised f32 heads back to `stream_heads` (T·H·HD·4 bytes,
    16 MiB at FLASH T = 128); the pack (spmd T·H/H_TILE) reads them back, inverse-RoPEs the rope columns, rounds to
    bf16 and packs the heads group-major. Two dispatches and a full GM round trip of the f32 heads.
    After (§6(c), the seed's `hca_stream_merge_pack` with MERGE_WORKERS = 48): one task of `workers` blocks; worker
    w takes the (token, H_TILE heads) items w, w + workers, … of the T·H/H_TILE items, merges, normalises, rotates
    back, rounds and packs each one in registers. The block count no longer grows with T; the item count is a
    runtime value, so the last workers' ranges are partial (or empty when there are fewer items than workers).
    The packed output keeps its type, so both of its readers (the TP O path's exchange, or the TP1 o_proj) read it
    unchanged.

    Why it is bitwise: the fused op's reference is the merge's then the pack's, in that order (raw stream first,
    then the work-item partials in ascending order; neutral partials m = −inf, l = 0 stay neutral; the same bf16
    rounding points). Why it is safe: the fused task carries every operand of both nodes (raw attention state,
    compressed qk_pv partials, sink, and the rope_cs / rope_swap tables — dropping those producers would be a silent
    race) and the union of their explicit deps.
    It does not fire when the f32 stream heads have another reader or are returned (they must then stay in memory),
    when the two ops tile heads differently, or when the head tile does not split the heads into whole O groups
    within one token (an item must not straddle two tokens or split a group's pack).

    `heads_on_chip` (pypto-lib #1229, TP1: merge / RoPE / pack kept on chip, store sites 17 → 2): true (default)
    keeps each item's normalised f32 heads in the worker's buffers from the merge to the pack; false is the seed's
    fused kernel, which stores them to a GM scratch and reads them back for the inverse RoPE and pack (a 64 KiB
    round trip per item at flash; `stage_heads` on the fused node, a kernel-template option). It is an option of
    this pass, not a pass of its own, because it is the same rewrite carried one step further: #1229 changes only
    the body of the kernel this fusion creates (no graph edge, operand or grid differs), a separate pass could
    only match the node this one just made and flip one attribute, and without the fusion it has nothing to act
    on. Both forms are bitwise (the scratch holds the same f32 values).
    """

    name = "fuse-merge-rope-pack"
    origin = ("seed PR (dspark-model.md §6(c)): hca_stream_merge_pack, MERGE_WORKERS = 48; heads_on_chip: "
              "pypto-lib #1229")
    contract = BITWISE
    candidates = (HcaStreamMerge,)
    workers: int = option(policy.MERGE_WORKERS, min=1)
    heads_on_chip: bool = True

    def apply(self, g: Graph, site: Site) -> RewriteRecord:
        merge, pack = site.node, site.pack
        deps = {id(v): v for v in merge.deps + pack.deps if v is not merge.result}
        attrs = {"o_groups": pack.attrs["o_groups"], "tile": [site.head_tile], "blocks": self.workers,
                 "workers": self.workers}
        if merge.attrs.get("aer") and pack.attrs.get("aer"):
            attrs["aer"] = True
        if not self.heads_on_chip:
            attrs["stage_heads"] = True
        fused = g.add_op(HcaStreamMergePack.name, merge.operands + pack.operands[1:], attrs,
                         names=g.fresh_name(merge.name + "_pack"), deps=sorted(deps.values(), key=lambda v: v.name),
                         near=pack)
        replace_node(g, pack, fused.results)
        g.remove_node(merge)
        staged = "" if self.heads_on_chip else ", heads staged through GM"
        return RewriteRecord("fuse", merge.name, f"+ %{pack.name} -> %{fused.name}: {self.workers} cyclic workers "
                                                 f"over T·H/{site.head_tile} items{staged}")

    def check(self, g: Graph, merge: Node) -> Site | str:
        """The merge's pack partner and head tile, or why the pair cannot be fused."""
        heads = merge.result
        if is_returned(g, merge):
            return f"the f32 stream heads %{heads.name} are returned by the graph: they must stay in memory"
        users = g.users(heads)
        if not users:
            return f"nothing reads the f32 stream heads %{heads.name}"
        others = [u for u in users if u.opdef is not HcaStreamPack]
        if others or len(users) > 1:
            other = (others or users[1:])[0]
            return (f"the f32 stream heads %{heads.name} are also read by %{other.name} ({other.op}): "
                    "they must stay in memory")
        pack = users[0]
        if pack.operands[0] is not heads:
            return f"%{pack.name} only orders after the merge (deps); it does not read the stream heads"
        return self._head_tile(g, merge, pack)

    def _head_tile(self, g: Graph, merge: Node, pack: Node) -> Site | str:
        tiles = {n.name: _heads_per_item(n) for n in (merge, pack)}
        given = {t for t in tiles.values() if t is not None}
        if len(given) > 1:
            return (f"the merge tiles {tiles[merge.name]} heads per item and %{pack.name} {tiles[pack.name]}: "
                    "the fused item needs one head tile")
        n_heads = merge.result.type.shape[1].value(g.env)
        tile = given.pop() if given else n_heads
        if n_heads is None or tile is None:
            return "the head count is not a known integer (the item decomposition needs it)"
        if n_heads % tile:
            return f"head tile {tile} does not divide {n_heads} heads: an item would straddle two tokens"
        per_group = n_heads // pack.attrs["o_groups"]
        if tile % per_group:
            return (f"head tile {tile} does not hold whole O groups of {per_group} heads: one group's pack would be "
                    "split between two items")
        return Site(merge, pack, tile)


def _heads_per_item(node: Node) -> int | None:
    """The head tile of a merge/pack node (`tile = [tokens, heads]`), None when untiled."""
    tile = node.attrs.get("tile")
    return tile[1] if tile is not None and len(tile) == 2 else None

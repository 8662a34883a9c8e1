"""kv-score-token-groups: each kv_score_proj block runs several token tiles with one weight tile (pypto-lib #1155)."""
from __future__ import annotations

from dataclasses import dataclass

from dspark_ir import dims as D
from dspark_ir.graph import Graph, Node
from dspark_ir.ops.attention import QkPv
from dspark_ir.ops.compressor import CmpKvScoreProj

from .infra import policy
from .infra.base import RewriteRecord, register_pass
from .infra.checked import CheckedPass
from .infra.contracts import BITWISE
from .infra.options import option
from .infra.rewriting import set_attrs


@dataclass(frozen=True)
class Site:
    node: Node
    blocks: D.Dim       # the new grid: ceil(ceil(T / m) / token_tiles) token groups x output tiles
    groups: int         # token groups at the graph's T
    tiles: int          # token tiles at the graph's T


@register_pass
@dataclass(frozen=True)
class KvScoreTokenGroups(CheckedPass):
    """Give every compressor `cmp_kv_score_proj` a grid of (token group, output tile) blocks, `token_tiles` token
    tiles per group, instead of one block per (token tile, output tile).

    Before (the seed): spmd ceil(T / MM_B_TILE) x OUT / OUT_TILE; each block streams its [OUT_TILE, D] slices of
    wkv and wgate from GM for its 16 tokens, so every weight tile is fetched once per token tile (8 times at
    flash TP4, 32 at TP1). After (pypto-lib #1155, KV_SCORE_T_GROUP = 2): spmd ceil(ceil(T / m) / token_tiles) x
    OUT / OUT_TILE; a block runs its token tiles in turn with the same output column range, so the weight tiles
    are fetched once per group. The accumulator tile [m, OUT_TILE] is unchanged (the cube tile stays
    row-compact), a last group with fewer token tiles simply runs fewer (ragged T is fine: each token tile keeps
    its own clamp). Applies to the HCA compressor and both CSA compressors (`cmp.`, `icmp.`).

    Each output element is still one K-ordered accumulation of the same products: the grid changes which block
    computes a tile, never its value. Contract: bitwise. Our pypto template already computes all rows of an
    output tile in one matmul, so the kernel source is the same; what changes is the grid the lowering gives the
    task (half the blocks at the default), which the schedule model prices. Left alone: a task whose T has only
    one token tile (no weight tile is fetched twice), an unbound T, a task already grouped.
    """

    name = "kv-score-token-groups"
    origin = "pypto-lib #1155 (decode_compressor_ratio128/ratio4 KV_SCORE_T_GROUP = 2)"
    contract = BITWISE
    preserves = frozenset({"canonical", "no-dead-nodes"})
    candidates = (CmpKvScoreProj,)
    not_candidates = {QkPv: "SWA attends over the raw window only: the layer has no compressor"}
    token_tiles: int = option(policy.KV_SCORE_TOKEN_TILES, min=1)

    def apply(self, g: Graph, site: Site) -> RewriteRecord:
        node = site.node
        before = node.attrs["blocks"].value(g.env)
        set_attrs(g, node, token_tiles=self.token_tiles, blocks=site.blocks)
        return RewriteRecord("group", node.name,
                             f"{before} -> {site.blocks.value(g.env)} blocks ({site.tiles} token tiles in "
                             f"{site.groups} groups of {self.token_tiles})")

    def check(self, g: Graph, node: Node) -> Site | str:
        if self.token_tiles < 2:
            return f"token_tiles = {self.token_tiles}: nothing to group"
        if node.attrs.get("token_tiles", 1) > 1:
            return f"already {node.attrs['token_tiles']} token tiles per block"
        tile = node.attrs.get("tile")
        if tile is None or len(tile) != 3:
            return "no [m, n, k] tile (the grid is not one block per token tile and output tile)"
        m, n = tile[0], tile[1]
        tokens = node.operands[0].type.shape[0]
        out = node.operands[1].type.shape[0].value(g.env)
        t = tokens.value(g.env)
        if t is None or out is None:
            return f"the token count {tokens} or the output width is not bound"
        if out % n:
            return f"the output tile {n} does not divide the output width {out}"
        tiles = -(-t // m)
        if tiles < 2:
            return f"T = {t} is one token tile of {m}: no weight tile is fetched twice"
        blocks = D.mul(D.ceildiv(D.ceildiv(tokens, m), self.token_tiles), out // n)
        return Site(node, blocks, -(-tiles // self.token_tiles), tiles)

"""split-writeback-bias: split the fused SWA cache insert + valid bias task in two (dspark-model §6(e))."""
from __future__ import annotations

from dataclasses import dataclass

from dspark_ir import dims as D
from dspark_ir.graph import Graph, Node, Value
from dspark_ir.ops.attention import SwaCacheInsertValidBias, SwaCacheWriteback, SwaValidBias
from dspark_ir.ops.sparse import KvCacheWriteback

from .infra import policy
from .infra.base import RewriteRecord, register_pass
from .infra.checked import CheckedPass
from .infra.contracts import BITWISE
from .infra.options import option
from .infra.rewriting import replace_node, set_deps


@dataclass(frozen=True)
class Site:
    node: Node
    rows: D.Dim         # the kv rows (T, or the TP group's tp·T at TP > 1), as written in the graph
    tile: int           # writeback row tile
    bias_tile: int      # bias row tile (the fused task's tile)
    bias_rows: D.Dim    # the query tokens' rows (lens: T)


@register_pass
@dataclass(frozen=True)
class SplitWritebackBias(CheckedPass):
    """Split the fused SWA cache insert + valid bias task into concurrent writeback and bias tasks.

    `swa_cache_insert_valid_bias` was one `at` task on one core group: a serial scatter of T kv rows into
    the cache, then T/8 bias blocks. It was fused when T was 8; at T = 128-512 the serial scatter
    dominates, and the gather (kv_cache) and qk_pv (bias) both wait for all of it. The two halves share
    no output and read independent inputs, so they become two tasks with no edge between them:
    * `swa_cache_writeback` = spmd ceil(T/tile_rows), each block writing rows [t0, min(t0 + tile, T)):
      a ceiling division with the last block clamped (`tail = clamp`), so a T that is not a multiple of
      the tile still commits every slot (floor division would drop the tail rows);
    * `swa_valid_bias` = spmd T//bias_tile with the fused task's tile: floor division, valid only under
      the batch contract T % bias_tile == 0, so the pass refuses a T that breaks it.
    The bias task can now start as soon as `lens` exists. The gather keeps its data edge on the
    writeback's kv_cache version (the alias `kv_cache` → result keeps the two views of the cache ordered);
    qk_pv reads the new bias. Explicit deps of the fused task go to both halves; a dep on the fused task
    becomes a dep on both.

    `tile_rows = 0` takes the writeback tile from the graph's config (`policy.writeback_tile_rows`: 32 at
    flash, 8 at tiny); the tile never exceeds the kv rows. HCA and CSA already write the cache with a separate
    `kv_cache_writeback` and have no fused bias task: the pass is a no-op there (the reason is shown by --explain).
    Contract: bitwise. The two references compose to the fused one exactly.
    """

    name = "split-writeback-bias"
    origin = "seed PR (dspark-model.md §6(e)): the SWA writeback / valid-bias fission"
    contract = BITWISE
    candidates = (SwaCacheInsertValidBias,)
    not_candidates = dict.fromkeys((KvCacheWriteback, SwaCacheWriteback),
                                   "already a separate cache writeback task (no fused valid bias to split)")
    tile_rows: int = option(0, min=0)

    def apply(self, g: Graph, site: Site) -> RewriteRecord:
        node = site.node
        kv, cache, slots, lens = node.operands
        core = {"core": node.attrs["core"]} if "core" in node.attrs else {}
        rows = site.rows.value(g.env)
        tail = {"tail": "clamp"} if rows % site.tile else {}
        prefix = f"{node.block}." if node.block else ""
        writeback = g.add_op(SwaCacheWriteback.name, [kv, cache, slots],
                             {"tile": [site.tile], "blocks": D.ceildiv(site.rows, site.tile), **tail, **core},
                             names=g.fresh_name(prefix + "swa_cache_writeback"), deps=node.deps, near=node)
        bias = g.add_op(SwaValidBias.name, [lens],
                        {"window": node.attrs["window"], "tile": [site.bias_tile],
                         "blocks": D.floordiv(site.bias_rows, site.bias_tile), **core},
                        names=g.fresh_name(prefix + "swa_valid_bias"), deps=node.deps, near=node)
        new = [writeback.result, bias.result]
        _widen_deps_on(g, node, new)
        replace_node(g, node, new)
        return RewriteRecord("split", node.name,
                             f"%{writeback.name} ({writeback.attrs['blocks']} blocks of {site.tile} rows"
                             f"{', last clamped' if tail else ''}) || %{bias.name} ({bias.attrs['blocks']} blocks)")

    def check(self, g: Graph, node: Node) -> Site | str:
        rows_dim = node.operands[0].type.shape[0]
        rows = rows_dim.value(g.env)
        bias_dim = node.operands[3].type.shape[0]
        bias_rows = bias_dim.value(g.env)
        if rows is None or bias_rows is None:
            return (f"the kv rows {rows_dim} or the lens rows {bias_dim} are not bound (cannot check the T % bias "
                    "tile contract)")
        tile = node.attrs.get("tile")
        if tile is None or len(tile) != 1:
            return "the fused task has no one-entry bias tile"
        if bias_rows % tile[0]:
            return (f"T = {bias_rows} is not a multiple of the bias tile {tile[0]}: the bias builder's floor "
                    f"division would drop the last {bias_rows % tile[0]} rows (the T % {tile[0]} == 0 contract)")
        wanted = self.tile_rows or policy.writeback_tile_rows(g)
        if wanted < 1:
            return f"tile_rows = {self.tile_rows} is not a row count"
        return Site(node, rows_dim, min(wanted, rows), tile[0], bias_dim)


def _widen_deps_on(g: Graph, node: Node, new: list[Value]) -> None:
    """A dep on either result of the fused task becomes a dep on both halves (it waited for all of it)."""
    old = set(map(id, node.results))
    for user in {u.name: u for v in node.results for u in g.users(v)}.values():
        if not any(id(d) in old for d in user.deps):
            continue
        kept = [d for d in user.deps if id(d) not in old]
        set_deps(g, user, kept + [v for v in new if v not in kept])

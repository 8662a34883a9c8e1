"""fuse-mix-x-rms-norm: hc_pre's mix_x and the attention input norm as one task per token tile."""
from __future__ import annotations

from dataclasses import dataclass

from dspark_ir.graph import Graph, Node
from dspark_ir.ops.core import RmsNorm
from dspark_ir.ops.hc import MixX, MixXRmsNorm

from .infra.base import RewriteRecord, register_pass
from .infra.checked import CheckedPass
from .infra.contracts import BITWISE
from .infra.rewriting import is_returned, replace_node

# attributes of the norm task that carry over to the fused task (its grid and row tiling, its hints)
_NORM_ATTRS = ("tile", "blocks", "tail", "aer")


@dataclass(frozen=True)
class Site:
    node: Node      # mix_x
    norm: Node      # its only reader, rmsnorm


@register_pass
@dataclass(frozen=True)
class FuseMixXRmsNorm(CheckedPass):
    """Fuse mix_x → rmsnorm (the attention input norm) into one mix_x_rms_norm task on the norm's token tiles.

    Before (the seeds' hc_pre, dspark-model §3.1 1f and 2): mix_x (spmd token_tiles · D / D_SPMD) weights the four
    hyper-connection streams, rounds x_mixed to bf16 and writes it to GM (T · D · 2 bytes); rms_norm (spmd
    token_tiles) reads it back, norms and rounds again. Two dispatches, a hop and a GM round trip. After (the
    captured code of the HCA TP4 swimlane, pypto-lib fa5bf7e: hc_pre.py `hc_mix_norm`, task `mix_x_rms_norm`,
    spmd t_pad // T_TILE): one task per token tile mixes the tile's rows and norms them on chip.

    Why it is bitwise: the fused op's reference is mix_x's then rmsnorm's (x_mixed rounded to bf16 once, then the
    norm's f32 math and its rounding), and each token row is computed by one block in both forms. It takes the
    norm's grid, row tile, tail clamp and early-resolve hint, and the union of both nodes' explicit deps.
    It does not fire when x_mixed has another reader or is returned (it must then stay in memory: the MoE layer's
    ffn norm is its own op, moe_ffn_norm, not this pair), or when its only reader is not an rmsnorm.
    """

    name = "fuse-mix-x-rms-norm"
    origin = "pypto-lib fa5bf7e (hc_pre.py hc_mix_norm: the swimlane's mix_x_rms_norm task); not a seed PR"
    contract = BITWISE
    preserves = frozenset({"canonical", "no-dead-nodes"})
    candidates = (MixX,)

    def apply(self, g: Graph, site: Site) -> RewriteRecord:
        mix, norm = site.node, site.norm
        deps = {id(v): v for v in mix.deps + norm.deps if v is not mix.result}
        attrs = {"eps": norm.attrs["eps"], **{k: norm.attrs[k] for k in _NORM_ATTRS if k in norm.attrs}}
        fused = g.add_op(MixXRmsNorm.name, [*mix.operands, norm.operands[1]], attrs,
                         names=g.fresh_name(norm.name.rsplit(".", 1)[0] + ".mix_x_rms_norm"),
                         deps=sorted(deps.values(), key=lambda v: v.name), near=norm)
        replace_node(g, norm, fused.results)
        g.remove_node(mix)
        return RewriteRecord("fuse", mix.name, f"+ %{norm.name} -> %{fused.name}: "
                                               f"{attrs.get('blocks', 1)} blocks, x_mixed stays on chip")

    def check(self, g: Graph, mix: Node) -> Site | str:
        """The mix_x's norm partner, or why the pair cannot be fused."""
        mixed = mix.result
        if is_returned(g, mix):
            return f"x_mixed %{mixed.name} is returned by the graph: it must stay in memory"
        users = g.users(mixed)
        if not users:
            return f"nothing reads x_mixed %{mixed.name}"
        if len(users) > 1:
            return (f"x_mixed %{mixed.name} is read by {len(users)} tasks "
                    f"({', '.join('%' + u.name for u in users)}): it must stay in memory")
        if users[0].opdef is not RmsNorm:
            return f"x_mixed %{mixed.name} is read by %{users[0].name} ({users[0].op}), not by an rmsnorm"
        return Site(mix, users[0])     # an rmsnorm's weight is rank 1: x_mixed [T, D] can only be its rows

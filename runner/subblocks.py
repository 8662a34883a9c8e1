"""Sub-block checks: a stage of the graph against the golden's same stage on the graph's own stage inputs.

A layer-level tolerance cannot see every fault: Sinkhorn at 19 instead of 20 iterations moves comb by ~1e-3,
and x_out by less than a rare midpoint flip does (goldens/tolerances.py). Here each checked stage's result is
compared with the golden stage function applied to the operands the graph gave that stage (from an executor
run that kept every value, e.g. ``dspark_ir.interp.run(g, inputs, keep=True)``), so upstream differences do
not enter and the bound is the stage's own (``goldens.tolerances.STAGE_TOLERANCES``: the bitwise stages at f32
ulps, a bf16 stage at one ulp on rare points). Stages are found by op class, so every layer (and every rank)
that has the op is checked:

  comb_sinkhorn  → goldens.hc.hc_gates(...).comb at cfg.sinkhorn_iters (not the node's own count)
  split_pre_post → hc_gates pre, post        mix_x → hc_collapse        hc_post → goldens.hc.hc_post
  mix_x_rms_norm → rms_norm(hc_collapse)
  rmsnorm        → goldens.norm.rms_norm (eps from the config)
  the O path     → goldens.o_proj.o_proj / o_proj_tp from the packed heads (the operand of the first O op)
                   to attn_out (hc_post's first operand), at every TP: a one-row fault inside it shows here
"""
from __future__ import annotations

from typing import Any, Callable

import numpy as np

from dspark_ir import layers
from dspark_ir.graph import Graph
from dspark_ir.ops.collective import OGroupA2A
from dspark_ir.ops.core import RmsNorm
from dspark_ir.ops.hc import CombSinkhorn, HcPost, MixX, MixXRmsNorm, SplitPrePost
from dspark_ir.ops.oproj import OProjA
from goldens import hc as ghc
from goldens.norm import rms_norm
from goldens.o_proj import o_proj, o_proj_tp
from goldens.tolerances import Comparison, compare_stage


def _mix(mixes, inv_rms):
    return np.asarray(mixes, np.float32) * np.asarray(inv_rms, np.float32)[:, None]


# op class → (stage name per result, golden(cfg, *operands) → tuple of expected results)
STAGES: dict[type, tuple[tuple[str, ...], Callable[..., tuple]]] = {
    CombSinkhorn: (("hc.comb",), lambda cfg, m, r, s, b: (ghc.hc_gates(cfg, _mix(m, r), s, b)[2],)),
    SplitPrePost: (("hc.pre", "hc.post"), lambda cfg, m, r, s, b: ghc.hc_gates(cfg, _mix(m, r), s, b)[:2]),
    MixX: (("hc.x_mixed",), lambda cfg, x, pre: (ghc.hc_collapse(x, pre),)),
    MixXRmsNorm: (("hc.x_mixed+rmsnorm",), lambda cfg, x, pre, w: (rms_norm(ghc.hc_collapse(x, pre), w, cfg.rms_eps),)),
    HcPost: (("hc_post",), lambda cfg, a, x, post, comb: (ghc.hc_post(a, x, post, comb),)),
    RmsNorm: (("rmsnorm",), lambda cfg, x, w: (rms_norm(x, w, cfg.rms_eps),)),
}


def subblock_checks(g: Graph, values: Any) -> list[Comparison]:
    """One Comparison per checked stage node (ranks concatenated). `values`: every value of a run of `g`
    (name → array, or one dict per rank)."""
    cfg = layers.graph_config(g)
    envs = values if isinstance(values, list) else [values]
    out = []
    for node in g.nodes.values():
        stage = STAGES.get(node.opdef)
        if stage is None:
            continue
        names, golden = stage
        expected = [golden(cfg, *[env[v.name] for v in node.operands]) for env in envs]
        for i, name in enumerate(names):
            actual = np.concatenate([np.asarray(env[node.results[i].name]) for env in envs])
            want = np.concatenate([np.asarray(e[i]) for e in expected])
            out.append(compare_stage(f"{name} ({node.name})", actual, want, node.results[i].type.dtype.value))
    return out + _o_path(g, cfg, envs)


def _o_path(g: Graph, cfg, envs: list) -> list[Comparison]:
    """The O projection from the packed heads to attn_out (attention layers: those with an O path)."""
    nodes = list(g.nodes.values())
    first = next((n for n in nodes if n.opdef is OGroupA2A), None) or next((n for n in nodes if n.opdef is OProjA),
                                                                            None)
    post = next((n for n in nodes if n.opdef is HcPost), None)
    if first is None or post is None:
        return []
    packed = [env[first.operands[0].name] for env in envs]
    if len(envs) == 1:
        want = [o_proj(cfg, packed[0], envs[0]["wo_a"], envs[0]["wo_b"], envs[0]["wo_b_scale"])]
    else:
        want = o_proj_tp(cfg, packed, [e["wo_a"] for e in envs], [e["wo_b"] for e in envs], envs[0]["wo_b_scale"])
    actual = np.concatenate([np.asarray(env[post.operands[0].name]) for env in envs])
    return [compare_stage("o path (packed → attn_out)", actual, np.concatenate(want), "bf16")]

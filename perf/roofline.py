"""Roofline work of a lowered task: bytes it moves through GM and the arithmetic it does.

`task_work(task)` gives a `Work`: GM bytes read and written, cube FLOPs (16-bit or int8 rate), vector
element ops, and bytes sent to other chips (collectives). `bound_seconds(work, hw)` is the chip-level
roofline: max(bytes / HBM bandwidth, cube FLOPs / cube peak, vector ops / vector peak, remote / link).
`blocked_seconds(work, kind, blocks, hw)` is the same bound for a task that can only use
`min(blocks, cores)` cores (one core cannot pull the whole HBM bandwidth): the estimate used for kernels
that have no pypto template yet (source "roofline").

Counting rules (documented approximations): one `Rule` per op kind in `ROOFLINE`, keyed by the op class
(dspark_ir.ops), where the default is wrong; `DEFAULTS` declares an op kind the defaults count right. Every op
kind that lowers to a kernel task has an entry (checked by name in tests/perf/test_roofline.py): a new or
renamed op fails there, not quietly here.
* default bytes: every argument's view once (`inout` twice: read and write). Ops that index into a large
  cache or table count the rows they touch instead (a gather reads its output's worth of rows, a cache
  write-back writes its input's rows): `Rule.touched`.
* cube FLOPs: 2·M·K·N per product, from the operand shapes (`Rule.cube`); int8 products at the int8 rate.
* vector ops: the elements of the largest argument × a per-op factor (`Rule.vector_factor`, default 2:
  load-convert-compute), plus the softmax of attention scores for the mix attention ops (`Rule.softmax`).
* grouped operands: a task that works on one group of a grouped operand (the O path's `o_proj_a` reads
  `heads[group]` and `wo_a[group]`, `o_proj_b` the group's K columns of `wo_b`) counts that slice, not the whole
  view its argument names (`Rule.touched`), and declares which slice it is (`Rule.slice_key`: the group), so
  that the floor below counts each group's slice once.
Collectives (`collective=True`) also count the bytes that leave the chip.

Beside the decomposition's bound, `floor(tg)` is what a rank must move whatever the decomposition: every byte of
the layer's inputs (weights, activations, tables) and caches it touches read once, its outputs and cache rows
written once (`Floor.low`), plus the bytes its collectives exchange with the other ranks (`Floor.high`).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from dspark_ir.hardware import HARDWARE, ITEMSIZE, Hardware
from dspark_ir.ops import OpDef, get_op
from dspark_ir.ops.attention import (
    MergeNorm,
    QkPv,
    SwaCacheInsertValidBias,
    SwaCacheWriteback,
    SwaGatherKv,
    SwaValidBias,
)
from dspark_ir.ops.collective import (
    CpAllGather,
    CpOwnRows,
    CpRankRows,
    CpTypedAllGather,
    CpTypedReadback,
    HcaStreamMergePackPublish,
    OGroupA2A,
    TpODequantReduceScatter,
    TpOReduceScatter,
    WindowCopyOut,
)
from dspark_ir.ops.compressor import (
    CmpKvHadamard,
    CmpKvScoreProj,
    CmpRmsnormRope,
    CmpRmsnormRopeCacheWrite,
    CmpScatterSoftmaxPool,
    IdxKvCacheWrite,
    PrefillCmpFinishWrite,
    PrefillCmpPool,
    RopeGatherRows,
    RopeInterleave,
    RopeSwapIdx,
)
from dspark_ir.ops.core import Add, Cast, Concat, Matmul, Mul, Reshape, RmsNorm, Rope, Zeros
from dspark_ir.ops.hc import (
    CombSinkhorn,
    HcPost,
    HcPreLinear,
    HcPreLinearReduce,
    HcPreRms,
    MixX,
    MixXRmsNorm,
    SplitPrePost,
)
from dspark_ir.ops.indexer import (
    IdxHadamardMatmul,
    IdxQQuant,
    IdxQrDequant,
    IdxQrRope,
    IdxScore,
    IdxTopk,
    IdxTopkBounded,
    IdxWeightsProj,
    IdxWeightsReduce,
)
from dspark_ir.ops.moe import (
    Combine,
    DispatchGather,
    DispatchMeta,
    DispatchPush,
    ExpertRouted,
    ExpertShared,
    FfnNorm,
    Gate,
    RouteHash,
    RouteSort,
    SharedRouted,
    XNormQuant,
)
from dspark_ir.ops.oproj import OProjA, OProjB, OProjBDequant, QuantRows
from dspark_ir.ops.qkv import KvRmsNormRope, QprojDequantRmsNopeRope, QrRmsNormQuant, RopeTables
from dspark_ir.ops.signal import Put, SignalBarrier, SignalNotify, SignalWait, Window
from dspark_ir.ops.sparse import (
    CsaMergeNorm,
    CsaQkPv,
    CsaSlotsBuildValidQkPlan,
    HcaCmpQkPv,
    HcaCmpWorkGather,
    HcaRawAttn,
    HcaRawAttnDirect,
    HcaRawAttnRequest,
    HcaRawTranspose,
    HcaRequestKvGather,
    HcaStreamMerge,
    HcaStreamMergePack,
    HcaStreamPack,
    KvCacheWriteback,
    KvTouch,
    OLocalBridge,
)
from dspark_ir.ops.splitk import MatmulPartials, SplitReduce
from dspark_ir.ops.topk_bypass import IdxTopkSelect
from dspark_ir.ops.window_release import WindowRelease
from dspark_ir.ops.wire import CpWirePack, CpWireUnpack
from lowering.codegen import op_definition
from lowering.taskgraph import Arg, Task


@dataclass
class Work:
    read: float = 0.0            # GM bytes read
    written: float = 0.0         # GM bytes written
    cube_flops: float = 0.0      # 16-bit (or fp32) cube FLOPs
    cube_int8: float = 0.0       # int8 cube ops
    vector_ops: float = 0.0      # fp32-width element ops
    remote: float = 0.0          # bytes sent to other chips
    notes: list[str] = field(default_factory=list)

    @property
    def bytes(self) -> float:
        return self.read + self.written

    def to_json(self) -> dict:
        return {"read": self.read, "written": self.written, "cube_flops": self.cube_flops,
                "cube_int8": self.cube_int8, "vector_ops": self.vector_ops, "remote": self.remote}

    def __add__(self, other: "Work") -> "Work":
        return Work(self.read + other.read, self.written + other.written, self.cube_flops + other.cube_flops,
                    self.cube_int8 + other.cube_int8, self.vector_ops + other.vector_ops,
                    self.remote + other.remote)


# ---- helpers ------------------------------------------------------------------------------------------
def nbytes(a: Arg) -> int:
    return math.prod(a.shape) * ITEMSIZE.get(a.dtype, 4)


def numel(a: Arg) -> int:
    return math.prod(a.shape)


def arg(task: Task, param: str) -> Arg | None:
    for a in task.args:
        if a.param == param or a.param == f"{param}_in":
            return a
    return None


def _size(task: Task, param: str) -> int:
    a = arg(task, param)
    return nbytes(a) if a is not None else 0


# ---- sparse-access overrides: param -> bytes it really moves ---------------------------------------
def _gather_rows(big: str, out: str):
    def rule(t: Task) -> dict[str, float]:
        return {big: float(_size(t, out) * ITEMSIZE.get(arg(t, big).dtype, 2) / ITEMSIZE.get(arg(t, out).dtype, 2))
                if arg(t, big) and arg(t, out) else 0.0}
    return rule


def _write_rows(cache: str, src: str, rows_of: Callable[[Task], int] | None = None):
    """An in-place cache update: it reads nothing of the cache and writes the source's rows."""
    def rule(t: Task) -> dict[str, float]:
        c, s = arg(t, cache), arg(t, src)
        if c is None or s is None:
            return {}
        row = math.prod(c.shape[1:]) * ITEMSIZE.get(c.dtype, 2)
        rows = rows_of(t) if rows_of else s.shape[0]
        return {cache: float(rows * row)}
    return rule


def _boundaries(t: Task) -> int:
    """Rows a prefill compressor finish stores: one per ratio tokens of the chunk (at least one)."""
    pooled = arg(t, "pooled")
    return max(1, -(-pooled.shape[0] // int(t.attrs.get("ratio", 1)))) if pooled is not None else 1


def _rope_rows(t: Task) -> float:
    cos = arg(t, "rope_cos")
    return float(_boundaries(t) * cos.shape[-1] * ITEMSIZE.get(cos.dtype, 2)) if cos is not None else 0.0


def _requests(t: Task) -> int:
    b = arg(t, "kv_seq_len") or arg(t, "cmp_block_table") or arg(t, "state_block_table")
    return b.shape[0] if b is not None else 1


def _score_rows(t: Task) -> dict[str, float]:
    """idx_score reads, per request, the visible compressed rows (≤ max_visible) of the INT8 cache + scales, and
    writes per token only those entries (the rest of the row is open: upstream's "no score_init")."""
    visible = min(int(t.attrs.get("max_visible") or t.attrs.get("score_len") or 0), int(t.attrs.get("score_len") or 0))
    cache, scale, score = arg(t, "idx_kv_cache"), arg(t, "idx_kv_scale"), arg(t, "out")
    reqs = _requests(t)
    out = {}
    if score is not None:
        out["out"] = float(score.shape[0] * visible * ITEMSIZE[score.dtype])
    if cache is not None:
        out["idx_kv_cache"] = float(reqs * visible * math.prod(cache.shape[1:]) * ITEMSIZE[cache.dtype])
    if scale is not None:
        out["idx_kv_scale"] = float(reqs * visible * ITEMSIZE[scale.dtype])
    return out


def _csa_qk_rows(t: Task) -> dict[str, float]:
    """csa_qk_pv reads WIN window rows per token from kv_cache and its top-k compressed rows from cmp_kv; with
    `live_blocks` only the top-k rows those blocks cover (as its template gathers)."""
    out = {}
    kv, win, cmp, idx = arg(t, "kv_cache"), arg(t, "swa_indices"), arg(t, "cmp_kv"), arg(t, "cmp_sparse_indices")
    if kv is not None and win is not None:
        out["kv_cache"] = float(numel(win) * kv.shape[-1] * ITEMSIZE[kv.dtype])
    if cmp is not None and idx is not None:
        covered = min(idx.shape[1], max(0, _csa_keys(t) - (win.shape[1] if win is not None else 0)))
        out["cmp_kv"] = float(idx.shape[0] * covered * cmp.shape[-1] * ITEMSIZE[cmp.dtype])
    return out


def _csa_keys(t: Task) -> int:
    """Keys per token csa_qk_pv computes: window + top-k, or its first live_blocks k_tile blocks."""
    width = _rows_dim("sparse_bias")(t)
    live = t.attrs.get("live_blocks")
    return width if live is None else min(width, int(live) * int(t.attrs["k_tile"]))


def _group_slices(*params: str):
    """A grouped operand [groups, ...]: the task reads its `group`'s slice, 1/groups of the view."""
    def rule(t: Task) -> dict[str, float]:
        return {p: float(nbytes(a)) / a.shape[0] for p in params if (a := arg(t, p)) is not None and a.shape}
    return rule


def _wo_b_columns(t: Task) -> dict[str, float]:
    """o_proj_b reads its group's K columns of wo_b [hidden, groups·K]: K = the width of its x."""
    w, x = arg(t, "wo_b"), arg(t, "x")
    if w is None or x is None:
        return {}
    return {"wo_b": float(nbytes(w)) * x.shape[-1] / w.shape[-1]}


def _group(t: Task):
    return t.attrs.get("group")


def _state_rows(t: Task) -> dict[str, float]:
    """The compressor ring state: the step's rows are read and written (kv + score rows, f32)."""
    rows = _size(t, "kv") + _size(t, "score")
    return {"state": float(2 * rows)}


def _routed_rows(t: Task) -> dict[str, float]:
    """MoE windows are sized for the worst case (EP·MOE_TOKENS rows per expert); a rank handles its share."""
    out = {}
    y = arg(t, "routed_y")
    for a in t.args:
        if a.param.startswith("recv_") and y is not None and len(a.shape) >= 2:
            row = math.prod(a.shape[2:]) * ITEMSIZE[a.dtype]
            out[a.param] = float(y.shape[0] * row)
    return out


# ---- cube work: (flops, int8?) -------------------------------------------------------------------------
def _mm(m: int, k: int, n: int) -> float:
    return 2.0 * m * k * n


def _matmul(t: Task) -> tuple[float, bool]:
    a, b = arg(t, "a"), arg(t, "b")
    m, k = a.shape[-2], a.shape[-1]
    n = b.shape[-2] if t.attrs.get("trans_b") else b.shape[-1]
    lead = math.prod(a.shape[:-2]) if len(a.shape) > 2 else 1
    return lead * _mm(m, k, n), a.dtype == "i8"


def _attention(q_param: str, keys: Callable[[Task], int]):
    """QK^T and PV of every query head against `keys(t)` rows per token: 4·T·H·keys·D."""
    def rule(t: Task) -> tuple[float, bool]:
        q = arg(t, q_param)
        tokens, heads, dim = q.shape[0], math.prod(q.shape[1:-1]), q.shape[-1]
        return 4.0 * tokens * heads * keys(t) * dim, False
    return rule


def _rows_dim(param: str, axis: int = 1):
    return lambda t: arg(t, param).shape[axis] if arg(t, param) is not None else 0


def _last_out(t: Task) -> Arg:
    outs = [a for a in t.args if a.direction == "out"]
    return outs[0] if outs else t.args[-1]


# vector element ops per attention score of the softmax a mix attention task runs beside its products
_SOFTMAX_OPS = 6  # max, sub, exp, sum, scale, cast per attention score


# ---- the rules, keyed by op class ------------------------------------------------------------------------
@dataclass(frozen=True)
class Rule:
    """How one op kind's work is counted where the defaults are wrong (module docstring)."""

    touched: Callable[[Task], dict[str, float]] | None = None   # param -> the bytes it really moves
    cube: Callable[[Task], tuple[float, bool]] | None = None    # (cube FLOPs, int8?)
    vector_factor: int = 2      # vector element ops per element of the largest argument
    softmax: bool = False       # a mix task also runs the softmax of its attention scores (vector side)
    slice_key: Callable[[Task], object] | None = None   # tasks with different keys touch disjoint slices (floor)


DEFAULTS = Rule()    # the default counting is right for the op (or it has no rule yet: said where it is used)


def _factor(n: int) -> Rule:
    return Rule(vector_factor=n)


# Every op kind that lowers to a kernel task has an entry (tests/perf/test_roofline.py checks it by name).
ROOFLINE: dict[type[OpDef], Rule] = {
    # generic ops
    Matmul: Rule(cube=_matmul),
    RmsNorm: _factor(6),
    **dict.fromkeys((Add, Mul, Cast, Zeros, Rope, Reshape, Concat), DEFAULTS),   # reshape/concat: copy tasks
    # qkv
    RopeTables: Rule(touched=lambda t: {"rope_cos": float(_size(t, "cos_il")),
                                        "rope_sin": float(_size(t, "sin_signed"))}),
    QrRmsNormQuant: _factor(8),
    QprojDequantRmsNopeRope: _factor(10),
    KvRmsNormRope: _factor(10),
    # attention
    SwaGatherKv: Rule(touched=_gather_rows("kv_cache", "out")),
    SwaCacheWriteback: Rule(touched=_write_rows("kv_cache", "kv")),
    SwaCacheInsertValidBias: Rule(touched=_write_rows("kv_cache", "kv")),
    QkPv: Rule(cube=_attention("q", _rows_dim("kv_rows")), softmax=True),
    MergeNorm: _factor(10),
    SwaValidBias: DEFAULTS,
    # compressor
    RopeGatherRows: Rule(touched=lambda t: {"rope_cos": float(_size(t, "cos")), "rope_sin": float(_size(t, "sin"))}),
    CmpKvScoreProj: Rule(cube=lambda t: (2 * _mm(arg(t, "x").shape[0], arg(t, "x").shape[1], arg(t, "wkv").shape[0]),
                                         False)),
    CmpScatterSoftmaxPool: Rule(touched=_state_rows),
    CmpRmsnormRopeCacheWrite: Rule(touched=_write_rows("cmp_kv", "pooled")),
    PrefillCmpPool: Rule(touched=_state_rows),
    # every token's pooled row is read; only the chunk's boundaries (1 in r) are written, with their RoPE rows
    PrefillCmpFinishWrite: Rule(touched=lambda t: {**_write_rows("cmp_kv", "pooled", _boundaries)(t),
                                                   "rope_cos": _rope_rows(t), "rope_sin": _rope_rows(t)}),
    CmpKvHadamard: Rule(cube=lambda t: (_mm(arg(t, "y").shape[0], arg(t, "y").shape[1], arg(t, "hadamard").shape[1]),
                                        False)),
    IdxKvCacheWrite: Rule(touched=lambda t: {**_write_rows("idx_kv_cache", "k")(t),
                                             "idx_kv_scale": float(arg(t, "k").shape[0] * 4) if arg(t, "k") else 0.0}),
    **dict.fromkeys((CmpRmsnormRope, RopeInterleave, RopeSwapIdx), DEFAULTS),
    # indexer
    IdxScore: Rule(touched=_score_rows,
                   cube=lambda t: (2.0 * arg(t, "q").shape[0] * arg(t, "q").shape[1] * arg(t, "q").shape[2]
                                   * int(t.attrs.get("max_visible") or t.attrs.get("score_len") or 0), True)),
    IdxHadamardMatmul: Rule(cube=lambda t: (_mm(numel(arg(t, "q")) // arg(t, "q").shape[-1], arg(t, "q").shape[-1],
                                                arg(t, "hadamard").shape[-1]), False)),
    IdxWeightsProj: Rule(cube=lambda t: (_mm(arg(t, "x").shape[0], arg(t, "x").shape[1],
                                             arg(t, "weights_proj").shape[1]), False)),
    IdxQQuant: _factor(6),
    IdxQrRope: _factor(6),
    IdxTopk: _factor(80),
    **dict.fromkeys((IdxQrDequant, IdxTopkBounded, IdxWeightsReduce, IdxTopkSelect), DEFAULTS),
    # sparse attention
    KvCacheWriteback: Rule(touched=_write_rows("kv_cache", "kv")),
    KvTouch: Rule(touched=lambda t: {"kv_cache": 0.0}),      # a WAR marker: a no-op self copy on the device
    HcaCmpWorkGather: Rule(touched=_gather_rows("cmp_kv", "rows")),
    HcaRawAttn: Rule(cube=_attention("q", _rows_dim("rows")), softmax=True),
    HcaRawAttnDirect: Rule(cube=_attention("q", _rows_dim("rows")), softmax=True),
    HcaRequestKvGather: Rule(touched=_gather_rows("kv_cache", "rows")),
    HcaRawAttnRequest: Rule(cube=_attention("q", _rows_dim("indices")), softmax=True),   # W keys per token
    HcaCmpQkPv: Rule(cube=_attention("q", lambda t: int(t.attrs.get("max_rows") or arg(t, "cmp_rows").shape[1])),
                     softmax=True),
    CsaQkPv: Rule(touched=_csa_qk_rows, cube=_attention("q", _csa_keys), softmax=True),
    CsaMergeNorm: _factor(10),
    HcaStreamMerge: _factor(8),
    HcaStreamPack: _factor(6),
    HcaStreamMergePack: _factor(12),
    HcaStreamMergePackPublish: _factor(12),   # the merge-pack's work; its tiles land in the window, not in GM
    **dict.fromkeys((CsaSlotsBuildValidQkPlan, HcaRawTranspose, OLocalBridge), DEFAULTS),
    # hyper-connections
    HcPreLinear: Rule(cube=lambda t: (_mm(arg(t, "x_hc").shape[0], math.prod(arg(t, "x_hc").shape[1:]),
                                          arg(t, "hc_fn").shape[0]), False)),
    CombSinkhorn: _factor(20 * 12),
    HcPreRms: _factor(3),
    HcPost: _factor(6),
    MixX: _factor(3),
    MixXRmsNorm: _factor(5),   # per x_hc element: mix_x's 3 + rmsnorm's 6 per x_mixed element (¼ as many), rounded
    **dict.fromkeys((HcPreLinearReduce, SplitPrePost), DEFAULTS),
    # deterministic split-k; no cube rule yet: matmul_partials' FLOPs are not counted
    **dict.fromkeys((MatmulPartials, SplitReduce), DEFAULTS),
    # output projection
    OProjA: Rule(touched=_group_slices("heads", "wo_a"), slice_key=_group,
                 cube=lambda t: (_mm(_last_out(t).shape[0], arg(t, "wo_a").shape[-1], arg(t, "wo_a").shape[-2]),
                                 False)),
    OProjB: Rule(touched=_wo_b_columns, slice_key=_group,
                 cube=lambda t: (_mm(arg(t, "x").shape[0], arg(t, "x").shape[1], _last_out(t).shape[1]), True)),
    QuantRows: _factor(6),
    OProjBDequant: _factor(4),
    TpODequantReduceScatter: _factor(4),     # o_proj_b_dequant's work; the owner's lane sum is a fraction of it
    # MoE
    FfnNorm: _factor(6),
    XNormQuant: _factor(6),
    Gate: Rule(cube=lambda t: (_mm(arg(t, "xg").shape[0], arg(t, "xg").shape[1], arg(t, "gate_w").shape[0]), False)),
    RouteSort: _factor(40),
    ExpertShared: Rule(cube=lambda t: (3 * _mm(arg(t, "x_i8").shape[0], arg(t, "x_i8").shape[1],
                                               arg(t, "w1").shape[0]), True)),
    ExpertRouted: Rule(touched=lambda t: {a.param: float(nbytes(a) * 768 / max(1, a.shape[0] * a.shape[1]))
                                          for a in t.args
                                          if (a.param.startswith("recv_") or a.param == "out") and len(a.shape) >= 2},
                       cube=lambda t: (3 * _mm(768, arg(t, "recv_x").shape[-1], arg(t, "w1").shape[-2]), True)),
    DispatchPush: Rule(touched=_routed_rows),
    DispatchGather: Rule(touched=lambda t: {a.param: float(nbytes(a) * 768 / max(1, a.shape[0] * a.shape[1]))
                                            for a in t.args if len(a.shape) >= 2 and a.shape[0] == 16}),
    Combine: Rule(touched=_routed_rows),
    **dict.fromkeys((DispatchMeta, RouteHash, SharedRouted), DEFAULTS),
    # collectives, windows and signals
    WindowRelease: Rule(touched=lambda t: {"window": 0.0}),   # barrier 2 and the credit reset: the window is not read
    **dict.fromkeys((OGroupA2A, CpAllGather, CpOwnRows, TpOReduceScatter, WindowCopyOut, Window, Put, SignalNotify,
                     SignalWait, SignalBarrier, CpTypedAllGather, CpTypedReadback), DEFAULTS),
    # modelling glue (no seed task: the seed's consumers read the group rows in place): it moves no bytes
    CpRankRows: Rule(touched=lambda t: {a.param: 0.0 for a in t.args}),
    # the CP compressor payloads' wire form: every byte read and written once
    **dict.fromkeys((CpWirePack, CpWireUnpack), DEFAULTS),
}


def rule_of(op: str) -> Rule:
    """The roofline rule of op kind `op`; an op kind without one is an error naming it."""
    rule = ROOFLINE.get(get_op(op))
    if rule is None:
        raise LookupError(f"op '{op}' has no roofline rule (perf/roofline.py ROOFLINE; DEFAULTS when the default "
                          "counting is right)")
    return rule


def arg_traffic(task: Task) -> list[tuple[Arg, float, float]]:
    """(argument, GM bytes read, GM bytes written) of each argument of a kernel task, by its rule."""
    rule = rule_of(task.op)
    sparse = rule.touched(task) if rule.touched is not None else {}
    out = []
    for a in task.args:
        moved = sparse.get(a.param, sparse.get(a.param.removesuffix("_in")))
        size = float(nbytes(a)) if moved is None else moved
        if a.direction == "in":
            out.append((a, size, 0.0))
        elif a.direction == "out" or moved is not None:   # inout with touched rows: an in-place cache update
            out.append((a, 0.0, size))
        else:
            out.append((a, size, size))
    return out


def task_work(task: Task) -> Work:
    """Bytes and arithmetic of one task (zero for dummies)."""
    if task.is_dummy:
        return Work()
    rule = rule_of(task.op)
    w = Work()
    largest = 0.0                       # elements of the largest argument, as far as the task touches it
    for a, read, written in arg_traffic(task):
        largest = max(largest, max(read, written) / ITEMSIZE.get(a.dtype, 4))
        w.read += read
        w.written += written
    cube = rule.cube
    if cube is not None:
        flops, int8 = cube(task)
        if int8:
            w.cube_int8 += flops
        else:
            w.cube_flops += flops
        if task.core == "mix" and rule.softmax:
            w.vector_ops += flops / 4 / _head_dim(task) * _SOFTMAX_OPS
    if cube is None or task.core != "cube":
        w.vector_ops += largest * rule.vector_factor
    w.remote += remote_bytes(task)
    return w


def _head_dim(task: Task) -> int:
    q = arg(task, "q")
    return q.shape[-1] if q is not None else 1


def remote_bytes(task: Task) -> float:
    """Bytes this rank sends over the inter-chip link: a collective's declared exchange (`OpDef.cross_rank`, the
    one home of that fact), else (a collective that declares none) the (tp-1)/tp share of its largest argument."""
    tp = int(task.attrs.get("tp") or 1)
    if tp <= 1 or not task.collective:
        return 0.0
    opdef = op_definition(task.op)
    spec = opdef.cross_rank if opdef is not None else None
    if spec is None:
        moved = max((nbytes(a) for a in task.args), default=0)
        return moved * (tp - 1) / tp
    exchanged = arg(task, spec.exchanged)
    if exchanged is None:
        raise ValueError(f"task '{task.name}': op '{task.op}' declares its exchange as '{spec.exchanged}', "
                         "which the task has no argument of")
    return spec.sent_bytes(exchanged.shape, exchanged.dtype, tp)


# ---- bounds --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Bound:
    seconds: float
    limit: str          # hbm | cube | vector | link | none
    terms: dict

    def cycles(self, hw: Hardware = HARDWARE) -> float:
        return hw.cycles(self.seconds)

    def us(self) -> float:
        return self.seconds * 1e6


def bound(work: Work, hw: Hardware = HARDWARE, *, cube: int | None = None, vector: int | None = None,
          gm_cores: int | None = None) -> Bound:
    """max over the roofline terms, with `cube`/`vector` cores (default: the whole chip)."""
    n_cube = hw.cube_cores if cube is None else cube
    n_vec = hw.vector_cores if vector is None else vector
    gm_bw = hw.hbm_bytes_per_s if gm_cores is None else hw.gm_bytes_per_s(gm_cores)
    terms = {
        "hbm": work.bytes / gm_bw if work.bytes else 0.0,
        "cube": (work.cube_flops / (n_cube * hw.cube_flops_per_cycle * hw.clock_hz)
                 + work.cube_int8 / (n_cube * hw.cube_int8_ops_per_cycle * hw.clock_hz)) if n_cube else
                (float("inf") if work.cube_flops or work.cube_int8 else 0.0),
        "vector": work.vector_ops / (n_vec * hw.vector_ops_per_cycle * hw.clock_hz) if n_vec else
                  (float("inf") if work.vector_ops else 0.0),
        "link": work.remote / hw.link_bytes_per_s if work.remote else 0.0,
    }
    limit = max(terms, key=lambda k: terms[k])
    seconds = terms[limit]
    return Bound(seconds, limit if seconds > 0 else "none", terms)


def chip_bound(work: Work, hw: Hardware = HARDWARE) -> Bound:
    """The chip-level roofline: all 24 AICs, all 48 AIVs, the whole HBM bandwidth."""
    return bound(work, hw)


def blocked_bound(work: Work, kind: str, blocks: int, hw: Hardware = HARDWARE) -> Bound:
    """The roofline of a task whose `blocks` SPMD blocks of core kind `kind` can use min(blocks, cores)
    cores: compute on those cores, GM traffic at their per-core rate (capped by HBM). A cube task's
    vector work and a vector task's cube work run on its own cores (one kind only)."""
    n = max(1, min(blocks, hw.cores(kind) or 1))
    if kind in ("cube", "vector"):
        return _one_kind(work, hw, n, kind)
    return bound(work, hw, cube=n, vector=2 * n, gm_cores=3 * n)


def _one_kind(work: Work, hw: Hardware, n: int, kind: str) -> Bound:
    """Both kinds of arithmetic on `n` cores of one kind (a cube core does the epilogue, an AIV the MMAD)."""
    cube_time = (work.cube_flops / hw.cube_flops_per_cycle + work.cube_int8 / hw.cube_int8_ops_per_cycle) \
        / (n * hw.clock_hz)
    vec_time = work.vector_ops / (n * hw.vector_ops_per_cycle * hw.clock_hz)
    terms = {"hbm": work.bytes / hw.gm_bytes_per_s(n) if work.bytes else 0.0,
             "cube": cube_time,
             "vector": vec_time,
             "link": work.remote / hw.link_bytes_per_s if work.remote else 0.0}
    limit = max(terms, key=lambda k: terms[k])
    seconds = terms[limit]
    return Bound(seconds, limit if seconds > 0 else "none", terms)


# ---- the floor: what a rank must move --------------------------------------------------------------------
@dataclass(frozen=True)
class Floor:
    """Bytes a rank must move for its layer, whatever the decomposition (module docstring)."""

    parts: dict[str, float]     # inputs (weights, activations, tables) | caches | outputs | exchange, bytes
    hbm_bytes_per_s: float

    @property
    def low(self) -> float:
        return sum(v for k, v in self.parts.items() if k != "exchange")

    @property
    def high(self) -> float:
        return self.low + self.parts.get("exchange", 0.0)

    @property
    def low_us(self) -> float:
        return 1e6 * self.low / self.hbm_bytes_per_s

    @property
    def high_us(self) -> float:
        return 1e6 * self.high / self.hbm_bytes_per_s

    def summary(self) -> str:
        return ", ".join(f"{k} {v / 1e6:.1f} MB" for k, v in self.parts.items())

    def to_json(self) -> dict:
        return {"low_bytes": self.low, "high_bytes": self.high, "low_us": self.low_us, "high_us": self.high_us,
                "parts_bytes": dict(self.parts)}


def floor(tg, hw: Hardware = HARDWARE) -> Floor:
    """What a rank must move: each external buffer's touched bytes read once, each cache and output written once
    (low); plus what its collectives exchange with the other ranks (high).

    A byte is "the same" when two tasks touch the same view of the same buffer and the same slice of it
    (`Rule.slice_key`); their touched sizes (by each task's rule) are then counted once, at the larger. Local
    intermediates that are not layer outputs are not counted: a perfect fusion keeps them on chip."""
    outputs = {v.buffer for v in tg.outputs.values()}
    reads: dict[tuple, float] = {}
    writes: dict[tuple, float] = {}
    exchange = 0.0
    for t in tg.tasks:
        if t.is_dummy:
            continue
        rule = rule_of(t.op)
        key = rule.slice_key(t) if rule.slice_key is not None else None
        for a, read, written in arg_traffic(t):
            kind = tg.buffers[a.view.buffer].kind
            k = (a.view.buffer, a.view.offset, tuple(a.view.shape), tuple(a.view.strides), key)
            if read and kind != "local":
                reads[k] = max(reads.get(k, 0.0), read)
            if written and (kind == "inout" or a.view.buffer in outputs):
                writes[k] = max(writes.get(k, 0.0), written)
        exchange += remote_bytes(t)
    parts = {"inputs": 0.0, "caches": 0.0, "outputs": 0.0}
    for per_key, is_write in ((reads, False), (writes, True)):
        per_buffer: dict[str, float] = {}
        for (name, *_), b in per_key.items():
            per_buffer[name] = per_buffer.get(name, 0.0) + b
        for name, b in per_buffer.items():
            buf = tg.buffers[name]
            b = min(b, float(buf.numel * ITEMSIZE.get(buf.dtype, 4)))
            part = "caches" if buf.kind == "inout" else ("outputs" if is_write else "inputs")
            parts[part] += b
    parts["exchange"] = exchange
    return Floor(parts, hw.hbm_bytes_per_s)

"""Lightning-indexer ops of the CSA layer (dspark-model.md §3.4 7a-7k; dsv4-math §5.2, §5.3).

Query side: `matmul` (idx_qr_proj_matmul, int8) → `idx_qr_dequant` → `rope_swap_idx` (qr_rope_swap_idx) →
`idx_qr_rope` → `idx_hadamard_matmul` → `idx_q_quant`. Head weights: `idx_weights_proj` (K-split partials) →
`idx_weights_reduce` (ascending sum). Then `idx_score` → `idx_topk`.

Top-k bypass (dspark-model.md §6(a)): `idx_score` and `idx_topk` carry `k` / `max_visible`, the static bound on the
visible compressed length from the cache extent (min(score_len, idx cache rows per request, ctx_cap // r)). When
max_visible ≤ k the pair can be replaced by `idx_topk_bounded` (0 … visible−1, −1 tail; same set, ascending order).
"""
from __future__ import annotations

from .. import dims as D
from ..types import DType, TensorType
from .base import (
    REQUIRED,
    Attr,
    OpDef,
    expect,
    expect_dtype,
    expect_rank,
    expect_same_dim,
    numpy_reference,
    register_op,
)
from .compressor import expect_index_vector, expect_rope_fits, expect_rope_pair, expect_table

F32, BF16, I8, I32 = DType.fp32, DType.bf16, DType.i8, DType.i32
FLOATS = (BF16, DType.fp16, F32)


class _IdxOp(OpDef):
    family = "indexer"


def visibility_attrs() -> dict[str, Attr]:
    return {
        "ratio": Attr("int", REQUIRED),
        "seq": Attr("int", REQUIRED),
        "score_len": Attr("int", REQUIRED),
    }


def check_visibility(attrs, pos: TensorType, kv_len: TensorType) -> None:
    for n in ("ratio", "seq", "score_len"):
        expect(attrs[n] > 0, f"{n} must be positive, got {attrs[n]}")
    expect_index_vector(pos, "positions")
    expect_index_vector(kv_len, "kv_seq_len")
    t, b = pos.shape[0].value(), kv_len.shape[0].value()
    expect(t is None or b is None or t == b * attrs["seq"],
           f"positions ({pos.shape[0]}) must be kv_seq_len rows · seq ({kv_len.shape[0]}·{attrs['seq']})")


def _heads(t: TensorType, what: str, dtype: DType | tuple[DType, ...]) -> None:
    expect_rank(t, 3, f"{what} [T, IH, IHD]")
    expect_dtype(t, dtype, what)


# ---- query side ---------------------------------------------------------------------------------------------
@register_op
class IdxQrDequant(_IdxOp):
    """qI = f32(acc) · qr_scale[t] · idx_wq_b_scale[n], f32 [T, IH, IHD] (idx_qr_proj_dequant)."""
    name = "idx_qr_dequant"
    operands = ("acc", "qr_scale", "wq_b_scale")
    attrs = {"heads": Attr("int", REQUIRED)}
    reference = numpy_reference("indexer", "idx_qr_dequant")

    def infer(self, ins, attrs):
        acc, sa, sw = ins
        expect(acc.rank == 2 and acc.dtype == I32, f"acc must be i32[T, IH·IHD], got {acc}")
        expect(sa.rank == 1 and sa.dtype == F32, f"qr_scale must be f32[T], got {sa}")
        expect_same_dim(sa.shape[0], acc.shape[0], "qr_scale rows")
        expect(sw.rank == 1 and sw.dtype == F32, f"wq_b_scale must be f32[IH·IHD], got {sw}")
        expect_same_dim(sw.shape[0], acc.shape[1], "wq_b_scale length")
        h, n = attrs["heads"], acc.shape[1].value()
        expect(h > 0 and (n is None or n % h == 0), f"{h} heads do not divide {acc.shape[1]} columns")
        return [TensorType(F32, (acc.shape[0], D.Const(h), D.floordiv(acc.shape[1], h)))]

    def tile_axes(self, ins, outs, attrs):
        return [("rows", ins[0].shape[0]), ("n", ins[0].shape[1])]


@register_op
class IdxQrRope(_IdxOp):
    """RoPE of every head's last rope_dim dims at the request's FIRST position (tables [B, rope_dim]), then one
    bf16 rounding of the whole row → bf16 [T, IH, IHD] (qr_rope)."""
    name = "idx_qr_rope"
    operands = ("q", "cos_il", "sin_signed", "swap")
    attrs = {"seq": Attr("int", REQUIRED)}
    reference = numpy_reference("indexer", "idx_qr_rope")

    def infer(self, ins, attrs):
        q, cos, sin, swap = ins
        _heads(q, "q", F32)
        expect_rank(cos, 2, "step rope cos_il [rows, rope_dim]")
        rows = cos.shape[0]
        rope = expect_rope_pair(cos, sin, rows, "step rope")
        expect_rope_fits(q.shape[2], rope, "q heads")
        expect(swap.rank == 1 and swap.dtype == I32, f"swap must be i32[rope_dim], got {swap}")
        expect_same_dim(swap.shape[0], rope, "swap length vs rope_dim")
        t, b, s = q.shape[0].value(), rows.value(), attrs["seq"]
        expect(t is None or b is None or t == b * s, f"q rows ({q.shape[0]}) must be table rows · seq ({rows}·{s})")
        return [q.with_dtype(BF16)]

    def tile_axes(self, ins, outs, attrs):
        return [("rows", D.mul(ins[0].shape[0], ins[0].shape[1]))]


@register_op
class IdxHadamardMatmul(_IdxOp):
    """qh = f32(q) @ f32(H) per (token, head) row, f32 [T, IH, IHD], not rounded (qr_hadamard_matmul)."""
    name = "idx_hadamard_matmul"
    operands = ("q", "hadamard")
    core = "cube"
    reference = numpy_reference("indexer", "idx_hadamard_matmul")

    def infer(self, ins, attrs):
        q, h = ins
        _heads(q, "q", FLOATS)
        expect_rank(h, 2, "hadamard [IHD, IHD]")
        expect_dtype(h, FLOATS, "hadamard")
        expect_same_dim(h.shape[0], q.shape[2], "hadamard rows vs IHD")
        expect_same_dim(h.shape[1], q.shape[2], "hadamard columns vs IHD")
        return [q.with_dtype(F32)]

    def tile_axes(self, ins, outs, attrs):
        return [("rows", D.mul(ins[0].shape[0], ins[0].shape[1]))]


@register_op
class IdxQQuant(_IdxOp):
    """q8 per (token, head) row → qI8 i8 [T, IH, IHD] and qIs f32 [T, IH] (qr_hadamard_quant)."""
    name = "idx_q_quant"
    operands = ("qh",)
    results = ("q", "scale")
    reference = numpy_reference("indexer", "idx_q_quant")

    def infer(self, ins, attrs):
        qh = ins[0]
        _heads(qh, "qh", F32)
        return [qh.with_dtype(I8), TensorType(F32, qh.shape[:2])]

    def tile_axes(self, ins, outs, attrs):
        return [("rows", D.mul(ins[0].shape[0], ins[0].shape[1]))]


# ---- head weights -------------------------------------------------------------------------------------------
@register_op
class IdxWeightsProj(_IdxOp):
    """K-split partials of x @ weights_proj: f32 [k_split, T, IH], partial k over the k-th contiguous K slice,
    each accumulated exactly and rounded once (weights_proj)."""
    name = "idx_weights_proj"
    operands = ("x", "weights_proj")
    attrs = {"k_split": Attr("int", REQUIRED)}
    core = "cube"
    reference = numpy_reference("indexer", "idx_weights_proj")

    def infer(self, ins, attrs):
        x, w = ins
        expect_rank(x, 2, "x [T, D]")
        expect_dtype(x, FLOATS, "x")
        expect_rank(w, 2, "weights_proj [D, IH]")
        expect_dtype(w, FLOATS, "weights_proj")
        expect_same_dim(w.shape[0], x.shape[1], "weights_proj rows vs hidden")
        k, d = attrs["k_split"], x.shape[1].value()
        expect(k > 0 and (d is None or d % k == 0), f"k_split {k} must divide the hidden size {x.shape[1]}")
        return [TensorType(F32, (D.Const(k), x.shape[0], w.shape[1]))]

    def tile_axes(self, ins, outs, attrs):
        return [("m", ins[0].shape[0]), ("k", ins[0].shape[1])]


@register_op
class IdxWeightsReduce(_IdxOp):
    """w = (Σ_k partials[k] in ascending k, f32) · scale → f32 [T, IH] (weights_proj_reduce; ordered)."""
    name = "idx_weights_reduce"
    operands = ("partials",)
    attrs = {"scale": Attr("float", REQUIRED)}
    reference = numpy_reference("indexer", "idx_weights_reduce")

    def infer(self, ins, attrs):
        p = ins[0]
        expect(p.rank == 3 and p.dtype == F32, f"partials must be f32[k, T, IH], got {p}")
        return [TensorType(F32, p.shape[1:])]

    def tile_axes(self, ins, outs, attrs):
        return [("rows", ins[0].shape[1])]


# ---- score and top-k ----------------------------------------------------------------------------------------
@register_op
class IdxScore(_IdxOp):
    """score[t, l] = (Σ_h relu(f32(qI8[t,h]·k_i8[l]) · qIs[t,h]) · w[t,h]) · k_s[l] for l < min(visible[t],
    max_visible), f32 [T, score_len] (score). As upstream's score scope (pypto-lib decode_indexer.py, 634e77bd:
    "no score_init: the loop writes the valid region; the tail is never read (topk re-masks)") the entries at or
    past visible are open (`open_entries`: any value; the reference writes FP32_NEG_INF, consumers mask by the
    visible count), and the order of the head sum Σ_h is open (upstream: one row_sum per page tile; the reference
    sums ascending). The template reads only the pages below max_visible: a context bound makes the kernel's work
    the case's."""
    name = "idx_score"
    operands = ("q", "q_scale", "weights", "idx_kv_cache", "idx_kv_scale", "idx_block_table", "positions",
                "kv_seq_len")
    index_operands = {5: (3, 0, "block_size")}
    attrs = visibility_attrs() | {"block_size": Attr("int", REQUIRED),
                                   "max_visible": Attr("int", doc="static bound on visible (cache extent)")}
    core = "mix"
    reference = numpy_reference("indexer", "idx_score")
    open_entries = numpy_reference("indexer", "idx_score_open")

    def infer(self, ins, attrs):
        q, qs, w, cache, kscale, table, pos, kv_len = ins
        _heads(q, "q", I8)
        expect(qs.rank == 2 and qs.dtype == F32 and qs.shape == q.shape[:2], f"q_scale must be f32[T, IH], got {qs}")
        expect(w.rank == 2 and w.dtype == F32 and w.shape == q.shape[:2], f"weights must be f32[T, IH], got {w}")
        expect(cache.rank == 2 and cache.dtype == I8, f"idx_kv_cache must be i8[rows, IHD], got {cache}")
        expect_same_dim(cache.shape[1], q.shape[2], "idx_kv_cache width vs IHD")
        expect(kscale.rank == 1 and kscale.dtype == F32, f"idx_kv_scale must be f32[rows], got {kscale}")
        expect_same_dim(kscale.shape[0], cache.shape[0], "idx_kv_scale rows")
        check_visibility(attrs, pos, kv_len)
        expect_table(table, "idx_block_table", kv_len.shape[0])
        expect_same_dim(pos.shape[0], q.shape[0], "positions vs q tokens")
        return [TensorType(F32, (q.shape[0], D.Const(attrs["score_len"])))]

    def tile_axes(self, ins, outs, attrs):
        return [("tokens", ins[0].shape[0]), ("entries", D.Const(attrs["score_len"]))]


@register_op
class IdxTopk(_IdxOp):
    """The first min(k, visible) entries by descending score (ties → lower index first), then −1: i32 [T, score_len]
    (topk). `max_visible` is the static bound on visible (visible is capped at it, as in idx_score; the template
    sorts only the first max(k, max_visible) entries); when it is ≤ k the top-k bypass applies.

    `sort_stages` (dspark-model.md §6(h)) is the staged sort of the prefill kernel: the run width after each stage
    (sort32, then mrgsort merges), ascending, each a multiple of the one before. After the widest stage W the row
    is ordered only within runs of W entries, so the result is the top-k above only when the score prefix
    (`score_prefix`: min(score_len, max_visible)) fits in one run; past W the first run's keys crowd out the
    rest and the top-k is silently wrong. Unset: one full sort (decode)."""
    name = "idx_topk"
    row_sets = True     # tied scores (e.g. two exact 0.0) may come in either order
    operands = ("score", "positions", "kv_seq_len")
    attrs = visibility_attrs() | {"k": Attr("int", REQUIRED),
                                   "max_visible": Attr("int", doc="static bound on visible (cache extent)"),
                                   "sort_stages": Attr("ints", doc="run width after each sort stage (unset: one "
                                                                   "full sort)")}
    reference = numpy_reference("indexer", "idx_topk")

    def infer(self, ins, attrs):
        score, pos, kv_len = ins
        check_visibility(attrs, pos, kv_len)
        stages = attrs.get("sort_stages")
        if stages is not None:
            expect(len(stages) > 0 and stages[0] > 0, f"sort_stages must be positive run widths, got {list(stages)}")
            expect(all(b % a == 0 and b > a for a, b in zip(stages, stages[1:])),
                   f"each sort stage must merge whole runs of the one before, got {list(stages)}")
        expect(score.rank == 2 and score.dtype == F32, f"score must be f32[T, score_len], got {score}")
        expect_same_dim(score.shape[0], pos.shape[0], "score rows vs positions")
        expect(score.shape[1].value() in (None, attrs["score_len"]), f"score width must be {attrs['score_len']}")
        expect(0 < attrs["k"] <= attrs["score_len"], f"k must be in (0, score_len], got {attrs['k']}")
        return [score.with_dtype(I32)]

    def tile_axes(self, ins, outs, attrs):
        return [("tokens", ins[0].shape[0])]


# The seed's prefill top-k before its fix (dspark-model.md §6(h)): sort32, then mrgsort 64 and 256; a prefill layer
# builds its idx_topk with these and the topk-merge-stage pass adds 1024 where the score cap exceeds 256.
SEED_PREFILL_SORT_STAGES = (32, 64, 256)


def score_prefix(attrs) -> int:
    """The score entries a top-k can see: min(score_len, max_visible) (score_len when max_visible is unset)."""
    bound = attrs.get("max_visible")
    return attrs["score_len"] if bound is None else min(attrs["score_len"], bound)


def unsorted_prefix(attrs) -> str | None:
    """Why a top-k's staged sort leaves its score prefix only partially ordered (None: it sorts the prefix)."""
    stages = attrs.get("sort_stages")
    if stages is None or stages[-1] >= score_prefix(attrs):
        return None
    return (f"score prefix {score_prefix(attrs)} exceeds the widest merge stage {stages[-1]} "
            f"(sort_stages = {list(stages)}): the row is ordered only within runs of {stages[-1]}, so the top-k takes "
            f"the first run's keys, not the best")


@register_op
class IdxTopkBounded(_IdxOp):
    """The top-k bypass writer: 0 … min(visible, k)−1 then −1, i32 [T, score_len] (dspark-model.md §6(a)). Same set
    as `idx_topk` when visible ≤ k for every token (ascending instead of score order)."""
    name = "idx_topk_bounded"
    operands = ("positions", "kv_seq_len")
    attrs = visibility_attrs() | {"k": Attr("int", REQUIRED)}
    reference = numpy_reference("indexer", "idx_topk_bounded")

    def infer(self, ins, attrs):
        pos, kv_len = ins
        check_visibility(attrs, pos, kv_len)
        return [TensorType(I32, (pos.shape[0], D.Const(attrs["score_len"])))]

    def tile_axes(self, ins, outs, attrs):
        return [("tokens", ins[0].shape[0])]

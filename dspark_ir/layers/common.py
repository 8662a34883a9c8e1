"""Shared sub-block builders of the decode layers, in the seed's *before* (unoptimised) structure.

Each builder adds the stages of one sub-block of dspark-model.md §3.1 / §3.5 / §3.2-11, stage by stage, with the
seed's tiles (`tile`), SPMD block counts (`blocks`), early-resolve hints (`aer`) and explicit edges (`deps`).
Node names are `<block>.<seed stage>[.<suffix>]`. The API (used by swa.py, csa.py, hca.py, moe.py):

    pre = hc_pre(b, x_hc, hc_fn, hc_scale, hc_base, block="hc")   -> HcPre(x_mixed, post, comb)
    x_normed, late = attn_norm(b, pre.x_mixed, norm_w)             -> rms_norm (bf16), late_dep join (token)
    qkv = qkv_proj_rope(b, x_normed, late, rope_cos, rope_sin, positions)
                                                                   -> Qkv(q, kv, qr, qr_scale, cos_il, sin_signed)
    attn_out = o_proj(b, packed)                                   -> bf16[T, D]: TP1 proj_a/quant/proj_b per group
                                                                      + proj_b_act, or the TP path a2a → copy-out →
                                                                      tp_o_a / quant / tp_o_b per local group →
                                                                      dequant → RS
    x_out = hc_post(b, attn_out, x_hc, pre)                        -> f32[T, hc_mult, D]
    attention_params(b) -> AttnParams                              the common attention graph parameters

`qkv_proj_rope` declares nothing; `attention_params` declares every common input (named like goldens.inputs)
in the golden's order, so CSA/HCA add only their own.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from ..dims import ceildiv
from ..errors import ConfigError
from ..graph import Value
from .builder import GraphBuilder


class HcPre(NamedTuple):
    x_mixed: Value   # bf16[T, D]
    post: Value      # f32[T, hc_mult]
    comb: Value      # f32[T, hc_mult, hc_mult]


class Qkv(NamedTuple):
    q: Value           # bf16[T, H, HD]
    kv: Value          # bf16[T, HD]
    qr: Value          # i8[T, q_lora]
    qr_scale: Value    # f32[T]
    cos_il: Value      # bf16[T, rope_dim]  (q_rope_prepare, at each token's position)
    sin_signed: Value  # bf16[T, rope_dim]


@dataclass
class AttnParams:
    """The graph parameters every attention layer declares (names = goldens.inputs keys)."""
    x_hc: Value
    hc_fn: Value
    hc_scale: Value
    hc_base: Value
    norm_w: Value
    wq_a: Value
    wq_b: Value
    wq_b_scale: Value
    wkv: Value
    gamma_cq: Value
    gamma_ckv: Value
    attn_sink: Value
    wo_a: Value
    wo_b: Value
    wo_b_scale: Value
    rope_cos: Value
    rope_sin: Value
    positions: Value
    kv_seq_len: Value
    kv_cache: Value
    kv_block_table: Value
    swa_slot_mapping: Value
    swa_indices: Value
    swa_lens: Value


def attention_params(b: GraphBuilder, prefill: dict[str, int] | None = None) -> AttnParams:
    """Declare the common attention inputs. `kv_cache` is inout with `KV` rows (bound symbol). `prefill`: the
    prefill geometry (goldens.config.prefill_geometry) of one request's chunk: RoPE tables of its `rope_rows`,
    one kv_seq_len, a [1, kv_blocks] table and a pool of kv_blocks + 1 pages."""
    c, geo = b.cfg, b.geo
    T, D, H, HD = b.T, c.hidden, c.heads, c.head_dim
    groups = c.local_o_groups if b.tp > 1 else c.o_groups
    requests, kv_blocks, rope_rows = b.B, geo.kv_blocks, c.max_pos
    if prefill is None:
        kv_rows = b.bind("KV", geo.rows(geo.kv_blocks))
    else:
        requests, kv_blocks, rope_rows = 1, prefill["kv_blocks"], b.bind("P", prefill["rope_rows"])
        kv_rows = b.bind("KV", (kv_blocks + 1) * c.block_size)
    p = b.param
    return AttnParams(
        x_hc=p("x_hc", "f32", [T, c.hc_mult, D]),
        hc_fn=p("hc_fn", "f32", [c.mix_hc, c.hc_dim]),
        hc_scale=p("hc_scale", "f32", [3]),
        hc_base=p("hc_base", "f32", [c.mix_hc]),
        norm_w=p("norm_w", "bf16", [D]),
        wq_a=p("wq_a", "bf16", [D, c.q_lora]),
        wq_b=p("wq_b", "i8", [c.q_lora, H * HD]),
        wq_b_scale=p("wq_b_scale", "f32", [H * HD]),
        wkv=p("wkv", "bf16", [D, HD]),
        gamma_cq=p("gamma_cq", "bf16", [c.q_lora]),
        gamma_ckv=p("gamma_ckv", "bf16", [HD]),
        attn_sink=p("attn_sink", "f32", [H]),
        wo_a=p("wo_a", "bf16", [groups, c.o_lora, c.heads_per_group * HD]),
        wo_b=p("wo_b", "i8", [D, groups * c.o_lora]),
        wo_b_scale=p("wo_b_scale", "f32", [D]),
        rope_cos=p("rope_cos", "bf16", [rope_rows, c.rope_dim]),
        rope_sin=p("rope_sin", "bf16", [rope_rows, c.rope_dim]),
        positions=p("positions", "i32", [T]),
        kv_seq_len=p("kv_seq_len", "i32", [requests]),
        kv_cache=p("kv_cache", "bf16", [kv_rows, HD], inout=True),
        kv_block_table=p("kv_block_table", "i32", [requests, kv_blocks]),
        swa_slot_mapping=p("swa_slot_mapping", "i32", [T]),
        swa_indices=p("swa_indices", "i32", [T, c.window]),
        swa_lens=p("swa_lens", "i32", [T]),
    )



@dataclass
class CompressorParams:
    """The main compressor's parameters of a compressed-KV layer (cmp_*; names = goldens.inputs keys)."""
    wkv: Value
    wgate: Value
    ape: Value
    norm_w: Value
    kv: Value                   # the compressed cache (inout)
    block_table: Value
    slot_mapping: Value
    state: Value                # the ring state of the open windows (inout)
    state_block_table: Value


def compressor_params(b: GraphBuilder, *, ratio: int, overlap: bool, cmp_rows, state_rows, requests, blocks: int,
                      state_blocks: int) -> CompressorParams:
    """Declare the main compressor's inputs: an overlapping compressor (CSA's) has 2·HD wide projections and a
    4·HD state, HCA's HD and 2·HD. `cmp_rows` / `state_rows`: the cache's and the state's rows (bound symbols);
    the tables have `requests` rows of `blocks` / `state_blocks` pages."""
    c, HD = b.cfg, b.cfg.head_dim
    width = (2 if overlap else 1) * HD
    p = b.param
    return CompressorParams(
        wkv=p("cmp_wkv", "bf16", [width, c.hidden]),
        wgate=p("cmp_wgate", "bf16", [width, c.hidden]),
        ape=p("cmp_ape", "f32", [ratio, width]),
        norm_w=p("cmp_norm_w", "bf16", [HD]),
        kv=p("cmp_kv", "bf16", [cmp_rows, HD], inout=True),
        block_table=p("cmp_block_table", "i32", [requests, blocks]),
        slot_mapping=p("cmp_slot_mapping", "i32", [b.T]),
        state=p("cmp_state", "f32", [state_rows, 2 * width], inout=True),
        state_block_table=p("cmp_state_block_table", "i32", [requests, state_blocks]),
    )


# ---- §3.1 1a-1f: hc_pre -------------------------------------------------------------------------------------
def hc_pre(b: GraphBuilder, x_hc: Value, hc_fn: Value, hc_scale: Value, hc_base: Value,
           block: str = "hc") -> HcPre:
    """hc_pre_rms ∥ (seed zeros → hc_pre_linear, ATOMIC split-K over LINEAR_OK) → split_pre_post, comb_sinkhorn →
    mix_x. The atomic form is the pre-#982 one; the `deterministic-split-k` pass rewrites it into ordered partials
    plus hc_pre_linear_reduce. Every task allows early resolve (`aer`), as upstream's hc_pre.py marks them."""
    c, t = b.cfg, b.tiles
    T = b.T
    rows = ceildiv(T, t.T_TILE)
    rms = b.op("hc_pre_rms", x_hc, name=f"{block}.hc_pre_rms", eps=c.hc_eps, tile=[t.T_TILE, t.RMS_K_CHUNK],
               blocks=rows, aer=True, **b.clamp(T, t.T_TILE))
    seed = b.op("zeros", name=f"{block}.hc_pre_linear_seed", shape=[T, c.mix_hc], aer=True)
    mixes = b.op("hc_pre_linear", x_hc, hc_fn, seed, name=f"{block}.hc_pre_linear", accumulate="atomic",
                 k_split=t.LINEAR_OK, tile=[t.LINEAR_T_TILE, t.LINEAR_K_CHUNK],
                 blocks=ceildiv(T, t.LINEAR_T_TILE) * t.LINEAR_OK, aer=True, **b.clamp(T, t.LINEAR_T_TILE))
    gate = dict(tile=[t.T_TILE], blocks=rows, aer=True, **b.clamp(T, t.T_TILE))
    pre, post = b.op("split_pre_post", mixes, rms, hc_scale, hc_base, name=f"{block}.split_pre_post",
                     hc_mult=c.hc_mult, eps=c.hc_eps, **gate)
    comb = b.op("comb_sinkhorn", mixes, rms, hc_scale, hc_base, name=f"{block}.comb_sinkhorn", hc_mult=c.hc_mult,
                iters=c.sinkhorn_iters, eps=c.hc_eps, **gate)
    d_tile = min(t.D_SPMD, c.hidden)
    x_mixed = b.op("mix_x", x_hc, pre, name=f"{block}.mix_x", tile=[t.T_TILE, d_tile],
                   blocks=rows * (c.hidden // d_tile), aer=True, **b.clamp(T, t.T_TILE))
    return HcPre(x_mixed, post, comb)


# ---- §3.1 2-3: rms_norm, late_dep ---------------------------------------------------------------------------
def attn_norm(b: GraphBuilder, x_mixed: Value, norm_w: Value, block: str = "attn") -> tuple[Value, Value]:
    """rms_norm (spmd ceil(T/T_TILE), AER) and the scheduling-only late_dep join on it (delays KV work one hop)."""
    t = b.tiles
    x_normed = b.op("rmsnorm", x_mixed, norm_w, name=f"{block}.rms_norm", eps=b.cfg.rms_eps, tile=[t.T_TILE],
                    blocks=ceildiv(b.T, t.T_TILE), aer=True, **b.clamp(b.T, t.T_TILE))
    late = b.op("join", x_normed, name=f"{block}.late_dep", sched="late_dep")
    return x_normed, late


# ---- §3.1 4a-4j: qkv_proj_rope ------------------------------------------------------------------------------
def qkv_proj_rope(b: GraphBuilder, x_normed: Value, late: Value, wq_a: Value, gamma_cq: Value, wq_b: Value,
                  wq_b_scale: Value, wkv: Value, gamma_ckv: Value, rope_cos: Value, rope_sin: Value,
                  positions: Value, block: str = "qkv", kv_x: Value | None = None,
                  kv_positions: Value | None = None) -> Qkv:
    """Q side (q_rope_prepare, qr seed + atomic qr_proj_matmul, qr_rms_norm_quant, int8 qproj_matmul,
    qproj_dequant_rms_nope_rope) and KV side (kv seed + atomic kv_proj_matmul after late_dep, M loop inside
    (m_split 1), kv_rms_norm_rope with KV_RMS_T_TILE rows). `kv_x` / `kv_positions`: the KV side's own rows (the
    TP group's gathered tokens of the seed's context-parallel form), with their own RoPE tables
    (kv_rope_prepare); by default the KV side runs on x_normed with the Q side's tables."""
    c, t = b.cfg, b.tiles
    T, HD = b.T, c.head_dim
    rows = ceildiv(T, t.T_TILE)
    cos_il, sin_signed = b.op("rope_tables", rope_cos, rope_sin, positions, name=f"{block}.q_rope_prepare",
                              rope_dim=c.rope_dim, tile=[t.T_TILE], blocks=rows, aer=True, **b.clamp(T, t.T_TILE))
    # Q
    qr_seed = b.op("zeros", name=f"{block}.qr_proj_seed", shape=[T, c.q_lora])
    qr_n = min(t.QR_N_TILE, c.q_lora)
    qr_acc = b.op("matmul", x_normed, wq_a, qr_seed, name=f"{block}.qr_proj_matmul", accumulate="atomic",
                  k_split=t.QR_OK, tile=[t.KV_M_TILE, qr_n, t.QR_K_TILE], blocks=(c.q_lora // qr_n) * t.QR_OK,
                  aer=True, **b.clamp(T, t.KV_M_TILE))
    qr, qr_scale = b.op("qr_rms_norm_quant", qr_acc, gamma_cq, name=f"{block}.qr_rms_norm_quant", eps=c.rms_eps,
                        tile=[t.T_TILE], blocks=rows, aer=True, **b.clamp(T, t.T_TILE))
    n_q = c.heads * HD
    q_n = min(t.QPROJ_MM_N_TILE, n_q)
    q_acc = b.op("matmul", qr, wq_b, name=f"{block}.qproj_matmul", out="i32",
                 tile=[t.QPROJ_M_TILE, q_n, c.q_lora], blocks=n_q // q_n, **b.clamp(T, t.QPROJ_M_TILE))
    q = b.op("qproj_dequant_rms_nope_rope", q_acc, qr_scale, wq_b_scale, cos_il, sin_signed,
             name=f"{block}.qproj_dequant_rms_nope_rope", heads=c.heads, eps=c.rms_eps, tile=[t.Q_ROPE_H_TILE],
             blocks=c.heads // t.Q_ROPE_H_TILE, aer=True)
    # KV
    kv_in, kv_cos, kv_sin, R = x_normed, cos_il, sin_signed, T
    if kv_x is not None:
        kv_in, R = kv_x, kv_x.type.shape[0]
        kv_cos, kv_sin = b.op("rope_tables", rope_cos, rope_sin, kv_positions, name=f"{block}.kv_rope_prepare",
                              rope_dim=c.rope_dim, tile=[t.T_TILE], blocks=ceildiv(R, t.T_TILE), aer=True,
                              **b.clamp(R, t.T_TILE))
    kv_seed = b.op("zeros", name=f"{block}.kv_proj_seed", shape=[R, HD])
    kv_n = min(t.KV_N_TILE, HD)
    kv_acc = b.op("matmul", kv_in, wkv, kv_seed, name=f"{block}.kv_proj_matmul", accumulate="atomic",
                  k_split=t.KV_OK, m_split=1, tile=[t.KV_M_TILE, kv_n, t.KV_K_TILE],
                  blocks=(HD // kv_n) * t.KV_OK, deps=[late], **b.clamp(R, t.KV_M_TILE))
    kv = b.op("kv_rms_norm_rope", kv_acc, gamma_ckv, kv_cos, kv_sin, name=f"{block}.kv_rms_norm_rope",
              eps=c.rms_eps, tile=[t.KV_RMS_T_TILE], blocks=ceildiv(R, t.KV_RMS_T_TILE),
              **b.clamp(R, t.KV_RMS_T_TILE))
    return Qkv(q, kv, qr, qr_scale, cos_il, sin_signed)


# ---- §4: the context-parallel token all-gather ------------------------------------------------------------
CP_PUSH_WORKERS, CP_READBACK_WORKERS = 16, 16   # seed decode_cp_token_allgather: PUSH_WORKERS, READBACK_WORKERS


def cp_gather(b: GraphBuilder, x: Value, name: str, after: Value | None = None) -> Value:
    """x [T, …] on every rank → the TP group's rows [tp·T, …] (rank-major) on every rank: cp_allgather (push on
    16 workers + payload wait) and its read-back (16 workers, read-back wait, retire) as a window_copy_out.
    `after`: a value that must be ready first (an earlier gather: rendezvous collectives must meet in one order
    on every rank)."""
    window = b.op("cp_allgather", x, name=name, tp=b.tp, blocks=CP_PUSH_WORKERS, core="vector",
                  deps=[after] if after is not None else ())
    return b.op("window_copy_out", window, name=f"{name}.copy_out", axis=0, rows=b.tp * b.T,
                blocks=CP_READBACK_WORKERS, core="vector")


# ---- §3.5: the O path ---------------------------------------------------------------------------------------
O_A_M_TILE, O_A_N_TILE, O_B_M_TILE, O_B_N_TILE, DEQ_M_TILE = 16, 128, 128, 512, 8  # seed literals (§3.5)
O_TOKEN_TILE = 16  # seed TOKEN_TILE: each source's rows of the a2a window are padded to LOCAL_T_PAD = ceil16(T)
# The seed's o_group_a2a_gather: the copy-out of the exchange window is an SPMD task of ATTENTION_PUBLISH_WORKERS
# cyclic AIV workers (rows worker, worker + 48, …), not one core group (docs/seed-baselines.md "O path").
O_GATHER_WORKERS = 48


def o_proj(b: GraphBuilder, packed: Value, wo_a: Value, wo_b: Value, wo_b_scale: Value,
           block: str = "o", token_capacity: int | None = None) -> Value:
    """packed bf16[o_groups, T, hpg·HD] → attn_out bf16[T, D]: the TP1 decode_o_proj_tp1 form, or at TP > 1 the
    all-to-all (o_group_a2a: put + barrier 1 into the exchange window [LG, tp·ceil16(T), w]; then its copy-out
    wave of the tp·T data rows into a local tensor + barrier 2 + reset, as a separate `window_copy_out` on the
    seed's 48 cyclic AIV workers (o_group_a2a_gather + _complete) so the a2a-direct-read pass can remove it),
    per-local-group tp_o_a / tp_o_a_quant / tp_o_b, tp_o_b_dequant (f32 partial)
    and the f32 reduce-scatter with one bf16 rounding.

    `token_capacity` (TP1): the token count the seed's buffers are sized for (its LOCAL_T; T_PAD = ceil16 of it),
    when the step holds fewer tokens T. decode_o_proj_tp1 before pypto-lib #1226 ran proj_b_mm over all T_PAD
    rows (T_PAD/128 row blocks per group, the quant zeroing rows T … T_PAD): each group's quant then pads its
    int8 rows to T_PAD and proj_b covers them (the `o-proj-valid-rows` pass shrinks it to the T valid rows)."""
    pad = _o_pad_rows(b, token_capacity)
    if b.tp == 1:   # decode_o_proj_tp1 marks its four stages allow_early_resolve; the TP form's tp_o_* are not
        return _o_groups(b, packed, wo_a, wo_b, wo_b_scale, block, b.cfg.o_groups, b.T,
                         ("proj_a_mm", "quant", "proj_b_mm", "proj_b_act"), "bf16", pad, aer=True)
    window = b.op("o_group_a2a", packed, name=f"{block}.o_group_a2a", tp=b.tp, t_pad=O_TOKEN_TILE)
    rows = b.tp * b.T
    recv = b.op("window_copy_out", window, name=f"{block}.o_group_a2a.copy_out", axis=1, rows=rows,
                blocks=O_GATHER_WORKERS, core="vector")
    partial = _o_groups(b, recv, wo_a, wo_b, wo_b_scale, block, b.cfg.local_o_groups, rows,
                        ("tp_o_a", "tp_o_a_quant", "tp_o_b", "tp_o_b_dequant"), "f32")
    return b.op("tp_o_reduce_scatter", partial, name=f"{block}.tp_o_reduce_scatter", tp=b.tp)


def _o_pad_rows(b: GraphBuilder, token_capacity: int | None) -> int:
    """The seed's padded TP1 row capacity T_PAD = ceil16(token_capacity), 0 when the buffers hold exactly T rows."""
    if token_capacity is None:
        return 0
    T = b.value(b.T)
    if b.tp != 1:
        raise ConfigError(f"token_capacity: the padded O path is the TP1 form (decode_o_proj_tp1); at TP {b.tp} "
                          "the O path runs on the exchanged tp·T rows")
    if token_capacity < T:
        raise ConfigError(f"token_capacity: {token_capacity} is below the T = {T} tokens of the step")
    pad = -(-token_capacity // O_TOKEN_TILE) * O_TOKEN_TILE
    return pad if pad > T else 0


def _o_groups(b: GraphBuilder, heads: Value, wo_a: Value, wo_b: Value, wo_b_scale: Value, block: str,
              groups: int, rows, stages: tuple[str, str, str, str], out: str, pad_rows: int = 0,
              aer: bool = False) -> Value:
    c = b.cfg
    hint = aer or None      # b.op drops None attributes: unmarked stages carry no aer
    a_stage, q_stage, b_stage, deq_stage = stages
    a_n, b_n = min(O_A_N_TILE, c.o_lora), min(O_B_N_TILE, c.hidden)
    parts: list[Value] = []
    for g in range(groups):
        o_r = b.op("o_proj_a", heads, wo_a, name=f"{block}.{a_stage}.g{g}", group=g, tile=[O_A_M_TILE, a_n],
                   blocks=ceildiv(rows, O_A_M_TILE) * (c.o_lora // a_n), aer=hint, **b.clamp(rows, O_A_M_TILE))
        o_i8, scale = b.op("quant_rows", o_r, name=f"{block}.{q_stage}.g{g}", blocks=1, pad_rows=pad_rows or None,
                           aer=hint)
        b_rows = pad_rows or rows
        acc = b.op("o_proj_b", o_i8, wo_b, name=f"{block}.{b_stage}.g{g}", group=g, tile=[O_B_M_TILE, b_n],
                   blocks=ceildiv(b_rows, O_B_M_TILE) * (c.hidden // b_n), aer=hint, **b.clamp(b_rows, O_B_M_TILE))
        parts += [acc, scale]
    return b.op("o_proj_b_dequant", wo_b_scale, *parts, name=f"{block}.{deq_stage}", out=out,
                tile=[DEQ_M_TILE, b_n], blocks=ceildiv(rows, DEQ_M_TILE) * (c.hidden // b_n), aer=hint,
                **b.clamp(rows, DEQ_M_TILE))


# ---- §3.2 11: hc_post ---------------------------------------------------------------------------------------
HC_POST_T_TILE = 4  # seed: spmd ceil(T/4)·4, one block per (4 tokens, stream)


def hc_post(b: GraphBuilder, x_attn: Value, x_hc: Value, pre: HcPre, block: str = "hc") -> Value:
    """x_out = x_attn·post + Σ_i x_hc[:, i]·comb[:, i] (f32[T, hc_mult, D])."""
    c = b.cfg
    return b.op("hc_post", x_attn, x_hc, pre.post, pre.comb, name=f"{block}.hc_post", tile=[HC_POST_T_TILE, 1],
                blocks=ceildiv(b.T, HC_POST_T_TILE) * c.hc_mult, **b.clamp(b.T, HC_POST_T_TILE))


def attention_prefix(b: GraphBuilder, p: AttnParams) -> tuple[HcPre, Value, Value, Qkv]:
    """hc_pre → rms_norm + late_dep → qkv_proj_rope: (pre, x_normed, late_dep, qkv)."""
    pre = hc_pre(b, p.x_hc, p.hc_fn, p.hc_scale, p.hc_base)
    x_normed, late = attn_norm(b, pre.x_mixed, p.norm_w)
    qkv = qkv_proj_rope(b, x_normed, late, p.wq_a, p.gamma_cq, p.wq_b, p.wq_b_scale, p.wkv, p.gamma_ckv,
                        p.rope_cos, p.rope_sin, p.positions)
    return pre, x_normed, late, qkv

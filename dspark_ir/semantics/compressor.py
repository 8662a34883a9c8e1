"""KV compressor kernels (CSA main r=4 with overlap, indexer inner r=4 "C8", HCA r=R without overlap) and the
per-request RoPE rows they use: numpy references following dsv4-math §4 and §5.1.

Conventions (dsv4-math §0, §4):
* kv/score projections are f32 matmuls of bf16 operands, accumulated exactly (f64) and rounded once.
* State rows are f32 `[kv(OUT) | score(OUT)]`, one per position, in a ring of pages per request:
  row(pos) = table[b, (pos // BS) % pages]·BS + pos % BS. A decode step writes the state rows of all S tokens first
  (slot −1 / unmapped page skipped, later tokens win), then pools at most ONE entry per request: the one closed by
  the request's first token with (pos+1) % r == 0. Entry j covers positions [r·j, r·j + r − 1].
* Ratio-4 overlap: 2r rows — the previous window [r(j−1), rj) with the FRONT halves (kv cols [0:HD], score cols
  [OUT:OUT+HD]) then the current window [rj, rj+r) with the BACK halves ([HD:2HD], [OUT+HD:OUT+2HD]). Missing
  rows (pos < 0, unmapped page) read kv 0 / score FP32_NEG_INF.
* pooled[c] = Σ_rows kv[row, c] · softmax_rows(score[:, c]) (plain softmax over the rows, f32).
* Finish: y = pooled · rsqrt(mean(pooled²) + eps) · norm_w, then RoPE of the last rope_dim dims at r·j (f32, not
  rounded). Main compressors store rb(y) into cmp_kv at cmp_slot_mapping[token]; the inner compressor stores
  k = rb(rb(y) @ H) as q8 (int8 + f32 scale) into idx_kv_cache / idx_kv_scale at idx_slot_mapping[token].
"""
from __future__ import annotations

import numpy as np

from goldens.numerics import q8

from .dtypes import BF16, f32

F32 = np.float32
FP32_NEG_INF = F32(-3.4028234663852886e38)


def _mm(a, b) -> np.ndarray:
    """f32 matmul accumulated in f64 and rounded once (order-independent, the golden convention)."""
    return (np.asarray(a, np.float64) @ np.asarray(b, np.float64)).astype(F32)


# ---- RoPE rows at per-request positions (csa_rope_step, csa_cmp_rope, HCA boundary rows) -----------------------
def request_positions(positions, *, at, seq, ratio=1) -> np.ndarray:
    """Per-request position [B]: the request's first token (`first`), or the start r·(first // r) of the window
    its first ratio-r boundary closes (`boundary`; the RoPE position of the entry pooled this step)."""
    first = np.asarray(positions, dtype=np.int64).reshape(-1, seq)[:, 0]
    if at == "first":
        return first
    return first - first % ratio


def rope_gather_rows(rope_cos, rope_sin, positions, *, at, seq, ratio=1, **_):
    """(cos, sin) half rows [B, rope_dim/2] of the duplicated RoPE tables [P, rope_dim] at the per-request
    position (see `request_positions`). The tables hold bf16 values, so the rows are returned as bf16."""
    pos = request_positions(positions, at=at, seq=seq, ratio=ratio)
    half = np.shape(rope_cos)[1] // 2
    return np.asarray(rope_cos)[pos, :half].astype(BF16), np.asarray(rope_sin)[pos, :half].astype(BF16)


def rope_interleave(cos_half, sin_half, **_):
    """cos_il[j] = c[j>>1], sin_signed[j] = s[j>>1]·(−1 if j even else +1): [rows, rope_dim] bf16 (exact)."""
    c, s = f32(cos_half), f32(sin_half)
    j = np.arange(2 * c.shape[1])
    sign = np.where(j % 2 == 0, F32(-1.0), F32(1.0))
    return c[:, j >> 1].astype(BF16), (s[:, j >> 1] * sign).astype(BF16)


def rope_swap_idx(*, rope_dim, **_):
    """The lane permutation j ^ 1 of the interleaved RoPE (i32 [rope_dim])."""
    return (np.arange(rope_dim) ^ 1).astype(np.int32)


def rope_rotate(x, cos_il, sin_signed, swap=None, *, inverse=False) -> np.ndarray:
    """out[j] = x[j]·cos_il[j] ± x[j^1]·sin_signed[j] on the last rope_dim dims of x (f32, not rounded). The
    tables are per leading row and broadcast over the middle axes. Bit-identical to the pair form (§1.2)."""
    x = f32(x).copy()
    rd = np.shape(cos_il)[-1]
    swap = np.arange(rd) ^ 1 if swap is None else np.asarray(swap)
    shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (rd,)
    c, s = f32(cos_il).reshape(shape), f32(sin_signed).reshape(shape)
    r = x[..., -rd:]
    swapped = r[..., swap]
    x[..., -rd:] = r * c - swapped * s if inverse else r * c + swapped * s
    return x


# ---- kv_score_proj ------------------------------------------------------------------------------------------
def cmp_kv_score_proj(x, wkv, wgate, **_):
    """kvp = x @ wkv.T, scp = x @ wgate.T → two f32 [T, OUT] (the APE is added by the scatter stage)."""
    xf = f32(x)
    return _mm(xf, f32(wkv).T), _mm(xf, f32(wgate).T)


# ---- scatter_softmax_pool -----------------------------------------------------------------------------------
def ring_row(table_row, pos: int, block_size: int) -> int:
    """Physical state row of `pos` through a ring table row (−1 for pos < 0 or an unmapped page)."""
    if pos < 0:
        return -1
    pages = len(table_row)
    page = int(table_row[(pos // block_size) % pages])
    return -1 if page < 0 else page * block_size + pos % block_size


def pool_token(positions, b: int, *, seq: int, ratio: int) -> int:
    """Token index of request b's first window-closing token ((pos+1) % r == 0), or −1 (≤ 1 entry per step)."""
    for t in range(b * seq, (b + 1) * seq):
        if (int(positions[t]) + 1) % ratio == 0:
            return t
    return -1


def window_state(state, table_row, j: int, *, ratio, head_dim, overlap, block_size):
    """(kv [rows, HD], score [rows, HD]) read from the state for entry j (see the module docstring)."""
    out = 2 * head_dim if overlap else head_dim
    parts = [(range(ratio * j, ratio * j + ratio), head_dim if overlap else 0)]
    if overlap:
        parts.insert(0, (range(ratio * j - ratio, ratio * j), 0))
    kv, score = [], []
    for span, col in parts:
        for pos in span:
            row = ring_row(table_row, pos, block_size)
            if row < 0:
                kv.append(np.zeros(head_dim, F32))
                score.append(np.full(head_dim, FP32_NEG_INF, F32))
                continue
            kv.append(state[row, col:col + head_dim])
            score.append(state[row, out + col:out + col + head_dim])
    return np.stack(kv).astype(F32), np.stack(score).astype(F32)


def softmax_pool(kv, score) -> np.ndarray:
    """pooled[c] = Σ_rows kv[row, c] · softmax_rows(score[:, c]), f32 [HD]."""
    with np.errstate(over="ignore"):
        e = np.exp(score - np.max(score, axis=0, keepdims=True))
    return np.sum(kv * (e / np.sum(e, axis=0, keepdims=True)), axis=0)


def cmp_scatter_softmax_pool(kvp, scp, ape, state, state_block_table, positions, *, ratio, head_dim, overlap,
                             block_size, seq, **_):
    """Scatter every token's state row [kvp | scp + ape[pos % r]] into the ring state (a new version), then pool
    each request's first closed entry. Returns (state f32 [rows, 2·OUT], pooled f32 [B, HD]; 0 rows for requests
    without a boundary this step)."""
    pos = np.asarray(positions, dtype=np.int64)
    table = np.asarray(state_block_table)
    new = f32(state).copy()
    rows = np.concatenate([f32(kvp), f32(scp) + f32(ape)[pos % ratio]], axis=1)
    for t in range(len(pos)):
        row = ring_row(table[t // seq], int(pos[t]), block_size)
        if row >= 0:
            new[row] = rows[t]
    batch = len(pos) // seq
    pooled = np.zeros((batch, head_dim), F32)
    for b in range(batch):
        t = pool_token(pos, b, seq=seq, ratio=ratio)
        if t < 0:
            continue
        kv, score = window_state(new, table[b], int(pos[t]) // ratio, ratio=ratio, head_dim=head_dim,
                                 overlap=overlap, block_size=block_size)
        pooled[b] = softmax_pool(kv, score)
    return new, pooled


# ---- finish: rmsnorm + rope (+ cache write) -----------------------------------------------------------------
def cmp_rmsnorm_rope(pooled, norm_w, cos_il, sin_signed, *, eps=1e-6, **_):
    """y = rope(pooled · rsqrt(mean(pooled²) + eps) · norm_w) at the entry position (per-request tables);
    f32 [B, HD], not rounded."""
    p = f32(pooled)
    inv = F32(1.0) / np.sqrt(np.mean(p * p, axis=-1, keepdims=True) + F32(eps))
    return rope_rotate((p * inv) * f32(norm_w), cos_il, sin_signed)


def _pooled_slots(positions, slot_mapping, *, seq, ratio) -> list[tuple[int, int]]:
    """(request, destination row) of every request that pooled an entry with a mapped slot this step."""
    pos = np.asarray(positions, dtype=np.int64)
    slots = np.asarray(slot_mapping)
    out = []
    for b in range(len(pos) // seq):
        t = pool_token(pos, b, seq=seq, ratio=ratio)
        if t >= 0 and slots[t] >= 0:
            out.append((b, int(slots[t])))
    return out


def cmp_rmsnorm_rope_cache_write(pooled, norm_w, cos_il, sin_signed, cmp_kv, slot_mapping, positions, *,
                                 ratio, seq, eps=1e-6, **_):
    """cmp_kv (new version) with rb(y) of every pooled entry stored at slot_mapping[pooling token]."""
    y = cmp_rmsnorm_rope(pooled, norm_w, cos_il, sin_signed, eps=eps)
    cache = np.array(cmp_kv, copy=True)
    for b, row in _pooled_slots(positions, slot_mapping, seq=seq, ratio=ratio):
        cache[row] = y[b].astype(BF16)
    return cache


def cmp_kv_hadamard(y, hadamard, **_):
    """k = rb(rb(y) @ H) (dsv4-math §5.1): bf16 [B, IHD]."""
    y_bf = f32(f32(y).astype(BF16))
    return _mm(y_bf, f32(hadamard)).astype(BF16)


def idx_kv_cache_write(k, idx_kv_cache, idx_kv_scale, slot_mapping, positions, *, ratio, seq, **_):
    """q8 per entry of k, stored at idx_slot_mapping[pooling token]: (idx_kv_cache i8, idx_kv_scale f32), new
    versions."""
    k_i8, k_s = q8(f32(k))
    cache = np.array(idx_kv_cache, copy=True)
    scale = f32(idx_kv_scale).copy()
    for b, row in _pooled_slots(positions, slot_mapping, seq=seq, ratio=ratio):
        cache[row] = k_i8[b]
        scale[row] = k_s[b, 0]
    return cache, scale


# ---- prefill: every boundary of the chunk -------------------------------------------------------------------
def prefill_cmp_pool(kvp, scp, ape, state, state_block_table, positions, *, ratio, head_dim, overlap, block_size,
                     **_):
    """The prefill compressor pool (dsv4-math §4 "Prefill rules") for one request's chunk of ascending positions:
    every token closing a window pools its entry; the entry's rows whose positions lie in the chunk come from the
    chunk's own [kvp | scp + ape[pos % r]], earlier ones from the state as received (ring rows; positions < 0 or
    unmapped: kv 0 / score FP32_NEG_INF). Then every token's state row is written (later tokens win).
    Returns (state f32 [rows, 2·OUT] (a new version), pooled f32 [T, HD], 0 for tokens closing no window)."""
    pos = np.asarray(positions, dtype=np.int64)
    table = np.asarray(state_block_table)[0]
    rows = np.concatenate([f32(kvp), f32(scp) + f32(ape)[pos % ratio]], axis=1)
    old = f32(state)
    out_dim = rows.shape[1] // 2
    start = int(pos[0]) if len(pos) else 0
    pooled = np.zeros((len(pos), head_dim), F32)
    for t in np.flatnonzero((pos + 1) % ratio == 0):
        j = int(pos[t]) // ratio
        segments = [(ratio * (j - 1), 0), (ratio * j, head_dim)] if overlap else [(ratio * j, 0)]
        kv, score = [], []
        for first, col in segments:
            for p in range(first, first + ratio):
                if p >= start:
                    src = rows[p - start]
                else:
                    row = ring_row(table, p, block_size) if p >= 0 else -1
                    src = old[row] if row >= 0 else None
                if src is None:
                    kv.append(np.zeros(head_dim, F32))
                    score.append(np.full(head_dim, FP32_NEG_INF, F32))
                else:
                    kv.append(src[col:col + head_dim])
                    score.append(src[out_dim + col:out_dim + col + head_dim])
        pooled[t] = softmax_pool(np.stack(kv), np.stack(score))
    new = old.copy()
    for t in range(len(pos)):
        row = ring_row(table, int(pos[t]), block_size)
        if row >= 0:
            new[row] = rows[t]
    return new, pooled


def prefill_cmp_finish_write(pooled, norm_w, rope_cos, rope_sin, cmp_kv, slot_mapping, positions, *, ratio,
                             eps=1e-6, **_):
    """cmp_kv (a new version) with rb(y) of every token closing a window stored at slot_mapping[token] (−1
    skipped): y = rmsnorm(pooled[t])·norm_w, RoPE at the entry's first position pos + 1 − r (from the [P, rope_dim]
    tables), f32 until the store."""
    pos = np.asarray(positions, dtype=np.int64)
    slots = np.asarray(slot_mapping)
    cache = np.array(cmp_kv, copy=True)
    hits = np.flatnonzero(((pos + 1) % ratio == 0) & (slots >= 0))
    if not len(hits):
        return cache
    first = pos[hits] + 1 - ratio
    half = np.shape(rope_cos)[1] // 2
    cos_il, sin_signed = rope_interleave(np.asarray(rope_cos)[first, :half].astype(BF16),
                                         np.asarray(rope_sin)[first, :half].astype(BF16))
    y = cmp_rmsnorm_rope(f32(pooled)[hits], norm_w, cos_il, sin_signed, eps=eps)
    cache[slots[hits]] = y.astype(BF16)
    return cache

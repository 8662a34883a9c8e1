"""qkv_proj_rope kernels: RoPE tables, the Q-side norm/quant and dequant/norm/RoPE, the KV norm/RoPE.

numpy references following dsv4-math §1.2 and §3. Rounding points: qn (before int8) and the dequantised q stay
f32; q and kv are rounded to bf16 once per element after the rotation (nope part once, each rope half once).
RoPE is the kernel form: out[j] = r[j]·cos_il[j] ± r[j^1]·sin_signed[j], bit-identical to the pair form.
"""
from __future__ import annotations

import numpy as np

from goldens.numerics import q8

from ._np import BF16, f32, to_bf16

F32 = np.float32


def rope_tables(rope_cos, rope_sin, positions, *, rope_dim, **_):
    """Per-token interleaved tables from the RoPE tables [P, rope_dim] (half duplicated) or [P, rope_dim/2] at
    `positions`: cos_il[j] = c[j>>1], sin_signed[j] = s[j>>1]·(−1 if j even else +1). bf16 (exact: the tables are
    bf16 values)."""
    half = rope_dim // 2
    pos = np.asarray(positions)
    c, s = f32(rope_cos)[pos, :half], f32(rope_sin)[pos, :half]
    j = np.arange(rope_dim)
    sign = np.where(j % 2 == 0, F32(-1.0), F32(1.0))
    return c[:, j >> 1].astype(BF16), (s[:, j >> 1] * sign).astype(BF16)


def rope_il(x, cos_il, sin_signed, *, inverse=False) -> np.ndarray:
    """Rotate the last rope_dim dims of x (f32) with interleaved tables broadcast over the middle axes."""
    x = f32(x).copy()
    rd = np.shape(cos_il)[-1]
    shape = (x.shape[0],) + (1,) * (x.ndim - 2) + (rd,)
    c, s = f32(cos_il).reshape(shape), f32(sin_signed).reshape(shape)
    r = x[..., -rd:]
    swapped = r[..., np.arange(rd) ^ 1]
    x[..., -rd:] = r * c - swapped * s if inverse else r * c + swapped * s
    return x


def _inv_rms(x, eps) -> np.ndarray:
    return F32(1.0) / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + F32(eps))


def qr_rms_norm_quant(qr_acc, gamma_cq, *, eps=1e-6, **_):
    """qn = qa·rsqrt(mean(qa²) + eps)·gamma (f32, not rounded) → q8 per row: (qr i8 [T, q_lora], qr_scale [T])."""
    qa = f32(qr_acc)
    qn = qa * _inv_rms(qa, eps) * f32(gamma_cq)
    qr, scale = q8(qn)
    return qr, scale[:, 0].astype(F32)


def qproj_dequant_rms_nope_rope(acc, qr_scale, wq_b_scale, cos_il, sin_signed, *, heads, eps=1e-6, **_):
    """q = deq(acc, qr_scale, wq_b_scale) → [T, H, head_dim]; per-head RMSNorm (no gamma); RoPE on the last
    rope_dim dims; one bf16 rounding per element (bf16 [T, H, head_dim])."""
    q = f32(acc) * f32(qr_scale)[:, None] * f32(wq_b_scale)[None, :]
    q = q.reshape(q.shape[0], heads, -1)
    q = q * _inv_rms(q, eps)
    return to_bf16(rope_il(q, cos_il, sin_signed))


def kv_rms_norm_rope(kv_acc, gamma_ckv, cos_il, sin_signed, *, eps=1e-6, **_):
    """kv = rope(ka·rsqrt(mean(ka²) + eps)·gamma), one bf16 rounding per element (bf16 [T, head_dim])."""
    ka = f32(kv_acc)
    kn = ka * _inv_rms(ka, eps) * f32(gamma_ckv)
    return to_bf16(rope_il(kn, cos_il, sin_signed))


# ---- pypto 0.2.0 template ------------------------------------------------------------------------
# Source generators for the lowering (see kernels/_pypto.py), mirroring the references above op for op:
# * every row reduction (the mean of the RMSNorms) is emitted in numpy's own float32 order (pairwise sum:
#   8 strided accumulators per ≤128 block, combined ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)), blocks halved
#   recursively) and divides by the width like np.mean. pypto.sum would reduce in torch's order, which
#   differs from numpy's in most rows at widths ≥ 16;
# * the interleaved RoPE partner r[j^1] is built by data movement only (reshape [..., rd/2, 2] → transpose →
#   swap the two planes → transpose back), then out = r·cos_il ± swapped·sin_signed exactly as `rope_il`;
# * the interleaved tables come from `index_select` rows at the positions, the half duplicated/negated with
#   `concat` and interleaved by the same reshape/transpose (pure data movement, exact).
# So every op and rounding point is the reference's: on CPU the results are bitwise the reference's except
# where pypto's calculator evaluates SQRT with torch's f32 sqrt, which is 1 ulp off the correctly rounded
# value on ~0.6 % of arguments (then inv_rms moves by an ulp: ≤ 1 bf16 ulp / ±1 int8 LSB on rare points).
# Tile last dims must span 32 bytes, so column views [.., 1] are taken under 8-wide tiles.
from ._pypto import KernelSpec, RowLoop, Src, cast_expr, py_list, vec_tile  # noqa: E402


def _pto_set_tile(src: Src, shape) -> None:
    src(f"pypto.set_vec_tile_shapes({', '.join(str(int(s)) for s in shape)})")


_PTO_FUSE_MAX_ELEMS = 4 * 4096  # a block spanning ≤ 4 vector tiles (16 KiB of f32 each) runs as one subgraph


def _pto_fusible(block_elems: int) -> bool:
    """Fuse a row block's vector chain into one subgraph only when the block is small: fusing removes the
    per-chain cost (tiny: kv_rms_norm_rope 76 k → 35 k cycles) but serialises a large block's tiles on one core
    (flash qproj_dequant_rms_nope_rope 2.7 M → 5.2 M cycles, merge_norm 1.4 M → 3.5 M)."""
    return block_elems <= _PTO_FUSE_MAX_ELEMS


def _pto_scope(src: Src, scope: int, fuse: bool = True) -> None:
    """Open (scope > 0) or close (−1) a forced subgraph (`sg_set_scope`): the vector ops between become one
    task chain instead of one per op. Never around cube ops; never across a pypto.loop boundary."""
    if fuse:
        src(f"pypto.set_pass_options(sg_set_scope={scope})")


class _PtoBlock:
    """The current row block of a RowLoop: its leading shape and the `valid_shape` of block-local tensors."""

    def __init__(self, loop: RowLoop, rows_from):
        self.loop, self.src = loop, loop.src
        self.rows = loop.shape(rows_from)[0]
        self.partial = loop.looped and loop.partial

    @property
    def r0(self) -> str:
        return "r0" if self.loop.looped else "0"

    def valid(self, *rest) -> str:
        """`, valid_shape=[valid, *rest]` for a block-local [rows, *rest] tensor when the block may be partial."""
        if not self.partial:
            return ""
        return f", valid_shape={py_list(['valid'] + [str(r) for r in rest])}"

    def sub(self, x: str, lead, offsets, width: int) -> str:
        """A view of the block-local tensor `x` ([rows, *lead[1:], ...]) of shape [*lead, width] at `offsets`."""
        return f"pypto.view({x}, {py_list(list(lead) + [width])}, {py_list(offsets)}{self.valid(*lead[1:], width)})"

    def reshape(self, x: str, shape) -> str:
        return f"pypto.reshape({x}, {py_list(shape)}{self.valid(*shape[1:])})"


def _pto_divisor(extent: int, cap: int) -> int:
    """The largest divisor of `extent` not above `cap`, so tiles split a block into equal parts."""
    cap = max(1, min(extent, cap))
    return next(d for d in range(cap, 0, -1) if extent % d == 0)


def _pto_lead_tile(lead, budget_elems: int = 2048) -> list[int]:
    """A tile for the leading dims of [*lead, w ≤ 8] tensors: inner dims whole, rows as the budget allows."""
    tile = [1] * len(lead)
    room = budget_elems
    for i in range(len(lead) - 1, -1, -1):
        tile[i] = _pto_divisor(lead[i], room)
        room = max(1, room // tile[i])
    return tile


def _pto_vec_tile(shape, itemsize: int) -> list[int]:
    """`vec_tile` with every leading entry a divisor of its extent (see `_pto_divisor`)."""
    tile = vec_tile(tuple(shape), itemsize)
    return [_pto_divisor(e, t) for e, t in zip(shape[:-1], tile[:-1])] + tile[-1:]


def _pto_pairwise_sum(blk: _PtoBlock, x: str, lead, n: int, out: str, wide_tile, tag: str = "ps",
                      side_by_side: bool = True) -> None:
    """`out` = numpy's float32 sum of the last axis (width n) of the block-local f32 tensor `x` [*lead, n],
    kept as [*lead, 1]: pairwise_sum of numpy's loops_utils (bitwise the same order). Emits the 8-wide
    accumulator adds under an 8-wide tile, then restores `wide_tile`. `side_by_side` (widths 128·2^k):
    the 128-blocks' accumulators as one [*lead, nb, 8] chain, ~4× fewer ops; cheaper in a fused subgraph
    (flash qr_rms_norm_quant 106 k → 51 k cycles) but not in an unfused large block (flash
    qproj_dequant_rms_nope_rope 2.7 M → 3.0 M), so callers pass their `fuse`."""
    src = blk.src
    rank = len(lead) + 1
    zeros = [0] * len(lead)
    narrow = _pto_lead_tile(lead) + [8]
    counter = [0]

    def fresh() -> str:
        counter[0] += 1
        return f"{tag}{counter[0]}"

    def col(t: str, off: int) -> str:
        return blk.sub(t, lead, zeros + [off], 1)

    def block(off: int, m: int) -> str:
        res = fresh()
        if m < 8:
            src(f"{res} = {col(x, off)}")
            for i in range(1, m):
                src(f"{res} = pypto.add({res}, {col(x, off + i)})")
            return res
        if m <= 128:
            acc = fresh()
            src(f"{acc} = {blk.sub(x, lead, zeros + [off], 8)}")
            i = 8
            while i < m - (m % 8):
                src(f"{acc} = pypto.add({acc}, {blk.sub(x, lead, zeros + [off + i], 8)})")
                i += 8
            r = [col(acc, k) for k in range(8)]
            src(f"{res} = pypto.add(pypto.add(pypto.add({r[0]}, {r[1]}), pypto.add({r[2]}, {r[3]})), "
                f"pypto.add(pypto.add({r[4]}, {r[5]}), pypto.add({r[6]}, {r[7]})))")
            for j in range(i, m):
                src(f"{res} = pypto.add({res}, {col(x, off + j)})")
            return res
        half = m // 2
        half -= half % 8
        a = block(off, half)
        b = block(off + half, m - half)
        src(f"{res} = pypto.add({a}, {b})")
        return res

    def blocks128(nb: int) -> str:
        """n = 128·nb with nb a power of two: numpy halves down to nb equal 128-blocks, so their 8-wide
        accumulators run side by side on a [*lead, nb, 128] reshape, then the blocks add as a balanced tree."""
        k = len(lead)
        shape4 = list(lead) + [nb, 128]
        _pto_set_tile(src, _pto_lead_tile(lead, max(1, 2048 // (nb * 8))) + [nb, 128])
        xr, acc, bs = fresh(), fresh(), fresh()
        src(f"{xr} = {blk.reshape(x, shape4)}")
        sub_tile = _pto_lead_tile(lead, max(1, 2048 // (nb * 8))) + [nb, 8]
        _pto_set_tile(src, sub_tile)

        def piece(t: str, off: int, w: int) -> str:
            return (f"pypto.view({t}, {py_list(list(lead) + [nb, w])}, {py_list(zeros + [0, off])}"
                    f"{blk.valid(*lead[1:], nb, w)})")

        src(f"{acc} = {piece(xr, 0, 8)}")
        for a in range(8, 128, 8):
            src(f"{acc} = pypto.add({acc}, {piece(xr, a, 8)})")
        r = [piece(acc, j, 1) for j in range(8)]
        src(f"{bs} = pypto.add(pypto.add(pypto.add({r[0]}, {r[1]}), pypto.add({r[2]}, {r[3]})), "
            f"pypto.add(pypto.add({r[4]}, {r[5]}), pypto.add({r[6]}, {r[7]})))")

        def tree(lo: int, hi: int) -> str:
            if hi - lo == 1:
                return (f"pypto.view({bs}, {py_list(list(lead) + [1, 1])}, {py_list(zeros + [lo, 0])}"
                        f"{blk.valid(*lead[1:], 1, 1)})")
            mid = (lo + hi) // 2
            return f"pypto.add({tree(lo, mid)}, {tree(mid, hi)})"

        res = fresh()
        src(f"{res} = {tree(0, nb)}")
        _pto_set_tile(src, _pto_lead_tile(lead) + [1, 8])
        flat = fresh()
        src(f"{flat} = {blk.reshape(res, list(lead) + [1])}")
        return flat

    assert rank >= 2
    nb = n // 128
    if side_by_side and n % 128 == 0 and nb >= 2 and nb & (nb - 1) == 0:
        src(f"{out} = {blocks128(nb)}")
    else:
        _pto_set_tile(src, narrow)
        src(f"{out} = {block(0, n)}")
    _pto_set_tile(src, wide_tile)


def _pto_inv_rms(blk: _PtoBlock, x: str, lead, n: int, eps: float, out: str, wide_tile,
                 side_by_side: bool = True) -> None:
    """`out` [*lead, 1] = 1/sqrt(mean(x², -1) + eps) like `_inv_rms` (np.mean: pairwise sum / n)."""
    src = blk.src
    src("sq = pypto.mul(" + x + ", " + x + ")")
    _pto_pairwise_sum(blk, "sq", lead, n, "ss", wide_tile, side_by_side=side_by_side)
    _pto_set_tile(src, _pto_lead_tile(lead) + [8])
    src(f"one = pypto.full({py_list(list(lead) + [1])}, 1.0, pypto.DT_FP32{blk.valid(*lead[1:], 1)})")
    src(f"{out} = pypto.div(one, pypto.sqrt(pypto.add(pypto.div(ss, {float(n)!r}), {float(eps)!r})))")
    _pto_set_tile(src, wide_tile)


def _pto_pair_swap(blk: _PtoBlock, r: str, lead, rd: int, out: str, wide_tile) -> None:
    """`out` [*lead, rd] = r[..., j ^ 1] (adjacent pairs swapped) by reshape/transpose/concat (exact)."""
    src = blk.src
    k = len(lead)
    half = rd // 2
    t_tile = _pto_lead_tile(lead, 512 // rd)  # transposes need ~13 tile-sized buffers of UB
    _pto_set_tile(src, t_tile + [half, 8])  # a reshape's tile needs a 32-byte last dim even onto a 2-wide axis
    src(f"p4 = {blk.reshape(r, list(lead) + [half, 2])}")
    _pto_set_tile(src, t_tile + [2, half])
    src(f"pt = pypto.transpose(p4, {k}, {k + 1})")
    src(f"ev = {blk.sub('pt', list(lead) + [1], [0] * (k + 2), half)}")
    src(f"od = {blk.sub('pt', list(lead) + [1], [0] * k + [1, 0], half)}")
    src(f"sw = pypto.concat([od, ev], {k})")
    _pto_set_tile(src, t_tile + [half, 2])
    src(f"pb = pypto.transpose(sw, {k}, {k + 1})")
    _pto_set_tile(src, t_tile + [rd])
    src(f"{out} = {blk.reshape('pb', list(lead) + [rd])}")
    _pto_set_tile(src, wide_tile)


def _pto_rope(blk: _PtoBlock, r: str, lead, rd: int, cos_il, sin_signed, out: str, wide_tile,
              inverse: bool = False) -> None:
    """`out` = rope_il of the block-local f32 rope part r [*lead, rd]: r·c ± swapped·s, tables [rows, rd]
    broadcast over the middle axes (read through the block's views of the cos_il / sin_signed inputs)."""
    src = blk.src
    _pto_pair_swap(blk, r, lead, rd, "swp", wide_tile)
    bshape = [blk.rows] + [1] * (len(lead) - 1) + [rd]
    for name, t in (("cb", cos_il), ("sb", sin_signed)):
        tf = cast_expr(blk.loop.view(t), t.dtype, "f32")
        src(f"{name} = {blk.reshape(tf, bshape) if len(lead) > 1 else tf}")
    op = "pypto.sub" if inverse else "pypto.add"
    src(f"{out} = {op}(pypto.mul({r}, cb), pypto.mul(swp, sb))")


def _pto_rows_for(bytes_per_row: int, cap: int = 32, budget: int = 256 * 1024) -> int:
    """Rows per loop iteration (rank-2 templates): what keeps a block's f32 working set around `budget` bytes
    (pypto splits it into UB tiles; fewer iterations = fewer task chains), ignoring the IR's SPMD rows tile."""
    return max(1, min(cap, budget // max(1, bytes_per_row)))


def _pto_rows_whole_tile(row_elems: int, cap: int = 8) -> int:
    """Rows per block for templates with rank-3 [rows, heads, dim] math: as many as fit ONE vector tile
    (`vec_tile`'s 16 KiB of f32), so tiles split heads/dims but never the rows of a block. pypto 0.2.0's
    InferDynShape pass mis-handles rank-3 tiles that split the rows (pass-verify FAILS, measured on
    [8, 3, 192] tiled (4, 3, 192)) even though the tensor graph computes right."""
    return max(1, min(cap, 4096 // max(1, row_elems)))


def pypto_rope_tables(spec: KernelSpec) -> str:
    """cos_il / sin_signed [T, rd] bf16: the table rows at `positions` (index_select), the first rd/2 columns
    duplicated (cos) or [−s, s] (sin), interleaved by reshape [rows, 2, rd/2] → transpose → [rows, rd]."""
    cos, sin, pos = spec.operands
    cos_il, sin_signed = spec.results
    rd = int(spec.attrs["rope_dim"])
    half = rd // 2
    src = Src(spec.signature())
    loop = RowLoop(src, pos, 32)  # fewer, larger blocks than the IR's rows tile (one fused chain each)
    blk = _PtoBlock(loop, pos)
    br = blk.rows
    with loop.loop():
        _pto_scope(src, 1)  # one subgraph per row block (the tables are small)
        _pto_set_tile(src, [max(br, 8)])
        src(f"pv = {loop.view(pos)}")
        _pto_set_tile(src, [br, cos.shape[1]])
        for name, table in (("c", cos), ("s", sin)):
            src(f"{name}f = {cast_expr(f'pypto.index_select({table.name}, 0, pv)', table.dtype, 'f32')}")
            src(f"{name}h = {blk.sub(name + 'f', [br], [0, 0], half)}")
        _pto_set_tile(src, [br, rd])
        src("cc = pypto.concat([ch, ch], -1)")
        src("ss = pypto.concat([pypto.neg(sh), sh], -1)")
        for name, target in (("cc", cos_il), ("ss", sin_signed)):
            _pto_set_tile(src, [br, 2, half])
            src(f"{name}3 = {blk.reshape(name, [br, 2, half])}")
            _pto_set_tile(src, [br, half, 2])
            src(f"{name}t = pypto.transpose({name}3, 1, 2)")
            _pto_set_tile(src, [br, rd])
            src(f"{name}i = {blk.reshape(name + 't', [br, rd])}")
            src(f"{name}o = {cast_expr(name + 'i', 'f32', target.dtype)}")
            loop.store(f"{name}o", target)
        _pto_scope(src, -1)
    return src.text()


def pypto_qr_rms_norm_quant(spec: KernelSpec) -> str:
    """qn = (qa·inv)·gamma in f32, then q8 per row: amax = max(max|qn|, 1e-4), k = 127/amax (true division),
    qr = rint(qn·k) through int32 → fp16 → int8, scale = 1/k."""
    qa, gamma = spec.operands
    qr, scale = spec.results
    n = qa.shape[1]
    eps = float(spec.attrs.get("eps", 1e-6))
    src = Src(spec.signature())
    loop = RowLoop(src, qa, _pto_rows_for(n * 4 * 4))
    blk = _PtoBlock(loop, qa)
    br = blk.rows
    fuse = _pto_fusible(br * n)
    wide = _pto_vec_tile((br, n), 4)
    with loop.loop():
        _pto_scope(src, 1, fuse)  # one subgraph per row block when small
        _pto_set_tile(src, wide)
        src(f"x = {loop.view(qa)}")
        _pto_inv_rms(blk, "x", [br], n, eps, "inv", wide, side_by_side=fuse)
        src(f"g = {cast_expr(f'pypto.reshape({gamma.name}, [1, {n}])', gamma.dtype, 'f32')}")
        src("qn = pypto.mul(pypto.mul(x, inv), g)")
        src("amax = pypto.maximum(pypto.amax(pypto.abs(qn), -1, keepdim=True), 0.0001)")
        _pto_set_tile(src, [br, 8])
        src(f"k = pypto.div(pypto.full([{br}, 1], 127.0, pypto.DT_FP32{blk.valid(1)}), amax)")
        src(f"s = pypto.div(pypto.full([{br}, 1], 1.0, pypto.DT_FP32{blk.valid(1)}), k)")
        _pto_set_tile(src, wide)
        src(f"qv = {cast_expr('pypto.mul(qn, k)', 'f32', 'i8')}")
        loop.store("qv", qr)
        _pto_set_tile(src, [max(br, 8)])
        src(f"s1 = {blk.reshape('s', [br])}")
        loop.store("s1", scale)
        _pto_scope(src, -1, fuse)
    return src.text()


def pypto_qproj_dequant_rms_nope_rope(spec: KernelSpec) -> str:
    """q = (f32(acc)·qr_scale)·wq_b_scale → [rows, H, hd]; q·inv_rms per head; RoPE on the last rd dims;
    one bf16 rounding (nope and rope parts assembled separately)."""
    acc, sa, sw, cos_il, sin_signed = spec.operands
    out = spec.results[0]
    _, heads, hd = out.shape
    n = acc.shape[1]
    rd = cos_il.shape[1]
    eps = float(spec.attrs.get("eps", 1e-6))
    src = Src(spec.signature())
    loop = RowLoop(src, acc, _pto_rows_whole_tile(n))
    blk = _PtoBlock(loop, acc)
    br = blk.rows
    fuse = _pto_fusible(br * n)
    wide2 = _pto_vec_tile((br, n), 4)
    wide3 = _pto_vec_tile((br, heads, hd), 4)
    with loop.loop():
        _pto_scope(src, 1, fuse)  # one subgraph per row block when small
        _pto_set_tile(src, wide2)
        src(f"sav = {blk.reshape(loop.view(sa), [br, 1])}")
        src(f"swv = pypto.reshape({sw.name}, [1, {n}])")
        src(f"q2 = pypto.mul(pypto.mul({cast_expr(loop.view(acc), 'i32', 'f32')}, sav), swv)")
        _pto_set_tile(src, wide3)
        src(f"q = {blk.reshape('q2', [br, heads, hd])}")
        _pto_inv_rms(blk, "q", [br, heads], hd, eps, "inv", wide3, side_by_side=fuse)
        src("qn = pypto.mul(q, inv)")
        _pto_rope_tail(blk, "qn", [br, heads], hd, rd, cos_il, sin_signed, out, wide3)
        _pto_scope(src, -1, fuse)
    return src.text()


def _pto_rope_tail(blk: _PtoBlock, x: str, lead, width: int, rd: int, cos_il, sin_signed, out, wide_tile) -> None:
    """Round x[..., :width-rd] and rope(x[..., width-rd:]) to out's dtype and assemble both at the block row
    (rounding each part before or after pure data movement gives the same bits)."""
    src = blk.src
    k = len(lead)
    nope = width - rd
    src(f"rp = {blk.sub(x, lead, [0] * k + [nope], rd)}")
    _pto_rope(blk, "rp", lead, rd, cos_il, sin_signed, "ro", wide_tile)
    base = [blk.r0] + ["0"] * k
    if nope:
        src(f"np_ = {cast_expr(blk.sub(x, lead, [0] * (k + 1), nope), 'f32', out.dtype)}")
        src(f"pypto.assemble(np_, {py_list(base)}, {out.name})")
    src(f"ro_ = {cast_expr('ro', 'f32', out.dtype)}")
    src(f"pypto.assemble(ro_, {py_list(base[:-1] + [f'{base[-1]} + {nope}' if nope else base[-1]])}, {out.name})")


def pypto_kv_rms_norm_rope(spec: KernelSpec) -> str:
    """kv = rope((ka·inv)·gamma), one bf16 rounding (nope and rope parts assembled separately)."""
    ka, gamma, cos_il, sin_signed = spec.operands
    out = spec.results[0]
    n = ka.shape[1]
    rd = cos_il.shape[1]
    eps = float(spec.attrs.get("eps", 1e-6))
    src = Src(spec.signature())
    loop = RowLoop(src, ka, _pto_rows_for(n * 4 * 4))
    blk = _PtoBlock(loop, ka)
    br = blk.rows
    fuse = _pto_fusible(br * n)
    wide = _pto_vec_tile((br, n), 4)
    with loop.loop():
        _pto_scope(src, 1, fuse)  # one subgraph per row block when small
        _pto_set_tile(src, wide)
        src(f"x = {loop.view(ka)}")
        _pto_inv_rms(blk, "x", [br], n, eps, "inv", wide, side_by_side=fuse)
        src(f"g = {cast_expr(f'pypto.reshape({gamma.name}, [1, {n}])', gamma.dtype, 'f32')}")
        src("kn = pypto.mul(pypto.mul(x, inv), g)")
        _pto_rope_tail(blk, "kn", [br], n, rd, cos_il, sin_signed, out, wide)
        _pto_scope(src, -1, fuse)
    return src.text()


PYPTO_TEMPLATES = {
    "rope_tables": pypto_rope_tables, "qr_rms_norm_quant": pypto_qr_rms_norm_quant,
    "qproj_dequant_rms_nope_rope": pypto_qproj_dequant_rms_nope_rope, "kv_rms_norm_rope": pypto_kv_rms_norm_rope,
}

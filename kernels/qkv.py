"""pypto 0.2.0 templates of the qkv kernel family (the ops' numpy semantics: dspark_ir/semantics/qkv.py)."""
from __future__ import annotations

# ---- pypto 0.2.0 template ------------------------------------------------------------------------
# Source generators for the lowering (see kernels/pto.py), mirroring the references above op for op:
# * every row reduction (the mean of the RMSNorms) is emitted in numpy's own float32 order (pairwise sum:
#   8 strided accumulators per ≤128 block, combined ((r0+r1)+(r2+r3))+((r4+r5)+(r6+r7)), blocks halved
#   recursively) and divides by the width like np.mean. pypto.sum would reduce in torch's order, which
#   differs from numpy's in most rows at widths ≥ 16;
# * the interleaved RoPE partner r[j^1] is built by data movement only, then out = r·cos_il ± swapped·sin_signed
#   exactly as `rope_il`; the interleaved tables come from `index_select` rows at the positions, the half
#   duplicated/negated and interleaved by data movement (exact).
# So every op and rounding point is the reference's: on CPU the results are bitwise the reference's except
# where pypto's calculator evaluates SQRT with torch's f32 sqrt, which is 1 ulp off the correctly rounded
# value on ~0.6 % of arguments (then inv_rms moves by an ulp: ≤ 1 bf16 ulp / ±1 int8 LSB on rare points).
#
# Two sets of helpers. The block helpers (`_PtoBlock`, `_pto_pairwise_sum`, `_pto_rope`, ...; used by other
# families) work on rank-3/4 [rows, heads, ...] tiles with narrow views. This family's templates use the rank-2
# helpers below them: pypto 0.2.0's cost model charges narrow views of rank-3/4 tiles, last-dim-1 columns and
# per-op task chains heavily, while rank-2 reshapes and transposes of contiguous data are cheap. So a reduced
# axis is moved to the rows by a transpose and numpy's order runs as adds of whole [8, C] / [1, C] row views,
# a pair swap is a row swap of the transposed rope part, and every token (or block of whole rows) is one
# forced subgraph (`sg_set_scope`). Flash TP4 cost-model µs, before → after: qproj_dequant_rms_nope_rope
# 2217 → 194 → 83 → 46.5, kv_rms_norm_rope 87 → 10 → 4.4, qr_rms_norm_quant 26 → 12 → 5.5, rope_tables
# (1 block) 135 → 3.
# What the cost model charges inside a task (read from its per-pipe logs): one MTE_IN pipe per core runs every
# copy into the UB one after the other, ~1.4 k cycles each plus ~95 B/cycle; a view or reshape stays in the UB
# only if its tile lies inside one tile of its producer and starts 32-byte aligned (a [rows, 1] column view or
# a reshape between differently padded layouts goes out to global memory and back, once per consumer); a
# binary op on 64 KiB tiles fills the 192 KiB UB (anything else live spills); a task that many tasks depend
# on costs the AICPU ~390 cycles per dependent, serially; the `alone µs` of a kernel is its summed task time
# over its IR blocks, so busy time stalled on copies counts.
from dspark_ir.ops.qkv import KvRmsNormRope, QprojDequantRmsNopeRope, QrRmsNormQuant, RopeTables

from .pto import KernelSpec, RowLoop, Src, cast_expr, py_list, vec_tile
from .registry import template


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


def _pto_namer(tag: str):
    """fresh() -> `tag1`, `tag2`, ...: the temporaries of one emitted reduction."""
    counter = [0]

    def fresh() -> str:
        counter[0] += 1
        return f"{tag}{counter[0]}"
    return fresh


def _pto_pairwise_tree(src: Src, fresh, view, x: str, off: int, m: int) -> str:
    """Emit numpy's float32 pairwise_sum (loops_utils) of the m "elements" of `x` from `off`, bitwise in its
    order: < 8 a plain chain, ≤ 128 eight accumulators then their tree, else the halves (cut at a multiple of
    8). `view(t, off, k)` is the expression of k consecutive elements of `t` from `off`; returns the result's
    name."""
    res = fresh()
    if m < 8:
        src(f"{res} = {view(x, off, 1)}")
        for i in range(1, m):
            src(f"{res} = pypto.add({res}, {view(x, off + i, 1)})")
        return res
    if m <= 128:
        acc = fresh()
        src(f"{acc} = {view(x, off, 8)}")
        i = 8
        while i < m - (m % 8):
            src(f"{acc} = pypto.add({acc}, {view(x, off + i, 8)})")
            i += 8
        r = [view(acc, k, 1) for k in range(8)]
        src(f"{res} = pypto.add(pypto.add(pypto.add({r[0]}, {r[1]}), pypto.add({r[2]}, {r[3]})), "
            f"pypto.add(pypto.add({r[4]}, {r[5]}), pypto.add({r[6]}, {r[7]})))")
        for j in range(i, m):
            src(f"{res} = pypto.add({res}, {view(x, off + j, 1)})")
        return res
    half = m // 2
    half -= half % 8
    a = _pto_pairwise_tree(src, fresh, view, x, off, half)
    b = _pto_pairwise_tree(src, fresh, view, x, off + half, m - half)
    src(f"{res} = pypto.add({a}, {b})")
    return res


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
    fresh = _pto_namer(tag)

    def view(t: str, off: int, k: int) -> str:
        return blk.sub(t, lead, zeros + [off], k)

    def block(off: int, m: int) -> str:
        return _pto_pairwise_tree(src, fresh, view, x, off, m)

    def blocks128(nb: int) -> str:
        """n = 128·nb with nb a power of two: numpy halves down to nb equal 128-blocks, so their 8-wide
        accumulators run side by side on a [*lead, nb, 128] reshape, then the blocks add as a balanced tree."""
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


def _pto_rows_whole_tile(row_elems: int, cap: int = 8) -> int:
    """Rows per block for templates with rank-3 [rows, heads, dim] math: as many as fit ONE vector tile
    (`vec_tile`'s 16 KiB of f32), so tiles split heads/dims but never the rows of a block. pypto 0.2.0's
    InferDynShape pass mis-handles rank-3 tiles that split the rows (pass-verify FAILS, measured on
    [8, 3, 192] tiled (4, 3, 192)) even though the tensor graph computes right."""
    return max(1, min(cap, 4096 // max(1, row_elems)))


# ---- rank-2 helpers (see the section header) -------------------------------------------------------------------
_PTO_T_TILE = 64          # the column tile of the transposes (the UB holds ~3 transpose tiles)


def _pto_align(width: int, elems: int = 16) -> int:
    """A tile's last dim: `width` rounded up to whole 32-byte blocks for 2-byte operands (≥ 16 elements)."""
    return max(elems, -(-width // elems) * elems)


def _pto_tile2(src: Src, rows: int, width: int, budget: int = 16384) -> None:
    """A rank-2 vector tile for [rows, width] f32 tensors: the width whole (aligned), rows as the element
    budget allows (≥ 1)."""
    w = _pto_align(width)
    src(f"pypto.set_vec_tile_shapes({max(1, min(rows, budget // w))}, {w})")


def _pto_pairwise_rows(src: Src, x_t: str, n: int, cols: int, tag: str) -> str:
    """numpy's float32 pairwise sum over the ROWS of the f32 tensor `x_t` [n, cols] (each column one reduced
    vector): returns the name of a [1, cols] row. Every "element" of numpy's recursion is a [1, cols] row."""
    fresh = _pto_namer(tag)

    def rows(t: str, off: int, k: int) -> str:
        return f"pypto.view({t}, [{k}, {cols}], [{off}, 0])"

    def block(off: int, m: int) -> str:
        return _pto_pairwise_tree(src, fresh, rows, x_t, off, m)

    src(f"pypto.set_vec_tile_shapes(8, {_pto_align(min(cols, 2048), 8)})")
    return block(0, n)


def _pto_balanced_sum(leaf, lo: int, hi: int) -> str:
    """The expression adding leaf(lo) … leaf(hi − 1) as a balanced tree (halves split at the midpoint): numpy's
    order for the 128-blocks of a pairwise sum."""
    if hi - lo == 1:
        return leaf(lo)
    mid = (lo + hi) // 2
    return f"pypto.add({_pto_balanced_sum(leaf, lo, mid)}, {_pto_balanced_sum(leaf, mid, hi)})"


def _pto_row_sums(src: Src, x: str, rows: int, n: int, out: str, tag: str = "pw") -> None:
    """`out` [rows, 1] = numpy's float32 sum over the last axis of the f32 tensor `x` [rows, n] (static rows,
    no valid_shape), in numpy's pairwise order, bitwise. Widths 128·2^k (k ≥ 0) run their 128-blocks side by
    side: reshape [rows·nb, 128] → transpose → the 8 accumulators of every block at once → [rows, nb] → the
    balanced tree of the blocks. Other widths: transpose [n, rows] and numpy's generic recursion on row views."""
    nb = n // 128
    if n % 128 == 0 and nb & (nb - 1) == 0:
        cols = rows * nb
        if nb > 1:
            src(f"pypto.set_vec_tile_shapes({min(cols, 128)}, 128)")
            src(f"{tag}_b = pypto.reshape({x}, [{cols}, 128])")
            blocks = f"{tag}_b"
        else:
            blocks = x
        src(f"pypto.set_vec_tile_shapes(128, {_pto_align(min(cols, _PTO_T_TILE), 8)})")
        src(f"{tag}_t = pypto.transpose({blocks}, 0, 1)")
        lanes = _pto_pairwise_rows(src, f"{tag}_t", 128, cols, tag)
        src(f"pypto.set_vec_tile_shapes({min(rows, 256)}, 8)")
        if nb == 1:
            src(f"{out} = pypto.reshape({lanes}, [{rows}, 1])")
            return
        src(f"{tag}_c = pypto.reshape({lanes}, [{rows}, {nb}])")
        src(f"{out} = {_pto_balanced_sum(lambda j: f'pypto.view({tag}_c, [{rows}, 1], [0, {j}])', 0, nb)}")
        return
    src(f"pypto.set_vec_tile_shapes({min(_pto_align(n, 8), 128)}, {_pto_align(min(rows, _PTO_T_TILE), 8)})")
    src(f"{tag}_t = pypto.transpose({x}, 0, 1)")
    total = _pto_pairwise_rows(src, f"{tag}_t", n, rows, tag)
    src(f"pypto.set_vec_tile_shapes({min(rows, 256)}, 8)")
    src(f"{out} = pypto.reshape({total}, [{rows}, 1])")


def _pto_inv_rms_rows(src: Src, x: str, rows: int, n: int, eps: float, out: str) -> None:
    """`out` [rows, 1] = 1/sqrt(mean(x², -1) + eps) like `_inv_rms` (np.mean: pairwise sum / n), x [rows, n]."""
    _pto_tile2(src, rows, n)
    src(f"sq = pypto.mul({x}, {x})")
    _pto_row_sums(src, "sq", rows, n, "ss")
    src(f"pypto.set_vec_tile_shapes({min(rows, 256)}, 8)")
    src(f"one = pypto.full([{rows}, 1], 1.0, pypto.DT_FP32)")
    src(f"{out} = pypto.div(one, pypto.sqrt(pypto.add(pypto.div(ss, {float(n)!r}), {float(eps)!r})))")


def _pto_rope_rows(src: Src, r: str, rows: int, rd: int, c: str, s: str, out: str, inverse: bool = False) -> None:
    """`out` [rows, rd] = rope_il of the f32 rope part r [rows, rd] with f32 tables c, s ([1, rd] or [rows, rd]):
    r·c ± r[j^1]·s. The pair swap is data movement on the transposed rows: [rd, rows] → [rd/2, 2·rows] (row i =
    rows 2i, 2i+1) → swap the halves → back (exact)."""
    half = rd // 2
    w = _pto_align(rows, 8)
    src(f"pypto.set_vec_tile_shapes({rd}, {min(w, _PTO_T_TILE)})")
    src("rt = pypto.transpose(" + r + ", 0, 1)")
    src(f"pypto.set_vec_tile_shapes({half}, {_pto_align(2 * rows, 8)})")
    src(f"r2 = pypto.reshape(rt, [{half}, {2 * rows}])")
    src(f"sw2 = pypto.concat([pypto.view(r2, [{half}, {rows}], [0, {rows}]), "
        f"pypto.view(r2, [{half}, {rows}], [0, 0])], -1)")
    src(f"pypto.set_vec_tile_shapes({rd}, {w})")
    src(f"swt = pypto.reshape(sw2, [{rd}, {rows}])")
    src(f"pypto.set_vec_tile_shapes({min(rows, _PTO_T_TILE)}, {_pto_align(rd, 8)})")
    src("swp = pypto.transpose(swt, 0, 1)")
    op = "pypto.sub" if inverse else "pypto.add"
    src(f"{out} = {op}(pypto.mul({r}, {c}), pypto.mul(swp, {s}))")


def _pto_token_units(src: Src, t, unroll: int = 1):
    """One token per unit, `unroll` units per loop iteration (each its own forced subgraph, `sg_set_scope` id =
    the unit's place): the runtime's per-iteration cost is shared by `unroll` independent tasks. Whole groups,
    then the remaining tokens one per iteration. Yields the scope id of each unit body to emit, with `r0` set."""
    total = f"{t.name}.shape[0]" if t.is_dynamic(0) else str(t.shape[0])
    static = None if t.is_dynamic(0) else t.shape[0]
    src(f"rows = {total}")
    if unroll > 1 and (static is None or static >= unroll):
        with src.block(f"for blk in pypto.loop(0, rows // {unroll}, 1, name=\"rows_loop\", idx_name=\"blk\"):"):
            for u in range(unroll):
                src(f"r0 = blk * {unroll} + {u}")
                yield u + 1
    if unroll == 1 or static is None or static % unroll:
        start = f"rows // {unroll} * {unroll}" if unroll > 1 else "0"
        name = "tail_loop" if unroll > 1 else "rows_loop"
        with src.block(f"for r0 in pypto.loop({start}, rows, 1, name=\"{name}\", idx_name=\"r0\"):"):
            yield 1


def _pto_block_loops(src: Src, t, rows: int):
    """The row loops of templates whose blocks must be whole (no valid_shape: their math transposes and packs
    the block): `rows // R` full blocks of R = `rows` tokens, then the remaining tokens one at a time. Yields
    (block rows, row offset expression) once per loop body to emit."""
    total = f"{t.name}.shape[0]" if t.is_dynamic(0) else str(t.shape[0])
    static = None if t.is_dynamic(0) else t.shape[0]
    src(f"rows = {total}")
    if static is None or static >= rows:
        with src.block(f"for blk in pypto.loop(0, rows // {rows}, 1, name=\"rows_loop\", idx_name=\"blk\"):"):
            src(f"r0 = blk * {rows}")
            yield rows, "r0"
    if static is None or static % rows:
        with src.block(f"for r1 in pypto.loop(rows // {rows} * {rows}, rows, 1, name=\"tail_loop\", "
                       f"idx_name=\"r1\"):"):
            yield 1, "r1"


_PTO_ROPE_TABLE_ROWS = 32   # tokens per forced subgraph


@template(RopeTables)
def pypto_rope_tables(spec: KernelSpec) -> str:
    """cos_il / sin_signed [T, rd] bf16: the table rows at `positions` (index_select), the first rd/2 columns
    transposed to [rd/2, R], duplicated (cos) or [−s | s] (sin) side by side as [rd/2, 2R], which reshapes to
    the interleaved [rd, R] (row 2i, 2i+1 = column i twice), transposed back (pure data movement, exact).
    Whole blocks of R tokens, then the rest one at a time (the packing needs whole blocks)."""
    cos, sin, pos = spec.operands
    cos_il, sin_signed = spec.results
    rd = int(spec.attrs["rope_dim"])
    half = rd // 2
    src = Src(spec.signature())
    for r, r0 in _pto_block_loops(src, pos, _PTO_ROPE_TABLE_ROWS):
        w = _pto_align(r, 8)
        _pto_scope(src, 1)
        src(f"pypto.set_vec_tile_shapes({w})")
        src(f"pv = pypto.view({pos.name}, [{r}], [{r0}])")
        src(f"pypto.set_vec_tile_shapes({r}, {_pto_align(cos.shape[1])})")
        for name, table in (("c", cos), ("s", sin)):
            src(f"{name}f = {cast_expr(f'pypto.index_select({table.name}, 0, pv)', table.dtype, 'f32')}")
        src(f"pypto.set_vec_tile_shapes({half}, {w})")
        for name in ("c", "s"):
            src(f"{name}t = pypto.transpose(pypto.view({name}f, [{r}, {half}], [0, 0]), 0, 1)")
        src(f"pypto.set_vec_tile_shapes({half}, {_pto_align(2 * r, 8)})")
        src("cc = pypto.concat([ct, ct], -1)")
        src("ss = pypto.concat([pypto.neg(st), st], -1)")
        for name, target in (("cc", cos_il), ("ss", sin_signed)):
            src(f"pypto.set_vec_tile_shapes({rd}, {w})")
            src(f"{name}2 = pypto.reshape({name}, [{rd}, {r}])")
            src(f"pypto.set_vec_tile_shapes({r}, {_pto_align(rd)})")
            src(f"{name}o = {cast_expr(f'pypto.transpose({name}2, 0, 1)', 'f32', target.dtype)}")
            src(f"pypto.assemble({name}o, [{r0}, 0], {target.name})")
        _pto_scope(src, -1)
    return src.text()


_PTO_NORM_ROWS = 16   # rows per forced subgraph of the row-norm templates (whole blocks, then single rows)


def _pto_rms_norm_block(src: Src, x_arg, gamma, r: int, r0, eps: float, out: str) -> None:
    """`out` [r, n] = (x·inv_rms)·gamma in f32 for the r rows of `x_arg` at r0 (`x`: the block's view, `inv`:
    its 1/rms column). A block of whole 8-row groups in one tile whose width runs numpy's 8 accumulators over
    whole 128-blocks takes the qproj chains' sum (`_pto_qproj_inv_rms`: every view inside the UB; the generic
    `_pto_inv_rms_rows` regroups the block sums through global memory, ~11 k cycles at [16, 1024])."""
    n = x_arg.shape[1]
    _pto_tile2(src, r, n)
    src(f"x = pypto.view({x_arg.name}, [{r}, {n}], [{r0}, 0])")
    if _pto_qproj_width(n) and r % 8 == 0 and r * n <= _PTO_QPROJ_CHAIN:
        _pto_qproj_inv_rms(src, "x", r, n, eps, "inv")
    else:
        _pto_inv_rms_rows(src, "x", r, n, eps, "inv")
    _pto_tile2(src, r, n)
    src(f"g = {cast_expr(f'pypto.reshape({gamma.name}, [1, {n}])', gamma.dtype, 'f32')}")
    src(f"{out} = pypto.mul(pypto.mul(x, inv), g)")


@template(QrRmsNormQuant)
def pypto_qr_rms_norm_quant(spec: KernelSpec) -> str:
    """qn = (qa·inv)·gamma in f32, then q8 per row: amax = max(max|qn|, 1e-4), k = 127/amax (true division),
    qr = rint(qn·k) through int32 → fp16 → int8, scale = 1/k. Blocks of whole rows (the row sums:
    `_pto_rms_norm_block`), each one forced subgraph. Flash TP4 cost model: 8 tasks of 8.4 k cycles, 5.5 µs
    alone (12.4 with `_pto_row_sums`' regrouping of the block sums through global memory)."""
    qa, gamma = spec.operands
    qr, scale = spec.results
    n = qa.shape[1]
    eps = float(spec.attrs.get("eps", 1e-6))
    src = Src(spec.signature())
    for r, r0 in _pto_block_loops(src, qa, _PTO_NORM_ROWS):
        _pto_scope(src, 1)
        _pto_rms_norm_block(src, qa, gamma, r, r0, eps, "qn")
        src("amax = pypto.maximum(pypto.amax(pypto.abs(qn), -1, keepdim=True), 0.0001)")
        src(f"pypto.set_vec_tile_shapes({r}, 8)")
        src(f"k = pypto.div(pypto.full([{r}, 1], 127.0, pypto.DT_FP32), amax)")
        src(f"s = pypto.div(pypto.full([{r}, 1], 1.0, pypto.DT_FP32), k)")
        _pto_tile2(src, r, n)
        src(f"qv = {cast_expr('pypto.mul(qn, k)', 'f32', 'i8')}")
        src(f"pypto.assemble(qv, [{r0}, 0], {qr.name})")
        src(f"pypto.set_vec_tile_shapes({_pto_align(r, 8)})")
        src(f"pypto.assemble(pypto.reshape(s, [{r}]), [{r0}], {scale.name})")
        _pto_scope(src, -1)
    return src.text()


_PTO_QPROJ_UNROLL = 4    # tokens per loop iteration (one task each)
_PTO_QPROJ_CHAIN = 16384  # f32 elements of one head chain: a single 64 KiB tile per operand
_PTO_QPROJ_GROUP = 8      # tokens per task of the group body (8: every chain has a multiple of 8 rows)


def _pto_qproj_width(hd: int) -> bool:
    """numpy's pairwise order of width hd is 8 accumulators over whole 128-blocks: hd = 128·2^k, or hd ≤ 128
    and a multiple of 8."""
    nb = hd // 128
    return (hd % 128 == 0 and nb & (nb - 1) == 0) or (hd <= 128 and hd % 8 == 0)


def _pto_qproj_chain_heads(heads: int, hd: int, rd: int) -> int | None:
    """Heads per chain of the fast token body, or None when the shapes need the generic one. The fast body
    needs numpy's pairwise order of width hd to be 8 accumulators over whole 128-blocks (hd = 128·2^k, or
    hd ≤ 128 and a multiple of 8), chains of whole 8-head groups (its transposes) and the rope part at a
    32-byte aligned column (a view, not a copy)."""
    if not _pto_qproj_width(hd):
        return None
    if (hd - rd) % 8 or rd % 2:
        return None
    hg = next((d for d in range(min(heads, _PTO_QPROJ_CHAIN // hd), 0, -1) if heads % d == 0), 1)
    return hg if hg % 8 == 0 else None


def _pto_swap_index(src: Src, rd: int, name: str) -> None:
    """`name` = i32 [rd] holding j ^ 1 = j + 1 − 2·(j − 2·floor(j/2)) (f32 arithmetic on an arange, exact)."""
    _pto_set_tile(src, [max(rd, 8)])
    src(f"sj = pypto.cast(pypto.arange({rd}), pypto.DT_FP32)")
    src("sjo = pypto.sub(sj, pypto.mul(pypto.floor(pypto.mul(sj, 0.5)), 2.0))")
    src(f"{name} = {cast_expr('pypto.sub(pypto.add(sj, 1.0), pypto.mul(sjo, 2.0))', 'f32', 'i32')}")


def _pto_qproj_inv_rms(src: Src, q: str, hg: int, hd: int, eps: float, out: str) -> None:
    """`out` [hg, 1] = 1/sqrt(mean(q², -1) + eps) of the f32 chain q [hg, hd] (one tile), numpy's pairwise sum
    bitwise: the 8 accumulators of every 128-block side by side as adds of aligned [hg·nb, 8] column views of
    q² reshaped to [hg·nb, 128] (row h·nb + b); [hg·nb, 8] → [hg, 8·nb] → transposed to [8·nb, hg] (row b·8 + k)
    → [nb, 8·hg], so the 8-accumulator tree adds [nb, hg] column views and the block tree [1, hg] rows; 1/rms as
    a [1, hg] row, turned into the [hg, 1] column by an [8, hg] transpose. Every view stays inside its
    producer's tile (no copy through global memory)."""
    nb = max(1, hd // 128)
    width = min(hd, 128)
    c = hg * nb
    src(f"pypto.set_vec_tile_shapes({hg}, {hd})")
    src(f"sq = pypto.mul({q}, {q})")
    src(f"pypto.set_vec_tile_shapes({c}, {width})")
    src(f"sb = pypto.reshape(sq, [{c}, {width}])")
    src(f"pypto.set_vec_tile_shapes({c}, 8)")
    src(f"a8 = pypto.view(sb, [{c}, 8], [0, 0])")
    for i in range(8, width, 8):
        src(f"a8 = pypto.add(a8, pypto.view(sb, [{c}, 8], [0, {i}]))")
    src(f"pypto.set_vec_tile_shapes({hg}, {8 * nb})")
    src(f"a8t = pypto.transpose(pypto.reshape(a8, [{hg}, {8 * nb}]), 0, 1)")
    src(f"pypto.set_vec_tile_shapes({nb}, {8 * hg})")
    src(f"a4 = pypto.reshape(a8t, [{nb}, {8 * hg}])")
    k = [f"pypto.view(a4, [{nb}, {hg}], [0, {j * hg}])" for j in range(8)]
    src(f"pypto.set_vec_tile_shapes({nb}, {hg})")
    src(f"sk = pypto.add(pypto.add(pypto.add({k[0]}, {k[1]}), pypto.add({k[2]}, {k[3]})), "
        f"pypto.add(pypto.add({k[4]}, {k[5]}), pypto.add({k[6]}, {k[7]})))")
    src(f"pypto.set_vec_tile_shapes(1, {hg})")
    src(f"ssr = {_pto_balanced_sum(lambda j: f'pypto.view(sk, [1, {hg}], [{j}, 0])', 0, nb)}")
    src(f"invr = pypto.div(pypto.full([1, {hg}], 1.0, pypto.DT_FP32), "
        f"pypto.sqrt(pypto.add(pypto.div(ssr, {float(hd)!r}), {float(eps)!r})))")
    src(f"pypto.set_vec_tile_shapes(8, {hg})")
    src(f"inv8 = pypto.transpose(pypto.expand_clone(invr, [8, {hg}]), 0, 1)")
    src(f"pypto.set_vec_tile_shapes({hg}, 8)")
    src(f"{out} = pypto.view(inv8, [{hg}, 1], [0, 0])")


def _pto_qproj_token_chains(src: Src, spec: KernelSpec, hg: int) -> None:
    """One token (row r0) in chains of hg heads, each one tile [hg, hd] (`_pto_qproj_chain`), with the partner
    index j ^ 1 built once per token."""
    rd = spec.operands[3].shape[1]
    heads = spec.results[0].shape[1]
    _pto_swap_index(src, rd, "sji")
    src(f"pypto.set_vec_tile_shapes({hg}, {rd})")
    src(f"si = pypto.expand_clone(pypto.reshape(sji, [1, {rd}]), [{hg}, {rd}])")
    for g in range(heads // hg):
        # sa per chain: one [1, 1] read each, so no chain keeps the other's broadcast tile alive (a spill)
        src("pypto.set_vec_tile_shapes(1, 8)")
        src(f"sav = pypto.view(pypto.reshape({spec.operands[1].name}, [rows, 1], inplace=True), [1, 1], [r0, 0])")
        _pto_qproj_chain(src, spec, g, 1, hg, "sav", read_rope_rows=g == 0)


def _pto_qproj_chain(src: Src, spec: KernelSpec, g: int, lead: int, hg: int, scale: str,
                     read_rope_rows: bool = False) -> None:
    """Chain g of `lead` tokens from row r0, hg heads: one tile [lead, hg·hd] = [lead·hg, hd] (row t·hg + h).
    q = (f32(acc)·scale)·sw, inv_rms (`_pto_qproj_inv_rms`), the nope part cast and assembled, the rope part
    r·c + r[j ^ 1]·s with the partner by `pypto.gather` on the last axis (`si`; `cf`, `sf` the [lead·hg, rd]
    tables, or with `read_rope_rows` read here as the [lead, rd] rows of cos_il / sin_signed)."""
    acc, _, sw, cos_il, sin_signed = spec.operands
    out = spec.results[0]
    hd = out.shape[2]
    rd = cos_il.shape[1]
    nope = hd - rd
    rows, w = lead * hg, hg * hd
    src(f"pypto.set_vec_tile_shapes({lead}, {w})")
    src(f"x = {cast_expr(f'pypto.view({acc.name}, [{lead}, {w}], [r0, {g * w}])', acc.dtype, 'f32')}")
    src(f"swr = pypto.view(pypto.reshape({sw.name}, [1, {acc.shape[1]}]), [1, {w}], [0, {g * w}])")
    src(f"q2 = pypto.mul(pypto.mul(x, {scale}), swr)")
    src(f"pypto.set_vec_tile_shapes({rows}, {hd})")
    src(f"q = pypto.reshape(q2, [{rows}, {hd}])")
    _pto_qproj_inv_rms(src, "q", rows, hd, float(spec.attrs.get("eps", 1e-6)), "inv")
    src(f"pypto.set_vec_tile_shapes({rows}, {hd})")
    src("qn = pypto.mul(q, inv)")
    if nope:
        src(f"nb_ = {cast_expr(f'pypto.view(qn, [{rows}, {nope}], [0, 0])', 'f32', out.dtype)}")
        src(f"pypto.set_vec_tile_shapes({lead}, {hg}, {_pto_align(nope)})")
        src(f"pypto.assemble(pypto.reshape(nb_, [{lead}, {hg}, {nope}]), [r0, {g * hg}, 0], {out.name})")
    src(f"pypto.set_vec_tile_shapes({rows}, {rd})")
    if read_rope_rows:
        for name, t in (("cf", cos_il), ("sf", sin_signed)):
            src(f"{name} = {cast_expr(f'pypto.view({t.name}, [{lead}, {rd}], [r0, 0])', t.dtype, 'f32')}")
    src(f"rp = pypto.view(qn, [{rows}, {rd}], [0, {nope}])")
    src("ro = pypto.add(pypto.mul(rp, cf), pypto.mul(pypto.gather(rp, 1, si), sf))")
    src(f"rob = {cast_expr('ro', 'f32', out.dtype)}")
    src(f"pypto.set_vec_tile_shapes({lead}, {hg}, {_pto_align(rd)})")
    src(f"pypto.assemble(pypto.reshape(rob, [{lead}, {hg}, {rd}]), [r0, {g * hg}, {nope}], {out.name})")


def _pto_qproj_group_heads(heads: int, hd: int) -> int | None:
    """Heads per chain of the group body (the largest divisor of `heads` whose chain of G tokens fits one
    64 KiB tile), or None when not even one head does."""
    cap = _PTO_QPROJ_CHAIN // (_PTO_QPROJ_GROUP * hd)
    return _pto_divisor(heads, cap) if cap else None


def _pto_qproj_group_chains(src: Src, spec: KernelSpec, hg: int, chain_range: range | None = None) -> None:
    """G tokens from row r0 in chains of hg heads (`_pto_qproj_chain` with lead G), the per-token reads done once
    for the G tokens. The qr_scale column is spread over one 32-byte-aligned column per chain (an own view per
    chain: a view shared by the chains makes pypto keep its [G, hg·hd] broadcast alive across them, a spill); the
    cos/sin rows are repeated over the heads once ([G, rd] → [G, hg, rd] → [G·hg, rd]). `chain_range`: the chains
    to emit (default all of them)."""
    _, sa, _, cos_il, sin_signed = spec.operands
    heads = spec.results[0].shape[1]
    rd = cos_il.shape[1]
    g_ = _PTO_QPROJ_GROUP
    rows = g_ * hg
    chosen = chain_range if chain_range is not None else range(heads // hg)
    chains = len(chosen)
    _pto_swap_index(src, rd, "sji")
    src(f"pypto.set_vec_tile_shapes({rows}, {rd})")
    src(f"si = pypto.expand_clone(pypto.reshape(sji, [1, {rd}]), [{rows}, {rd}])")
    src(f"pypto.set_vec_tile_shapes({g_}, 8)")
    src(f"sav = pypto.view(pypto.reshape({sa.name}, [rows, 1], inplace=True), [{g_}, 1], [r0, 0])")
    src(f"pypto.set_vec_tile_shapes({g_}, {8 * chains})")
    src(f"sa8 = pypto.expand_clone(sav, [{g_}, {8 * chains}])")
    for name, t in (("cf", cos_il), ("sf", sin_signed)):
        src(f"pypto.set_vec_tile_shapes({g_}, {rd})")
        src(f"{name} = {cast_expr(f'pypto.view({t.name}, [{g_}, {rd}], [r0, 0])', t.dtype, 'f32')}")
        src(f"pypto.set_vec_tile_shapes({g_}, 1, {rd})")
        src(f"{name} = pypto.reshape({name}, [{g_}, 1, {rd}])")
        src(f"pypto.set_vec_tile_shapes({g_}, {hg}, {rd})")
        src(f"{name} = pypto.expand_clone({name}, [{g_}, {hg}, {rd}])")
        src(f"pypto.set_vec_tile_shapes({rows}, {rd})")
        src(f"{name} = pypto.reshape({name}, [{rows}, {rd}])")
    for i, g in enumerate(chosen):
        src(f"pypto.set_vec_tile_shapes({g_}, 8)")
        src(f"sac = pypto.view(sa8, [{g_}, 1], [0, {8 * i}])")
        _pto_qproj_chain(src, spec, g, g_, hg, "sac")


def _pto_qproj_parts(spec: KernelSpec, chains: int) -> list[range]:
    """The head chains of a token group split into one forced subgraph per part: one part, unless the task runs
    on `workers` cyclic workers (dequant-workers), whose count the token groups share: ceil(workers / groups)
    parts of nearly equal chain counts, so the task's pypto tasks fill the workers' lanes."""
    workers = int(spec.attrs.get("workers") or 0)
    groups = spec.operands[0].shape[0] // _PTO_QPROJ_GROUP
    if workers <= 1 or groups < 1:
        return [range(chains)]
    n = max(1, min(chains, -(-workers // groups)))
    cuts = [chains * i // n for i in range(n + 1)]
    return [range(a, b) for a, b in zip(cuts, cuts[1:])]


def _pto_qproj_token_rows(src: Src, spec: KernelSpec) -> None:
    """One token (row r0) for any shape: rank-2 math on q [H, hd] (the row sums by `_pto_row_sums`, the RoPE
    pair swap by `_pto_rope_rows`), tiles split as pypto likes (may go through global memory)."""
    acc, sa, sw, cos_il, sin_signed = spec.operands
    out = spec.results[0]
    _, heads, hd = out.shape
    n = acc.shape[1]
    rd = cos_il.shape[1]
    nope = hd - rd
    eps = float(spec.attrs.get("eps", 1e-6))
    src("pypto.set_vec_tile_shapes(8)")
    src(f"sav = pypto.reshape(pypto.view({sa.name}, [1], [r0]), [1, 1])")
    src(f"pypto.set_vec_tile_shapes(1, {_pto_align(rd)})")
    src(f"cf = {cast_expr(f'pypto.view({cos_il.name}, [1, {rd}], [r0, 0])', cos_il.dtype, 'f32')}")
    src(f"sf = {cast_expr(f'pypto.view({sin_signed.name}, [1, {rd}], [r0, 0])', sin_signed.dtype, 'f32')}")
    src(f"pypto.set_vec_tile_shapes(1, {_pto_align(min(n, 16384))})")
    src(f"x = {cast_expr(f'pypto.view({acc.name}, [1, {n}], [r0, 0])', acc.dtype, 'f32')}")
    src(f"q2 = pypto.mul(pypto.mul(x, sav), pypto.reshape({sw.name}, [1, {n}]))")
    _pto_tile2(src, heads, hd)
    src(f"q = pypto.reshape(q2, [{heads}, {hd}])")
    _pto_inv_rms_rows(src, "q", heads, hd, eps, "inv")
    _pto_tile2(src, heads, hd)
    src("qn = pypto.mul(q, inv)")
    if nope:
        src(f"nb_ = {cast_expr(f'pypto.view(qn, [{heads}, {nope}], [0, 0])', 'f32', out.dtype)}")
        src(f"pypto.set_vec_tile_shapes(1, {_pto_divisor(heads, 16384 // _pto_align(nope))}, {_pto_align(nope)})")
        src(f"pypto.assemble(pypto.reshape(nb_, [1, {heads}, {nope}]), [r0, 0, 0], {out.name})")
    src(f"pypto.set_vec_tile_shapes({min(heads, _PTO_T_TILE)}, {_pto_align(rd, 8)})")
    src(f"rp = pypto.view(qn, [{heads}, {rd}], [0, {nope}])")
    _pto_rope_rows(src, "rp", heads, rd, "cf", "sf", "ro")
    src(f"rob = {cast_expr('ro', 'f32', out.dtype)}")
    src(f"pypto.set_vec_tile_shapes(1, {min(heads, _PTO_T_TILE)}, {_pto_align(rd)})")
    src(f"pypto.assemble(pypto.reshape(rob, [1, {heads}, {rd}]), [r0, 0, {nope}], {out.name})")


@template(QprojDequantRmsNopeRope)
def pypto_qproj_dequant_rms_nope_rope(spec: KernelSpec) -> str:
    """q = (f32(acc)·qr_scale)·wq_b_scale → [H, hd] per token; q·inv_rms per head; RoPE on the last rd dims;
    one bf16 rounding (nope and rope parts assembled separately).

    Shapes `_pto_qproj_chain_heads` accepts run in chains of whole 64 KiB tiles without any copy through global
    memory: groups of G = 8 tokens as one forced subgraph each (`_pto_qproj_group_chains`), the remaining tokens
    one per subgraph (`_pto_qproj_token_chains`); the others one token per subgraph, 4 per loop iteration, as
    rank-2 [H, hd] math (`_pto_qproj_token_rows`). Every tensor is read inside the subgraph (a shared reshape of
    wq_b_scale outside the loop was a task with all T token tasks as successors: the AICPU resolves each edge
    serially, ~50 k cycles at T = 128). Flash TP4 cost model: 16 tasks of 82.7 k cycles, vector-bound (the
    token body: 128 tasks of 18.6 k, each waiting on its own qr_scale / cos / sin / wq_b_scale copies of
    ~1.4 k cycles fixed cost), 46.5 µs alone (token body 83, before it 194)."""
    acc, _, _, cos_il, _ = spec.operands
    _, heads, hd = spec.results[0].shape
    hg = _pto_qproj_chain_heads(heads, hd, cos_il.shape[1])
    gh = None if hg is None else _pto_qproj_group_heads(heads, hd)
    src = Src(spec.signature())
    if gh is not None:
        parts = _pto_qproj_parts(spec, heads // gh)
        for r, r0 in _pto_block_loops(src, acc, _PTO_QPROJ_GROUP):
            if r > 1:
                for scope, chains in enumerate(parts, 1):
                    _pto_scope(src, scope)
                    _pto_qproj_group_chains(src, spec, gh, chains)
                    _pto_scope(src, -1)
            else:
                _pto_scope(src, 1)
                src(f"r0 = {r0}")
                _pto_qproj_token_chains(src, spec, hg)
                _pto_scope(src, -1)
        return src.text()
    for unit in _pto_token_units(src, acc, _PTO_QPROJ_UNROLL):
        _pto_scope(src, unit)
        if hg is None:
            _pto_qproj_token_rows(src, spec)
        else:
            _pto_qproj_token_chains(src, spec, hg)
        _pto_scope(src, -1)
    return src.text()


@template(KvRmsNormRope)
def pypto_kv_rms_norm_rope(spec: KernelSpec) -> str:
    """kv = rope((ka·inv)·gamma), one bf16 rounding (nope and rope parts assembled separately). Blocks of whole
    rows as one forced subgraph each: rank-2 math (`_pto_rms_norm_block`; the pair swap by a gather on whole
    8-row blocks, else `_pto_rope_rows`). Flash TP4 cost model 9.9 → 4.4 µs alone."""
    ka, gamma, cos_il, sin_signed = spec.operands
    out = spec.results[0]
    n = ka.shape[1]
    rd = cos_il.shape[1]
    nope = n - rd
    eps = float(spec.attrs.get("eps", 1e-6))
    src = Src(spec.signature())
    for r, r0 in _pto_block_loops(src, ka, _PTO_NORM_ROWS):
        _pto_scope(src, 1)
        _pto_rms_norm_block(src, ka, gamma, r, r0, eps, "kn")
        if nope:
            src(f"np_ = {cast_expr(f'pypto.view(kn, [{r}, {nope}], [0, 0])', 'f32', out.dtype)}")
            src(f"pypto.assemble(np_, [{r0}, 0], {out.name})")
        src(f"pypto.set_vec_tile_shapes({r}, {_pto_align(rd)})")
        for name, t in (("cb", cos_il), ("sb", sin_signed)):
            src(f"{name} = {cast_expr(f'pypto.view({t.name}, [{r}, {rd}], [{r0}, 0])', t.dtype, 'f32')}")
        src(f"rp = pypto.view(kn, [{r}, {rd}], [0, {nope}])")
        if r % 8 == 0 and nope % 8 == 0:   # the pair swap by a gather (the transposed row swap goes through GM)
            _pto_swap_index(src, rd, "sji")
            src(f"pypto.set_vec_tile_shapes({r}, {_pto_align(rd)})")
            src(f"si = pypto.expand_clone(pypto.reshape(sji, [1, {rd}]), [{r}, {rd}])")
            src("ro = pypto.add(pypto.mul(rp, cb), pypto.mul(pypto.gather(rp, 1, si), sb))")
        else:
            _pto_rope_rows(src, "rp", r, rd, "cb", "sb", "ro")
        src(f"ro_ = {cast_expr('ro', 'f32', out.dtype)}")
        src(f"pypto.assemble(ro_, [{r0}, {nope}], {out.name})")
        _pto_scope(src, -1)
    return src.text()

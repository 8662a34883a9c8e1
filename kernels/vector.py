"""Vector-side building blocks of the pypto 0.2.0 templates, shared by the kernel families.

Each helper emits pypto source into a `Src` (kernels/pto.py). A helper that defines a variable of the generated
code for its caller takes that variable's name as an argument (`out`, `name`) or returns it; the other names it
writes (`sq`, `inv`, ...) are its own temporaries, which a caller must not rely on.

* Tiles and scopes: `pto_set_tile`, `pto_tile` (set and return a vec tile), `pto_scope` / `pto_fusible` (forced
  subgraphs), `pto_divisor`, `pto_align`.
* Numpy's float32 order, bitwise: `pto_pairwise_tree` (numpy's pairwise_sum recursion on any "element" view),
  `pto_pairwise_sum` / `pto_inv_rms` on rank-3/4 row blocks (`PtoBlock`), `pto_row_sums` / `pto_inv_rms_rows` /
  `pto_qproj_inv_rms` / `pto_rms_norm_block` on rank-2 tensors, `pto_balanced_sum`.
* Interleaved RoPE by data movement: `pto_rope` / `pto_pair_swap` (rank-3/4), `pto_rope_rows` (rank-2),
  `pto_swap_index`.
* Row loops of whole blocks: `pto_token_units`, `pto_block_loops`.
* Index arithmetic on f32 tensors (compressor / indexer / sparse): `pto_ramp`, `pto_cols_of`, `pto_token_table_rows`,
  `PTO_NEG_INF`.

Two sets of helpers. The block helpers (`PtoBlock`, `pto_pairwise_sum`, `pto_rope`, ...) work on rank-3/4
[rows, heads, ...] tiles with narrow views. The qkv family's templates use the rank-2 helpers (`pto_tile2`,
`pto_row_sums`, `pto_rope_rows`, ...): pypto 0.2.0's cost model charges narrow views of rank-3/4 tiles,
last-dim-1 columns and per-op task chains heavily, while rank-2 reshapes and transposes of contiguous data are
cheap. So a reduced axis is moved to the rows by a transpose and numpy's order runs as adds of whole [8, C] /
[1, C] row views, a pair swap is a row swap of the transposed rope part, and every token (or block of whole
rows) is one forced subgraph (`sg_set_scope`).

What the cost model charges inside a task (read from its per-pipe logs): one MTE_IN pipe per core runs every
copy into the UB one after the other, ~1.4 k cycles each plus ~95 B/cycle; a view or reshape stays in the UB
only if its tile lies inside one tile of its producer and starts 32-byte aligned (a [rows, 1] column view or
a reshape between differently padded layouts goes out to global memory and back, once per consumer); a
binary op on 64 KiB tiles fills the 192 KiB UB (anything else live spills); a task that many tasks depend
on costs the AICPU ~390 cycles per dependent, serially; the `alone µs` of a kernel is its summed task time
over its IR blocks, so busy time stalled on copies counts.
"""
from __future__ import annotations

from dspark_ir.semantics.compressor import FP32_NEG_INF

from .pto import RowLoop, Src, cast_expr, py_list, vec_tile


def pto_set_tile(src: Src, shape) -> None:
    src(f"pypto.set_vec_tile_shapes({', '.join(str(int(s)) for s in shape)})")


PTO_FUSE_MAX_ELEMS = 4 * 4096  # a block of ≤ 4 vector tiles (16 KiB of f32 each) runs as one subgraph


def pto_fusible(block_elems: int) -> bool:
    """Fuse a row block's vector chain into one subgraph only when the block is small: fusing removes the
    per-chain cost (tiny: kv_rms_norm_rope 76 k → 35 k cycles) but serialises a large block's tiles on one core
    (flash qproj_dequant_rms_nope_rope 2.7 M → 5.2 M cycles, merge_norm 1.4 M → 3.5 M)."""
    return block_elems <= PTO_FUSE_MAX_ELEMS


def pto_scope(src: Src, scope: int, fuse: bool = True) -> None:
    """Open (scope > 0) or close (−1) a forced subgraph (`sg_set_scope`): the vector ops between become one
    task chain instead of one per op. Never around cube ops; never across a pypto.loop boundary."""
    if fuse:
        src(f"pypto.set_pass_options(sg_set_scope={scope})")


class PtoBlock:
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


def pto_divisor(extent: int, cap: int) -> int:
    """The largest divisor of `extent` not above `cap`, so tiles split a block into equal parts."""
    cap = max(1, min(extent, cap))
    return next(d for d in range(cap, 0, -1) if extent % d == 0)


def _pto_lead_tile(lead, budget_elems: int = 2048) -> list[int]:
    """A tile for the leading dims of [*lead, w ≤ 8] tensors: inner dims whole, rows as the budget allows."""
    tile = [1] * len(lead)
    room = budget_elems
    for i in range(len(lead) - 1, -1, -1):
        tile[i] = pto_divisor(lead[i], room)
        room = max(1, room // tile[i])
    return tile


def pto_namer(tag: str):
    """fresh() -> `tag1`, `tag2`, ...: the temporaries of one emitted reduction."""
    counter = [0]

    def fresh() -> str:
        counter[0] += 1
        return f"{tag}{counter[0]}"
    return fresh


def pto_pairwise_tree(src: Src, fresh, view, x: str, off: int, m: int) -> str:
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
    a = pto_pairwise_tree(src, fresh, view, x, off, half)
    b = pto_pairwise_tree(src, fresh, view, x, off + half, m - half)
    src(f"{res} = pypto.add({a}, {b})")
    return res


def pto_pairwise_sum(blk: PtoBlock, x: str, lead, n: int, out: str, wide_tile, tag: str = "ps",
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
    fresh = pto_namer(tag)

    def view(t: str, off: int, k: int) -> str:
        return blk.sub(t, lead, zeros + [off], k)

    def block(off: int, m: int) -> str:
        return pto_pairwise_tree(src, fresh, view, x, off, m)

    def blocks128(nb: int) -> str:
        """n = 128·nb with nb a power of two: numpy halves down to nb equal 128-blocks, so their 8-wide
        accumulators run side by side on a [*lead, nb, 128] reshape, then the blocks add as a balanced tree."""
        shape4 = list(lead) + [nb, 128]
        pto_set_tile(src, _pto_lead_tile(lead, max(1, 2048 // (nb * 8))) + [nb, 128])
        xr, acc, bs = fresh(), fresh(), fresh()
        src(f"{xr} = {blk.reshape(x, shape4)}")
        sub_tile = _pto_lead_tile(lead, max(1, 2048 // (nb * 8))) + [nb, 8]
        pto_set_tile(src, sub_tile)

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
        pto_set_tile(src, _pto_lead_tile(lead) + [1, 8])
        flat = fresh()
        src(f"{flat} = {blk.reshape(res, list(lead) + [1])}")
        return flat

    assert rank >= 2
    nb = n // 128
    if side_by_side and n % 128 == 0 and nb >= 2 and nb & (nb - 1) == 0:
        src(f"{out} = {blocks128(nb)}")
    else:
        pto_set_tile(src, narrow)
        src(f"{out} = {block(0, n)}")
    pto_set_tile(src, wide_tile)


# ---- rank-2 helpers (see the section header) -------------------------------------------------------------------
PTO_T_TILE = 64          # the column tile of the transposes (the UB holds ~3 transpose tiles)


def pto_align(width: int, elems: int = 16) -> int:
    """A tile's last dim: `width` rounded up to whole 32-byte blocks for 2-byte operands (≥ 16 elements)."""
    return max(elems, -(-width // elems) * elems)


def pto_tile2(src: Src, rows: int, width: int, budget: int = 16384) -> None:
    """A rank-2 vector tile for [rows, width] f32 tensors: the width whole (aligned), rows as the element
    budget allows (≥ 1)."""
    w = pto_align(width)
    src(f"pypto.set_vec_tile_shapes({max(1, min(rows, budget // w))}, {w})")


def _pto_pairwise_rows(src: Src, x_t: str, n: int, cols: int, tag: str) -> str:
    """numpy's float32 pairwise sum over the ROWS of the f32 tensor `x_t` [n, cols] (each column one reduced
    vector): returns the name of a [1, cols] row. Every "element" of numpy's recursion is a [1, cols] row."""
    fresh = pto_namer(tag)

    def rows(t: str, off: int, k: int) -> str:
        return f"pypto.view({t}, [{k}, {cols}], [{off}, 0])"

    def block(off: int, m: int) -> str:
        return pto_pairwise_tree(src, fresh, rows, x_t, off, m)

    src(f"pypto.set_vec_tile_shapes(8, {pto_align(min(cols, 2048), 8)})")
    return block(0, n)


def pto_balanced_sum(leaf, lo: int, hi: int) -> str:
    """The expression adding leaf(lo) … leaf(hi − 1) as a balanced tree (halves split at the midpoint): numpy's
    order for the 128-blocks of a pairwise sum."""
    if hi - lo == 1:
        return leaf(lo)
    mid = (lo + hi) // 2
    return f"pypto.add({pto_balanced_sum(leaf, lo, mid)}, {pto_balanced_sum(leaf, mid, hi)})"


def pto_row_sums(src: Src, x: str, rows: int, n: int, out: str, tag: str = "pw") -> None:
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
        src(f"pypto.set_vec_tile_shapes(128, {pto_align(min(cols, PTO_T_TILE), 8)})")
        src(f"{tag}_t = pypto.transpose({blocks}, 0, 1)")
        lanes = _pto_pairwise_rows(src, f"{tag}_t", 128, cols, tag)
        src(f"pypto.set_vec_tile_shapes({min(rows, 256)}, 8)")
        if nb == 1:
            src(f"{out} = pypto.reshape({lanes}, [{rows}, 1])")
            return
        src(f"{tag}_c = pypto.reshape({lanes}, [{rows}, {nb}])")
        src(f"{out} = {pto_balanced_sum(lambda j: f'pypto.view({tag}_c, [{rows}, 1], [0, {j}])', 0, nb)}")
        return
    src(f"pypto.set_vec_tile_shapes({min(pto_align(n, 8), 128)}, {pto_align(min(rows, PTO_T_TILE), 8)})")
    src(f"{tag}_t = pypto.transpose({x}, 0, 1)")
    total = _pto_pairwise_rows(src, f"{tag}_t", n, rows, tag)
    src(f"pypto.set_vec_tile_shapes({min(rows, 256)}, 8)")
    src(f"{out} = pypto.reshape({total}, [{rows}, 1])")


def pto_inv_rms_rows(src: Src, x: str, rows: int, n: int, eps: float, out: str) -> None:
    """`out` [rows, 1] = 1/sqrt(mean(x², -1) + eps) like `_inv_rms` (np.mean: pairwise sum / n), x [rows, n]."""
    pto_tile2(src, rows, n)
    src(f"sq = pypto.mul({x}, {x})")
    pto_row_sums(src, "sq", rows, n, "ss")
    src(f"pypto.set_vec_tile_shapes({min(rows, 256)}, 8)")
    src(f"one = pypto.full([{rows}, 1], 1.0, pypto.DT_FP32)")
    src(f"{out} = pypto.div(one, pypto.sqrt(pypto.add(pypto.div(ss, {float(n)!r}), {float(eps)!r})))")


def pto_rope_rows(src: Src, r: str, rows: int, rd: int, c: str, s: str, out: str, inverse: bool = False) -> None:
    """`out` [rows, rd] = rope_il of the f32 rope part r [rows, rd] with f32 tables c, s ([1, rd] or [rows, rd]):
    r·c ± r[j^1]·s. The pair swap is data movement on the transposed rows: [rd, rows] → [rd/2, 2·rows] (row i =
    rows 2i, 2i+1) → swap the halves → back (exact)."""
    half = rd // 2
    w = pto_align(rows, 8)
    src(f"pypto.set_vec_tile_shapes({rd}, {min(w, PTO_T_TILE)})")
    src("rt = pypto.transpose(" + r + ", 0, 1)")
    src(f"pypto.set_vec_tile_shapes({half}, {pto_align(2 * rows, 8)})")
    src(f"r2 = pypto.reshape(rt, [{half}, {2 * rows}])")
    src(f"sw2 = pypto.concat([pypto.view(r2, [{half}, {rows}], [0, {rows}]), "
        f"pypto.view(r2, [{half}, {rows}], [0, 0])], -1)")
    src(f"pypto.set_vec_tile_shapes({rd}, {w})")
    src(f"swt = pypto.reshape(sw2, [{rd}, {rows}])")
    src(f"pypto.set_vec_tile_shapes({min(rows, PTO_T_TILE)}, {pto_align(rd, 8)})")
    src("swp = pypto.transpose(swt, 0, 1)")
    op = "pypto.sub" if inverse else "pypto.add"
    src(f"{out} = {op}(pypto.mul({r}, {c}), pypto.mul(swp, {s}))")


def pto_token_units(src: Src, t, unroll: int = 1):
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


def pto_block_loops(src: Src, t, rows: int):
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


PTO_QPROJ_CHAIN = 16384  # f32 elements of one head chain: a single 64 KiB tile per operand


def pto_qproj_width(hd: int) -> bool:
    """numpy's pairwise order of width hd is 8 accumulators over whole 128-blocks: hd = 128·2^k, or hd ≤ 128
    and a multiple of 8."""
    nb = hd // 128
    return (hd % 128 == 0 and nb & (nb - 1) == 0) or (hd <= 128 and hd % 8 == 0)


def pto_qproj_inv_rms(src: Src, q: str, hg: int, hd: int, eps: float, out: str) -> None:
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
    src(f"ssr = {pto_balanced_sum(lambda j: f'pypto.view(sk, [1, {hg}], [{j}, 0])', 0, nb)}")
    src(f"invr = pypto.div(pypto.full([1, {hg}], 1.0, pypto.DT_FP32), "
        f"pypto.sqrt(pypto.add(pypto.div(ssr, {float(hd)!r}), {float(eps)!r})))")
    src(f"pypto.set_vec_tile_shapes(8, {hg})")
    src(f"inv8 = pypto.transpose(pypto.expand_clone(invr, [8, {hg}]), 0, 1)")
    src(f"pypto.set_vec_tile_shapes({hg}, 8)")
    src(f"{out} = pypto.view(inv8, [{hg}, 1], [0, 0])")


def pto_swap_index(src: Src, rd: int, name: str) -> None:
    """`name` = i32 [rd] holding j ^ 1 = j + 1 − 2·(j − 2·floor(j/2)) (f32 arithmetic on an arange, exact)."""
    pto_set_tile(src, [max(rd, 8)])
    src(f"sj = pypto.cast(pypto.arange({rd}), pypto.DT_FP32)")
    src("sjo = pypto.sub(sj, pypto.mul(pypto.floor(pypto.mul(sj, 0.5)), 2.0))")
    src(f"{name} = {cast_expr('pypto.sub(pypto.add(sj, 1.0), pypto.mul(sjo, 2.0))', 'f32', 'i32')}")


def pto_rms_norm_block(src: Src, x_arg, gamma, r: int, r0, eps: float, out: str) -> None:
    """`out` [r, n] = (x·inv_rms)·gamma in f32 for the r rows of `x_arg` at r0 (`x`: the block's view, `inv`:
    its 1/rms column). A block of whole 8-row groups in one tile whose width runs numpy's 8 accumulators over
    whole 128-blocks takes the qproj chains' sum (`pto_qproj_inv_rms`: every view inside the UB; the generic
    `pto_inv_rms_rows` regroups the block sums through global memory, ~11 k cycles at [16, 1024])."""
    n = x_arg.shape[1]
    pto_tile2(src, r, n)
    src(f"x = pypto.view({x_arg.name}, [{r}, {n}], [{r0}, 0])")
    if pto_qproj_width(n) and r % 8 == 0 and r * n <= PTO_QPROJ_CHAIN:
        pto_qproj_inv_rms(src, "x", r, n, eps, "inv")
    else:
        pto_inv_rms_rows(src, "x", r, n, eps, "inv")
    pto_tile2(src, r, n)
    src(f"g = {cast_expr(f'pypto.reshape({gamma.name}, [1, {n}])', gamma.dtype, 'f32')}")
    src(f"{out} = pypto.mul(pypto.mul(x, inv), g)")


PTO_NEG_INF = float(FP32_NEG_INF)      # padding of score rows / empty state rows


def pto_tile(src: Src, shape, itemsize: int = 4) -> list[int]:
    """Set (and return) a vector tile for a tensor of `shape` (32-byte last dim, ~16 KiB)."""
    tile = vec_tile(tuple(int(s) for s in shape), itemsize)
    pto_set_tile(src, tile)
    return tile


def pto_ramp(src: Src, n: int, name: str = "ramp") -> None:
    """`name` = f32 [n] holding 0 … n−1 (1-D: a reshaped arange trips InferParamIndex's pass-verify)."""
    pto_set_tile(src, [max(8, min(n, 4096))])
    src(f"{name} = pypto.cast(pypto.arange({n}), pypto.DT_FP32)")


def pto_cols_of(src: Src, ramp: str, start: str, width: int, name: str) -> None:
    """`name` = f32 [1, width] holding start … start+width−1 (a view of the ramp). Leaves a [1, width] tile set."""
    pto_set_tile(src, [max(8, min(width, 4096))])
    src(f"{name}_s = pypto.view({ramp}, [{width}], [{start}])")
    pto_set_tile(src, vec_tile((1, width), 4))
    src(f"{name} = pypto.reshape({name}_s, [1, {width}])")


def pto_token_table_rows(src: Src, table, batch: int, seq: int) -> str:
    """f32 [batch·seq, pages]: every token's copy of its request's block-table row (for a gather by page); returns
    its name (`tbt`; temporaries tbf, tb3)."""
    pages = table.shape[1]
    t_n = batch * seq
    pto_set_tile(src, [batch, max(pages, 8)])
    src(f"tbf = {cast_expr(table.name, table.dtype, 'f32')}")
    pto_set_tile(src, [batch, seq, max(pages, 8)])
    src(f"tb3 = pypto.expand_clone(pypto.reshape(tbf, [{batch}, 1, {pages}]), [{batch}, {seq}, {pages}])")
    src(f"tbt = pypto.reshape(tb3, [{t_n}, {pages}])")
    return "tbt"

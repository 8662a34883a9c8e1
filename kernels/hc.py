"""pypto 0.2.0 templates of the hc kernel family (the ops' numpy semantics: dspark_ir/semantics/hc.py)."""
from __future__ import annotations

# ---- pypto 0.2.0 template ------------------------------------------------------------------------
# Source generators for the lowering (see kernels/pto.py). They mirror the references above: stream
# and column views instead of reshapes of the whole residual, the same summation order over K chunks,
# splits and streams. Row sums and the cube accumulate in pypto's own order inside a chunk/split, so f32
# results agree to rounding (not bit for bit) where the reference fixes an order pypto cannot express.
# Shaped for pypto 0.2.0's cost model (see kernels/vector.py's notes): the per-token n×n / 2n
# quantities (split_pre_post, comb_sinkhorn) are transposed so the tokens are the wide last dim, and a block
# of rows or one token runs as one forced subgraph. Flash TP4 cost-model µs, before → after: comb_sinkhorn
# 1368 → 18 → 12.6, hc_post 300 → 34 → 14, hc_pre_linear 89 → 52 → 19 (atomic form 67 → 23), hc_pre_rms
# 74 → 22 → 12.3, mix_x 42 → 13 → 10.5, split_pre_post 41 → 14 → 6.8.
from dspark_ir.hardware import HARDWARE
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

from .norm import pto_rmsnorm_rows
from .pto import L0A_BYTES, KernelSpec, RowLoop, Src, cast_expr, py_list, row_block, vec_tile
from .registry import template
from .vector import pto_block_loops, pto_scope, pto_token_units

_PTO_TOKEN_BLOCK = 16   # tokens per block where the tokens are the (wide) last dim of every op


def _pto_valid(loop: RowLoop, *rest) -> str:
    """`, valid_shape=[valid, ...]` for a block view/reshape when the block may be partial."""
    if not (loop.looped and loop.partial):
        return ""
    return f", valid_shape={py_list(['valid'] + [str(r) for r in rest])}"


def _pto_r0(loop: RowLoop) -> str:
    return "r0" if loop.looped else "0"


def _pto_tile(src: Src, shape) -> None:
    src(f"pypto.set_vec_tile_shapes({', '.join(map(str, shape))})")


def _pto_stream_cols(loop: RowLoop, var: str, x, stream: int, start: int, width: int, tile2d) -> None:
    """`var` = columns [start, start+width) of stream `stream` of x[T, n, D] for the block, as [rows, width].

    pypto 0.2.0 needs the view and the 3-D → 2-D reshape under a rank-3 vec tile, then the rank-2 tile back.
    """
    br = loop.shape(x)[0]
    _pto_tile(loop.src, (tile2d[0], 1, tile2d[1]))
    view = (f"pypto.view({x.name}, [{br}, 1, {width}], [{_pto_r0(loop)}, {stream}, {start}]"
            f"{_pto_valid(loop, 1, width)})")
    loop.src(f"{var} = pypto.reshape({view}, [{br}, {width}]{_pto_valid(loop, width)})")
    _pto_tile(loop.src, tile2d)


def _pto_k_cols(loop: RowLoop, var: str, x, k0: int, width: int, tile2d) -> None:
    """`var` = columns [k0, k0+width) of the flattened row x[t, :] (n·D wide), as [rows, width]."""
    d = x.shape[2]
    first, last = k0 // d, (k0 + width - 1) // d
    if first == last:
        _pto_stream_cols(loop, var, x, first, k0 % d, width, tile2d)
        return
    assert k0 % d == 0 and width % d == 0, "a K slice must cover whole streams or lie inside one"
    names = []
    for s in range(first, last + 1):
        _pto_stream_cols(loop, f"{var}_{s}", x, s, 0, d, tile2d)
        names.append(f"{var}_{s}")
    loop.src(f"{var} = pypto.concat([{', '.join(names)}], -1)")


def _pto_col(loop: RowLoop, var: str, t, index: tuple[int, ...], tile2d) -> None:
    """`var` = one column t[:, i] (or t[:, i, j]) for the block, as [rows, 1]."""
    br = loop.shape(t)[0]
    shape = [br] + [1] * len(index)
    view = (f"pypto.view({t.name}, {py_list(shape)}, {py_list([_pto_r0(loop)] + list(index))}"
            f"{_pto_valid(loop, *([1] * len(index)))})")
    if len(index) == 1:
        loop.src(f"{var} = {view}")
        return
    _pto_tile(loop.src, (tile2d[0], 1, 8))
    loop.src(f"{var} = pypto.reshape({view}, [{br}, 1]{_pto_valid(loop, 1)})")
    _pto_tile(loop.src, tile2d)


def _pto_store_rows(loop: RowLoop, value: str, out, br: int) -> None:
    """Write a [rows, 1] block result into a rank-1 output [T]."""
    loop.src(f"flat = pypto.reshape({value}, [{br}]{_pto_valid(loop)})")
    loop.src(f"pypto.set_vec_tile_shapes({max(br, 8)})")
    loop.store("flat", out)


_PTO_PRE_RMS_ROWS = 16   # at most this many rows per forced subgraph


_PTO_VECTOR_CORES = HARDWARE.vector_cores


def _pto_rows_per_block(spec: KernelSpec, t, cap: int) -> int:
    """Rows per forced subgraph (at most `cap`): T over the lanes the schedule runs the kernel's B blocks on
    (B / ceil(B / 48): it charges each block work / B, ceil(B / 48) blocks per lane), so the pypto tasks fill
    those lanes once without the per-task cost of smaller tasks. Flash hc_pre_rms (B = 16): 16 rows per task
    21.6 µs, 8 → 12.3, 4 → 15.6; mix_x (B = 64): 8 → 18.8, 4 → 10.5, 3 → 12.0; hc_post (B = 128): 1 → 24.9,
    3 → 14.3, 4 → 21.4."""
    blocks = max(1, spec.blocks)
    return max(1, min(cap, -(-t.shape[0] * -(-blocks // _PTO_VECTOR_CORES) // blocks)))


@template(HcPreRms)
def pypto_hc_pre_rms(spec: KernelSpec) -> str:
    """inv_rms per row: the block's squares [R, n, D] reshaped to [R·K/c, c] (one row per K-chunk of c = the
    tile's width), summed per chunk, then the chunk sums [R, K/c] transposed to [K/c, R] and added in chunk
    order as [1, R] rows (the reference's order over chunks), 1/sqrt(ss/K + eps). Whole blocks of R rows
    (`_pto_rows_per_block`) as one forced subgraph each, then single rows."""
    x = spec.operands[0]
    out = spec.results[0]
    _, n, d = x.shape
    k = n * d
    tile = spec.attrs.get("tile") or (8, k)
    chunk = int(tile[1])
    eps = float(spec.attrs.get("eps", 1e-6))
    if k % chunk:
        return _pypto_hc_pre_rms_rows(spec, int(tile[0]), chunk, eps)
    nc = k // chunk
    src = Src(spec.signature())
    for r, r0 in pto_block_loops(src, x, _pto_rows_per_block(spec, x, _PTO_PRE_RMS_ROWS)):
        pto_scope(src, 1)
        src(f"pypto.set_vec_tile_shapes(1, {n}, {min(d, max(8, 16384 // n))})")
        src(f"xv = pypto.view({x.name}, [{r}, {n}, {d}], [{r0}, 0, 0])")
        src("sq = pypto.mul(xv, xv)")
        src(f"pypto.set_vec_tile_shapes({max(1, min(r * nc, 16384 // chunk))}, {min(chunk, 16384)})")
        src(f"cs = pypto.sum(pypto.reshape(sq, [{r * nc}, {chunk}]), -1, keepdim=True)")
        tw = max(8, -(-r // 8) * 8)
        if nc > 1:
            src(f"pypto.set_vec_tile_shapes({r}, {max(8, -(-nc // 8) * 8)})")
            src(f"c2 = pypto.reshape(cs, [{r}, {nc}])")
            src(f"pypto.set_vec_tile_shapes({nc}, {tw})")
            src("ct = pypto.transpose(c2, 0, 1)")
            src(f"ss = pypto.view(ct, [1, {r}], [0, 0])")
            for j in range(1, nc):
                src(f"ss = pypto.add(ss, pypto.view(ct, [1, {r}], [{j}, 0]))")
        else:
            src(f"pypto.set_vec_tile_shapes(1, {tw})")
            src(f"ss = pypto.reshape(cs, [1, {r}])")
        src(f"one = pypto.full([1, {r}], 1.0, pypto.DT_FP32)")
        src(f"inv = pypto.div(one, pypto.sqrt(pypto.add(pypto.div(ss, {float(k)!r}), {eps!r})))")
        src(f"pypto.set_vec_tile_shapes({tw})")
        src(f"pypto.assemble(pypto.reshape(inv, [{r}]), [{r0}], {out.name})")
        pto_scope(src, -1)
    return src.text()


def _pypto_hc_pre_rms_rows(spec: KernelSpec, rows: int, chunk: int, eps: float) -> str:
    """The row-block form (K-chunks that do not divide K): per chunk a stream view, squares, row sum."""
    x = spec.operands[0]
    out = spec.results[0]
    _, n, d = x.shape
    k = n * d
    src = Src(spec.signature())
    loop = RowLoop(src, x, rows)
    br = loop.shape(x)[0]
    tile2d = vec_tile((br, min(chunk, 2048)), 4)
    with loop.loop():
        _pto_tile(src, tile2d)
        for j, k0 in enumerate(range(0, k, chunk)):
            _pto_k_cols(loop, "xc", x, k0, min(chunk, k - k0), tile2d)
            src("sq = pypto.sum(pypto.mul(xc, xc), -1, keepdim=True)")
            src("ss = sq" if j == 0 else "ss = pypto.add(ss, sq)")
        valid = "valid" if loop.looped and loop.partial else str(br)
        src(f"one = pypto.full([{br}, 1], 1.0, pypto.DT_FP32, valid_shape=[{valid}, 1])")
        src(f"inv = pypto.div(one, pypto.sqrt(pypto.add(pypto.div(ss, {float(k)!r}), {eps!r})))")
        _pto_store_rows(loop, "inv", out, br)
    return src.text()


def _pto_split_bounds(k: int, splits: int) -> list[tuple[int, int]]:
    step = k // splits
    return [(s * step, (s + 1) * step) for s in range(splits)]


_PTO_LINEAR_ROWS = 32   # rows per block: the cube's M tile (the IR's 16-row tile re-streamed hc_fn twice as often)
_PTO_L1_BYTES = HARDWARE.l1_bytes  # L1: the A and B slices of one L1 k tile (single-buffered; beyond it pypto spills)


def _pto_linear_cube(m: int, k: int, n: int) -> str:
    """f32 cube tiles for [m, k]·[k, n]: m up to 32, L0 k up to 512 (a 64 KiB L0A/L0B tile), n up to 32, all
    16-aligned, and the L1 k tile as many L0 k steps as the A and B slices fit in L1: the cost model charges a
    fixed ~1.4 k cycles per copy into L1 (flash hc_pre_linear: L0 k 256 → 512, 89 → 52 µs; L1 k 512 → 2048,
    cube tasks 19.1 → 10.6 µs)."""
    tm = min(32, -(-max(m, 1) // 16) * 16)
    tn = min(32, -(-max(n, 1) // 16) * 16)
    tk = min(512, -(-max(k, 1) // 16) * 16)
    while tk > 16 and max(tm, tn) * tk * 4 > L0A_BYTES:
        tk //= 2
    tk1 = tk
    while tk1 * 2 <= k and (tm + tn) * tk1 * 2 * 4 <= _PTO_L1_BYTES:
        tk1 *= 2
    return f"[{tm}, {tm}], [{tk}, {tk1}], [{tn}, {tn}]"


def _pto_whole_blocks(src: Src, t, rows: int):
    """The row loops of a template whose whole blocks need no valid_shape: `rows // R` blocks of R = `rows`
    rows, then the rest as one block (a loop of 0 or 1 iterations with `valid` rows when the extent is
    dynamic, a block of its own static shape otherwise). Yields (block rows, row offset, valid rows or None)."""
    static = None if t.is_dynamic(0) else t.shape[0]
    src(f"rows = {t.name}.shape[0]" if static is None else f"rows = {static}")
    if static is None or static >= rows:
        with src.block(f"for blk in pypto.loop(0, rows // {rows}, 1, name=\"rows_loop\", idx_name=\"blk\"):"):
            src(f"r0 = blk * {rows}")
            yield rows, "r0", None
    if static is None:
        with src.block(f"for blk in pypto.loop(rows // {rows}, (rows + {rows - 1}) // {rows}, 1, "
                       f"name=\"tail_loop\", idx_name=\"blk\"):"):
            src(f"r0 = blk * {rows}")
            src(f"valid = pypto.min(rows - r0, {rows})")
            yield rows, "r0", "valid"
    elif static % rows:
        yield static % rows, str(static - static % rows), None


@template(HcPreLinear)
def pypto_hc_pre_linear(spec: KernelSpec) -> str:
    """One cube matmul per K split of a block of up to 32 rows (x_hc read through one in-place [T, n·D]
    reshape: stream views of the rank-3 tensor were reshapes through global memory, a vector task each). Whole
    blocks assemble their ordered partials straight from the cube task; atomic: acc + p0 + p1 + ... in split
    order (one vector task per block)."""
    x, fn = spec.operands[:2]
    acc = spec.operands[2] if len(spec.operands) > 2 else None
    out = spec.results[0]
    _, n, d = x.shape
    k, mix = n * d, fn.shape[0]
    mode = spec.attrs.get("accumulate", "atomic")
    splits = _pto_split_bounds(k, int(spec.attrs.get("k_split", 1)))
    width = splits[0][1] - splits[0][0]
    src = Src(spec.signature())
    total_rows = f"{x.name}.shape[0]" if x.is_dynamic(0) else str(x.shape[0])
    src(f"xf = pypto.reshape({x.name}, [{total_rows}, {k}], inplace=True)")
    for br, r0, valid in _pto_whole_blocks(src, x, _PTO_LINEAR_ROWS):
        vs = (lambda w: f", valid_shape=[{valid}, {w}]") if valid else (lambda w: "")
        src(f"pypto.set_cube_tile_shapes({_pto_linear_cube(br, width, mix)})")
        for s, (lo, hi) in enumerate(splits):
            src(f"p{s} = pypto.matmul(pypto.view(xf, [{br}, {hi - lo}], [{r0}, {lo}]{vs(hi - lo)}), "
                f"pypto.view({fn.name}, [{mix}, {hi - lo}], [0, {lo}]), pypto.DT_FP32, b_trans=True)")
        src(f"pypto.set_vec_tile_shapes({', '.join(map(str, vec_tile((br, mix), 4)))})")
        if mode == "ordered":
            for s in range(len(splits)):   # the matmul drops the block's valid rows: view them back
                part = f"pypto.view(p{s}, [{br}, {mix}], [0, 0]{vs(mix)})" if valid else f"p{s}"
                src(f"pypto.assemble({part}, [{s} * {total_rows} + {r0}, 0], {out.name})")
            continue
        terms = [f"p{s}" for s in range(len(splits))]
        if acc is not None:
            src(f"total = pypto.view({acc.name}, [{br}, {mix}], [{r0}, 0]{vs(mix)})")
        else:
            src(f"total = {terms.pop(0)}")
        for term in terms:
            src(f"total = pypto.add(total, {term})")
        src(f"pypto.assemble(total, [{r0}, 0], {out.name})")
    return src.text()


@template(HcPreLinearReduce)
def pypto_hc_pre_linear_reduce(spec: KernelSpec) -> str:
    p = spec.operands[0]
    out = spec.results[0]
    splits = int(spec.attrs["k_split"])
    mix = out.shape[1]
    src = Src(spec.signature())
    loop = RowLoop(src, out, row_block(spec, default=16))
    br = loop.shape(out)[0]
    rows = f"{out.name}.shape[0]" if out.is_dynamic(0) else str(out.shape[0])
    with loop.loop():
        src(f"pypto.set_vec_tile_shapes({', '.join(map(str, vec_tile((br, mix), 4)))})")
        for s in range(splits):
            view = f"pypto.view({p.name}, [{br}, {mix}], [{s} * {rows} + {_pto_r0(loop)}, 0]{_pto_valid(loop, mix)})"
            src(f"total = {view}" if s == 0 else f"total = pypto.add(total, {view})")
        loop.store("total", out)
    return src.text()


_PTO_MIX_ROWS = 8   # at most this many rows per forced subgraph


def _pto_mix_rows(src: Src, loop: RowLoop, x, pre, br: int) -> str:
    """Emit the block's x_mixed = (x0·pre0 + x1·pre1) + (x2·pre2 + x3·pre3) in f32 as rank-3 math on the streams
    [R, 1, D] (no stream reshapes): the block's pre [R, n] is one copy, expanded so each column pre_i is a
    [R, 1, 1] view at a 32-byte boundary (a column view per stream was a copy of its own), and 32 KiB tiles
    keep the four products in the UB (64 KiB tiles spilled them). Returns the [R, D] f32 value's name (under a
    rank-2 vec tile) as an expression."""
    _, n, d = x.shape
    r0 = _pto_r0(loop)
    rows = f"{x.name}.shape[0]" if x.is_dynamic(0) else str(x.shape[0])
    dt = min(d, max(8, 8192 // br // 8 * 8))
    src(f"pypto.set_vec_tile_shapes({br}, {n}, 8)")
    src(f"p3 = pypto.reshape({pre.name}, [{rows}, {n}, 1], inplace=True)")
    src(f"pv = pypto.expand_clone(pypto.view(p3, [{br}, {n}, 1], [{r0}, 0, 0]{_pto_valid(loop, n, 1)}), "
        f"[{br}, {n}, 8]{_pto_valid(loop, n, 8)})")
    src(f"pypto.set_vec_tile_shapes({br}, 1, {dt})")
    for i in range(n):
        src(f"s{i} = pypto.mul(pypto.view({x.name}, [{br}, 1, {d}], [{r0}, {i}, 0]{_pto_valid(loop, 1, d)}), "
            f"pypto.view(pv, [{br}, 1, 1], [0, {i}, 0]{_pto_valid(loop, 1, 1)}))")
    src("y = pypto.add(pypto.add(s0, s1), pypto.add(s2, s3))")
    src(f"pypto.set_vec_tile_shapes({br}, {dt})")
    return f"pypto.reshape(y, [{br}, {d}]{_pto_valid(loop, d)})"


@template(MixX)
def pypto_mix_x(spec: KernelSpec) -> str:
    """x_mixed = rb((x0·pre0 + x1·pre1) + (x2·pre2 + x3·pre3)) per row block, one forced subgraph each
    (`_pto_mix_rows`)."""
    x, pre = spec.operands
    out = spec.results[0]
    src = Src(spec.signature())
    loop = RowLoop(src, x, _pto_rows_per_block(spec, x, _PTO_MIX_ROWS))
    br = loop.shape(x)[0]
    with loop.loop():
        pto_scope(src, 1)
        y = _pto_mix_rows(src, loop, x, pre, br)
        src(f"yb = {cast_expr(y, 'f32', out.dtype)}")
        loop.store("yb", out)
        pto_scope(src, -1)
    return src.text()


@template(MixXRmsNorm)
def pypto_mix_x_rms_norm(spec: KernelSpec) -> str:
    """rmsnorm(mix_x(x_hc, pre), w) per row block in one forced subgraph: the mixed rows (`_pto_mix_rows`) are
    rounded to bf16 (mix_x's rounding point) and normed in the UB (rmsnorm's f32 math: x · inv first, then · w,
    one bf16 rounding); x_mixed never goes to GM."""
    x, pre, w = spec.operands
    out = spec.results[0]
    d = x.shape[2]
    eps = float(spec.attrs.get("eps", 1e-6))
    src = Src(spec.signature())
    loop = RowLoop(src, x, _pto_rows_per_block(spec, x, _PTO_MIX_ROWS))
    br = loop.shape(x)[0]
    with loop.loop():
        pto_scope(src, 1)
        y = _pto_mix_rows(src, loop, x, pre, br)
        src(f"xf = {cast_expr(cast_expr(y, 'f32', 'bf16'), 'bf16', 'f32')}")
        src(f"wf = {cast_expr(f'pypto.reshape({w.name}, [1, {d}])', w.dtype, 'f32')}")
        pto_rmsnorm_rows(src, d, eps, out.dtype, result="yn")
        loop.store("yn", out)
        pto_scope(src, -1)
    return src.text()


_PTO_POST_GROUP = 4     # at most this many tokens per hc_post task


def _pto_hc_post_tokens(src: Src, spec: KernelSpec, count: int, r0: str) -> None:
    """hc_post of the `count` tokens from row r0 as one forced subgraph, rank-4 math on in-place reshapes
    (x_attn [T, 1, 1, D], x_hc [T, n, 1, D], post [T, n, 1, 1], comb [T, n, n, 1]). The tokens' post and comb
    are one copy each, expanded to 8 copies per element (an op: a view of a view would be a copy from global
    memory of its own), so every scalar post[o] / column C[:, o] is a view at a 32-byte boundary of a UB tile
    (a [1, 1] view of the input per o was a copy of ~1.4 k cycles fixed cost)."""
    a, x, post, comb = spec.operands
    out = spec.results[0]
    _, n, d = x.shape
    dw = min(d, 16384)
    dt = min(d, max(8, (16384 // n) // 8 * 8))   # a stream tile [1, n, 1, dt] of ≤ 64 KiB
    pto_scope(src, 1)
    for name, t, shape in (("a4", a, [1, 1, d]), ("x4", x, [n, 1, d]), ("p4", post, [n, 1, 1]),
                           ("c4", comb, [n, n, 1])):
        src(f"{name} = pypto.reshape({t.name}, {py_list(['rows'] + shape)}, inplace=True)")
    for name, t, shape in (("pv", "p4", [count, n, 1]), ("cv", "c4", [count, n, n])):
        src(f"pypto.set_vec_tile_shapes({', '.join(map(str, shape))}, 8)")
        src(f"{name} = pypto.expand_clone(pypto.view({t}, {py_list(shape + [1])}, {py_list([r0, 0, 0, 0])}), "
            f"{py_list(shape + [8])})")
    for u in range(count):
        ru = f"{r0} + {u}" if count > 1 else r0
        src(f"pypto.set_vec_tile_shapes(1, 1, 1, {dw})")
        src(f"af = {cast_expr(f'pypto.view(a4, [1, 1, 1, {d}], [{ru}, 0, 0, 0])', a.dtype, 'f32')}")
        src(f"pypto.set_vec_tile_shapes(1, {n}, 1, {dt})")
        src(f"xs = pypto.view(x4, [1, {n}, 1, {d}], [{ru}, 0, 0, 0])")
        for o in range(n):
            src(f"pypto.set_vec_tile_shapes(1, 1, 1, {dw})")
            src(f"y = pypto.mul(af, pypto.view(pv, [1, 1, 1, 1], [{u}, {o}, 0, 0]))")
            src(f"pypto.set_vec_tile_shapes(1, {n}, 1, {dt})")
            src(f"z = pypto.mul(xs, pypto.view(cv, [1, {n}, 1, 1], [{u}, 0, {o}, 0]))")
            src(f"pypto.set_vec_tile_shapes(1, 1, 1, {dw})")
            for i in range(n):
                src(f"y = pypto.add(y, pypto.view(z, [1, 1, 1, {d}], [0, {i}, 0, 0]))")
            src(f"pypto.assemble(pypto.reshape(y, [1, 1, {d}]), [{ru}, {o}, 0], {out.name})")
    pto_scope(src, -1)


@template(HcPost)
def pypto_hc_post(spec: KernelSpec) -> str:
    """For each output stream o: y = f32(a)·post[o], then Z = X·C[:, o] (the token's streams X [n, D] times
    the column C[:, o]) and y += Z[i] for i ascending: the reference's op order exactly. Groups of G tokens
    per forced subgraph (`_pto_rows_per_block`: one round of tasks on the vector cores; the tokens of a group
    share their post / comb copies), then the remaining tokens one per subgraph (`_pto_hc_post_tokens`).
    Flash TP4 cost model: 44 tasks of 3 tokens (24 k cycles, vector-bound), 14.3 µs alone (one token per
    task: 128 tasks in 3 rounds of 16.7 k cycles, 34.2 µs)."""
    x = spec.operands[1]
    group = _pto_rows_per_block(spec, x, _PTO_POST_GROUP)
    src = Src(spec.signature())
    if group == 1:
        for _ in pto_token_units(src, x):
            _pto_hc_post_tokens(src, spec, 1, "r0")
        return src.text()
    for count, r0 in pto_block_loops(src, x, group):
        _pto_hc_post_tokens(src, spec, count, r0)
    return src.text()


def _pto_sigmoid(x: str) -> str:
    """1/(1 + exp(-x)) as the reference writes it (pypto.sigmoid breaks CPU numerics on partial tiles)."""
    return f"pypto.reciprocal(pypto.add(pypto.exp(pypto.neg({x})), 1.0))"


@template(SplitPrePost)
def pypto_split_pre_post(spec: KernelSpec) -> str:
    """pre / post as upstream's split_pre_post computes them (pypto-lib hc_pre.py, `_hc_pre_separate`
    split_pre_post): two gates, each scaled by its own hc_scale entry and offset by its own hc_base slice, no
    staging of a combined scale or base. The tokens are the wide last dim (as `pypto_comb_sinkhorn`): the block's
    2n mix columns transposed to [2n, R] and multiplied by inv as a [1, R] row; the pre rows [0, n) and the post
    rows [n, 2n) are views of that tile, each · its scale (a [1, 1] load expanded to an [n, 1] column) + its
    base slice (an [n, 1] column view of an in-place [2n, 1] reshape of hc_base), then the sigmoid
    1/(1 + exp(−x)), + eps (pre) / ·2 (post), transposed back. The reference's ops in its order: bitwise to the
    earlier form, which built an [2n, 1] scale by a concat and the base column by a reshape, each a round trip
    through GM (flash: 7 loads + 5 stores per 8-token task → 6 loads + 2 stores)."""
    mixes, inv, scale, base = spec.operands
    pre, post = spec.results
    n = int(spec.attrs.get("hc_mult", 4))
    eps = float(spec.attrs.get("eps", 1e-6))
    src = Src(spec.signature())
    for r, r0 in pto_block_loops(src, mixes, _pto_rows_per_block(spec, mixes, _PTO_TOKEN_BLOCK)):
        tw = max(8, -(-r // 8) * 8)
        pto_scope(src, 1)
        src(f"sr = pypto.reshape({scale.name}, [1, {scale.shape[0]}], inplace=True)")
        src(f"bc = pypto.reshape({base.name}, [{base.shape[0]}, 1], inplace=True)")
        src(f"pypto.set_vec_tile_shapes({tw})")
        src(f"iv = pypto.reshape(pypto.view({inv.name}, [{r}], [{r0}]), [1, {r}])")
        src(f"pypto.set_vec_tile_shapes({r}, {max(8, 2 * n)})")
        src(f"mv = pypto.view({mixes.name}, [{r}, {2 * n}], [{r0}, 0])")
        src(f"pypto.set_vec_tile_shapes({2 * n}, {tw})")
        src("mi = pypto.mul(pypto.transpose(mv, 0, 1), iv)")
        for k, (name, target) in enumerate((("pt", pre), ("qt", post))):
            src(f"pypto.set_vec_tile_shapes({n}, 8)")
            src(f"sk = pypto.expand_clone(pypto.view(sr, [1, 1], [0, {k}]), [{n}, 1])")
            src(f"bk = pypto.view(bc, [{n}, 1], [{k * n}, 0])")
            src(f"pypto.set_vec_tile_shapes({n}, {tw})")
            sg = _pto_sigmoid(f"pypto.add(pypto.mul(pypto.view(mi, [{n}, {r}], [{k * n}, 0]), sk), bk)")
            src(f"{name} = " + (f"pypto.add({sg}, {eps!r})" if k == 0 else f"pypto.mul({sg}, 2.0)"))
            src(f"pypto.set_vec_tile_shapes({r}, 8)")
            src(f"pypto.assemble(pypto.transpose({name}, 0, 1), [{r0}, 0], {target.name})")
        pto_scope(src, -1)
    return src.text()


@template(CombSinkhorn)
def pypto_comb_sinkhorn(spec: KernelSpec) -> str:
    """Softmax over `out`, then Sinkhorn row/column normalisations, with the tokens as the wide last dim: a
    block of R tokens' n·n comb logits is transposed to [n·n, R] and packed as Y [n, n·R] (row i, column
    o·R + t), so the sum over `out` adds the n column blocks [n, R] and the sum over `in` adds the n rows
    [1, n·R]; every op is one wide vector op (the n·n per-token columns of the old form were ~10⁴× the
    roofline). Same ops and orders as the reference: (mix·inv)·s2 + b, max/exp, sequential sums of n terms."""
    mixes, inv, scale, base = spec.operands
    out = spec.results[0]
    n = int(spec.attrs.get("hc_mult", 4))
    iters = int(spec.attrs.get("iters", 20))
    eps = float(spec.attrs.get("eps", 1e-6))
    nn = n * n
    src = Src(spec.signature())
    for r, r0 in pto_block_loops(src, mixes, _PTO_TOKEN_BLOCK):
        w = r * n                                   # the packed width n·R
        tw = max(8, -(-r // 8) * 8)                 # tiles span ≥ 32 bytes
        pto_scope(src, 1)
        src(f"pypto.set_vec_tile_shapes({nn}, 8)")   # s2 as a column (a broadcast may expand one axis only)
        src(f"sc = pypto.expand_clone(pypto.view(pypto.reshape({scale.name}, [1, {scale.shape[0]}]), [1, 1], "
            f"[0, 2]), [{nn}, 1])")
        src(f"bs = pypto.reshape(pypto.view({base.name}, [{nn}], [{2 * n}]), [{nn}, 1])")
        src(f"pypto.set_vec_tile_shapes({tw})")
        src(f"iv = pypto.reshape(pypto.view({inv.name}, [{r}], [{r0}]), [1, {r}])")
        src(f"pypto.set_vec_tile_shapes({r}, {max(8, nn)})")
        src(f"mv = pypto.view({mixes.name}, [{r}, {nn}], [{r0}, {2 * n}])")
        src(f"pypto.set_vec_tile_shapes({nn}, {tw})")
        src("mt = pypto.transpose(mv, 0, 1)")
        src("ct = pypto.add(pypto.mul(pypto.mul(mt, iv), sc), bs)")
        src(f"pypto.set_vec_tile_shapes({n}, {max(8, w)})")
        src(f"y = pypto.reshape(ct, [{n}, {w}])")

        def blocks(t: str) -> list[str]:
            return [f"pypto.view({t}, [{n}, {r}], [0, {o * r}])" for o in range(n)]

        def rows(t: str) -> list[str]:
            return [f"pypto.view({t}, [1, {w}], [{i}, 0])" for i in range(n)]

        def tiled(t: str) -> str:
            return f"pypto.concat([{', '.join([t] * n)}], -1)"

        src(f"mx = {_pto_chain('pypto.maximum', blocks('y'))}")
        src(f"e = pypto.exp(pypto.sub(y, {tiled('mx')}))")
        src(f"den = {_pto_chain('pypto.add', blocks('e'))}")
        src(f"y = pypto.add(pypto.div(e, {tiled('den')}), {eps!r})")
        src(f"y = pypto.div(y, pypto.add({_pto_chain('pypto.add', rows('y'))}, {eps!r}))")
        for _ in range(iters - 1):
            src(f"den = pypto.add({_pto_chain('pypto.add', blocks('y'))}, {eps!r})")
            src(f"y = pypto.div(y, {tiled('den')})")
            src(f"y = pypto.div(y, pypto.add({_pto_chain('pypto.add', rows('y'))}, {eps!r}))")
        src(f"pypto.set_vec_tile_shapes({nn}, {tw})")
        src(f"yt = pypto.reshape(y, [{nn}, {r}])")
        src(f"pypto.set_vec_tile_shapes({r}, {max(8, nn)})")
        src("yo = pypto.transpose(yt, 0, 1)")
        src(f"pypto.set_vec_tile_shapes({r}, {n}, 8)")
        src(f"pypto.assemble(pypto.reshape(yo, [{r}, {n}, {n}]), [{r0}, 0, 0], {out.name})")
        pto_scope(src, -1)
    return src.text()


def _pto_chain(fn: str, terms) -> str:
    """((t0 op t1) op t2) op ...: numpy's order for a sum of fewer than 8 elements."""
    expr = terms[0]
    for t in terms[1:]:
        expr = f"{fn}({expr}, {t})"
    return expr

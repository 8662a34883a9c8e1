"""pypto 0.2.0 templates of the oproj kernel family (the ops' numpy semantics: dspark_ir/semantics/oproj.py)."""
from __future__ import annotations

# ---- pypto 0.2.0 template ------------------------------------------------------------------------
# Source generators for the lowering (see kernels/pto.py); each mirrors the reference above:
# o_proj_a is one bf16 cube matmul (f32 accumulation; the reference rounds an f64 sum once, so results
# agree to f32 rounding), quant_rows uses the true division 127/amax and rint, o_proj_b is exact int8,
# o_proj_b_dequant adds the groups in ascending order.
from dspark_ir.hardware import HARDWARE
from dspark_ir.ops.oproj import OProjA, OProjB, OProjBDequant, QuantRows

from .cube import (
    pto_block_loop,
    pto_col_loop,
    pto_cube_args,
    pto_cube_plan,
    pto_cube_setup,
    pto_cube_tiles_filled,
    pto_view,
)
from .pto import WIDE_VEC_TILE_BYTES, KernelSpec, RowLoop, Src, cast_expr, ceil_div, round_up, row_block, vec_tile
from .registry import template


def _pto_offset(base: int, block: str) -> str:
    """Source of base + a block offset expression ("0" outside a loop)."""
    if block == "0":
        return str(base)
    return f"{base} + {block}" if base else block


@template(OProjA)
def pypto_o_proj_a(spec: KernelSpec) -> str:
    """One bf16 cube matmul of group g: the parameters reshaped in place to 2-D (no copies), then a loop over
    the output tiles of `pto_cube_tiles_filled`, one pypto task each (no hub fan-out; the 3-D parameters'
    reshapes are the only link before them). Flash TP4: 176 × 128 tiles, 24 tasks, 44.5 → 32.3 µs."""
    heads, wo_a = spec.operands
    out = spec.results[0]
    g = int(spec.attrs["group"])
    groups, rows, width = heads.shape
    _, n, _ = wo_a.shape
    tm, tk, tk1, tn = pto_cube_tiles_filled(rows, width, n, "bf16")
    src = Src(spec.static().signature())
    src(f"a = pypto.reshape({heads.name}, [{groups * rows}, {width}], inplace=True)")
    src(f"b = pypto.reshape({wo_a.name}, [{groups * n}, {width}], inplace=True)")
    with pto_block_loop(src, rows, tm, ("rows_loop", "mb", "r0", "rv")) as r, pto_block_loop(src, n, tn) as c:
        src(f"pypto.set_cube_tile_shapes({pto_cube_args(tm, tk, tk1, tn)})")
        a = pto_view("a", [r.width, width], [_pto_offset(g * rows, r.c0), 0], [r.valid or r.width, width])
        b = pto_view("b", [c.width, width], [_pto_offset(g * n, c.c0), 0], [c.valid or c.width, width])
        src(f"c = pypto.matmul({a}, {b}, pypto.DT_FP32, b_trans=True)")
        src(f"pypto.assemble(c, [{r.c0}, {c.c0}], {out.name})")
    return src.text()


_PTO_QUANT_ROWS = 256   # rows per loop iteration: one forced subgraph each (flash: 250 → ~42 µs in the cost model)
_PTO_QUANT_TILE_BYTES = WIDE_VEC_TILE_BYTES   # one f32 vector tile


@template(QuantRows)
def pypto_quant_rows(spec: KernelSpec) -> str:
    """q8 per row, one forced subgraph per block of rows, vector tiles of ≤ 64 KiB f32 (`_pto_quant_block_rows`).
    Rows are independent, so any split into blocks is bitwise. With `pad_rows` the int8 rows past x's are then
    zeroed (`_pto_quant_zero_pad`), as the seed's TP1 quant does for the T_PAD rows proj_b_mm reads."""
    if spec.attrs.get("pad_rows"):
        spec = spec.static()
    x = spec.operands[0]
    q, scale = spec.results
    width = x.shape[1]
    src = Src(spec.signature())
    loop = RowLoop(src, x, _pto_quant_block_rows(spec))
    br = loop.shape(x)[0]
    valid = "valid" if loop.looped and loop.partial else str(br)
    tile = vec_tile((br, width), 4, budget=_PTO_QUANT_TILE_BYTES)
    with loop.loop():
        src("pypto.set_pass_options(sg_set_scope=1)")
        src(f"pypto.set_vec_tile_shapes({', '.join(map(str, tile))})")
        src(f"xv = {loop.view(x)}")
        src("amax = pypto.maximum(pypto.amax(pypto.abs(xv), -1, keepdim=True), 0.0001)")
        src(f"k = pypto.div(pypto.full([{br}, 1], 127.0, pypto.DT_FP32, valid_shape=[{valid}, 1]), amax)")
        src(f"qv = {cast_expr('pypto.mul(xv, k)', 'f32', 'i8')}")
        loop.store("qv", q)
        src(f"s = pypto.div(pypto.full([{br}, 1], 1.0, pypto.DT_FP32, valid_shape=[{valid}, 1]), k)")
        src(f"s1 = pypto.reshape(s, [{br}], valid_shape=[{valid}])")
        loop.store("s1", scale)
        src("pypto.set_pass_options(sg_set_scope=-1)")
    if q.shape[0] > x.shape[0]:
        _pto_quant_zero_pad(src, q, x.shape[0])
    return src.text()


def _pto_quant_zero_pad(src: Src, q, first: int) -> None:
    """Zero the int8 rows first … of q in blocks of ≤ one vector tile (f32 zeros through the int8 cast path, one
    forced subgraph each)."""
    width = q.shape[1]
    block = max(1, min(q.shape[0] - first, _PTO_QUANT_TILE_BYTES // (4 * width)))
    for r0 in range(first, q.shape[0], block):
        n = min(block, q.shape[0] - r0)
        src("pypto.set_pass_options(sg_set_scope=1)")
        src(f"pypto.set_vec_tile_shapes({', '.join(map(str, vec_tile((n, width), 4, budget=_PTO_QUANT_TILE_BYTES)))})")
        zeros = cast_expr(f"pypto.full([{n}, {width}], 0.0, pypto.DT_FP32)", "f32", "i8")
        src(f"pypto.assemble({zeros}, [{r0}, 0], {q.name})")
        src("pypto.set_pass_options(sg_set_scope=-1)")


def _pto_quant_block_rows(spec: KernelSpec) -> int:
    """Rows per block. One block (`pl.at`): up to 256 (the IR's rows tile is ignored: the task's cost is the sum
    of its pypto tasks). An SPMD grid (blocks > 1, `tile` rows on `workers` cyclic workers): the rows one worker
    holds (tile · ⌈tiles / workers⌉, contiguous), at most one vector tile of them, so that every block is one
    pypto task and the blocks run side by side (a block of two tiles is two tasks, and its scale reshape a third;
    flash TP4 tp_o_a_quant: 24 rows → 16, span 24.0 → 3.5 µs, work 41.8 → 86.3 µs, alone 24.0 → 3.6 µs)."""
    tile = spec.attrs.get("tile")
    if spec.blocks <= 1 or not tile:
        return _PTO_QUANT_ROWS
    x = spec.operands[0]
    rows, tile_rows = x.shape[0], int(tile[0])
    worker = tile_rows * ceil_div(ceil_div(rows, tile_rows), int(spec.attrs.get("workers") or spec.blocks))
    return max(1, min(worker, _PTO_QUANT_TILE_BYTES // (4 * x.shape[1])))


@template(OProjB)
def pypto_o_proj_b(spec: KernelSpec) -> str:
    """Exact int8 product of one group's K slice, per row block (the IR's tile), with the matmul template's
    cube plan and column-block loop (kernels/cube.py): output tiles that share their row block's activations
    merge into one pypto task, one task per loop iteration, so all of them run in one wave over the cube cores
    and none waits on a hub; the plan weighs the task's SPMD blocks (flash TP4, 32 blocks: 224-wide tiles four
    to a task, 64 → 20 tasks, 32.7 → 15.4 µs)."""
    x, wo_b = spec.operands
    out = spec.results[0]
    g = int(spec.attrs["group"])
    k = x.shape[1]
    n = wo_b.shape[0]
    src = Src(spec.signature())
    loop = RowLoop(src, x, row_block(spec, default=64))
    br = loop.shape(x)[0]
    plan = pto_cube_plan(x.shape[0], br, 1, k, n, "i8", blocks=spec.blocks)
    with loop.loop(), pto_col_loop(src, n, plan.merge * plan.tn) as col:
        pto_cube_setup(src, plan)
        src(f"w = {pto_view(wo_b.name, [col.width, k], [col.c0, g * k], [col.valid or col.width, k])}")
        src(f"c = pypto.matmul({loop.view(x)}, w, pypto.DT_INT32, b_trans=True)")
        src(f"pypto.assemble(c, [{'r0' if loop.looped else '0'}, {col.c0}], {out.name})")
    return src.text()


def _pto_rows_view(loop: RowLoop, t, rows: int) -> str:
    """The loop block's view of accumulator t; its first `rows` rows when one block covers all and t is padded."""
    if loop.looped or t.shape[0] == rows:
        return loop.view(t)
    return f"pypto.view({t.name}, [{rows}, {t.shape[1]}], [0, 0])"


_PTO_DEQUANT_TILE_BYTES = WIDE_VEC_TILE_BYTES  # one f32 [r, N] operand tile
_PTO_DEQUANT_CORES = HARDWARE.vector_cores  # vector cores: the row blocks (one forced subgraph each) run in one wave


@template(OProjBDequant)
def pypto_o_proj_b_dequant(spec: KernelSpec) -> str:
    """acc = Σ_g f32(acc_g)·s_g (groups ascending), then acc·wo_b_scale, rounded to the output dtype. One forced
    subgraph per block of rows, as many blocks as vector cores (each pypto task costs dispatch and ~1.4 k
    cycles per copy-in, so a block reads its activation scales once as a column and wo_b_scale once; the columns
    come from reshapes of the block's views: reshaping the parameters in place kept the block's tiles from
    merging into one task); ≤ 64 KiB tiles of whole rows inside (flash TP4 cost model: 128 → 43 tasks, 46.3 →
    16.7 µs)."""
    sw, *parts = spec.operands
    out = spec.results[0]
    # the loop runs over the output rows: the scales' (an accumulator may hold padded rows past them)
    rows_from = parts[0] if all(a.shape[0] == parts[1].shape[0] for a in parts[0::2]) else parts[1]
    rows, n = rows_from.shape[0], parts[0].shape[1]
    tile_rows = max(1, min(rows, _PTO_DEQUANT_TILE_BYTES // (4 * n)))
    block = round_up(ceil_div(rows, _PTO_DEQUANT_CORES), tile_rows)
    src = Src(spec.signature())
    loop = RowLoop(src, rows_from, block)
    br = loop.shape(parts[0])[0]
    col = ", valid_shape=[valid, 1]" if loop.looped and loop.partial else ""
    with loop.loop():
        src("pypto.set_pass_options(sg_set_scope=1)")
        for i in range(1, len(parts), 2):
            src(f"pypto.set_vec_tile_shapes({round_up(br, 8)})")
            src(f"v{i // 2} = {loop.view(parts[i])}")
            src(f"pypto.set_vec_tile_shapes({br}, 8)")
            src(f"s{i // 2} = pypto.reshape(v{i // 2}, [{br}, 1]{col})")
        src(f"pypto.set_vec_tile_shapes({tile_rows}, {n})")
        src(f"swv = pypto.reshape({sw.name}, [1, {n}])")
        for i in range(0, len(parts), 2):
            term = f"pypto.mul({cast_expr(_pto_rows_view(loop, parts[i], rows), 'i32', 'f32')}, s{i // 2})"
            src(f"total = {term}" if i == 0 else f"total = pypto.add(total, {term})")
        src(f"y = {cast_expr('pypto.mul(total, swv)', 'f32', out.dtype)}")
        loop.store("y", out)
        src("pypto.set_pass_options(sg_set_scope=-1)")
    return src.text()

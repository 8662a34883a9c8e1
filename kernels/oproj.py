"""pypto 0.2.0 templates of the oproj kernel family (the ops' numpy semantics: dspark_ir/semantics/oproj.py)."""
from __future__ import annotations

# ---- pypto 0.2.0 template ------------------------------------------------------------------------
# Source generators for the lowering (see kernels/pto.py); each mirrors the reference above:
# o_proj_a is one bf16 cube matmul (f32 accumulation; the reference rounds an f64 sum once, so results
# agree to f32 rounding), quant_rows uses the true division 127/amax and rint, o_proj_b is exact int8,
# o_proj_b_dequant adds the groups in ascending order.
from dspark_ir.ops.oproj import OProjA, OProjB, OProjBDequant, QuantRows

from .pto import (ITEMSIZE, L0A_BYTES, L0B_BYTES, L0C_BYTES, KernelSpec, RowLoop, Src, cast_expr,
                      ceil_div, round_up, row_block, vec_tile)

from .matmul import (_pto_block_loop, _pto_col_loop, _pto_cube_plan, _pto_cube_setup, _pto_k_tiles,
                     _pto_view)
from .registry import template

_PTO_L1_BYTES = 384 * 1024  # the L1 share of one cube tile's A and B slices (L1 is 512 KiB; 576 KiB overflows)


def _pto_cube_tiles(m: int, k: int, n: int, dtype: str, tm_cap: int = 128, tn_cap: int = 256):
    """(tm, tk, tk1, tn) of `_pto_cube_shapes` with output tiles of up to tm_cap × tn_cap."""
    item = ITEMSIZE[dtype]
    align = 32 if item == 1 else 16
    tm = min(tm_cap, round_up(max(m, 1), 16))
    tn = min(tn_cap, round_up(max(n, 1), align))
    while tm * tn * 4 > L0C_BYTES and tn > align:
        tn //= 2
    tk = min(256, round_up(max(k, 1), align))
    while (tm * tk * item > L0A_BYTES or tk * tn * item > L0B_BYTES) and tk > align:
        tk //= 2
    tk1 = tk
    while tk1 * 2 <= min(1024, round_up(k, tk)) and (tm + tn) * tk1 * 2 * item <= _PTO_L1_BYTES:
        tk1 *= 2
    return tm, tk, tk1, tn


def _pto_cube_shapes(m: int, k: int, n: int, dtype: str) -> str:
    """`set_cube_tile_shapes` for the O projections' [m,k]·[k,n]: output tiles of up to 128 × 256, the L0 k
    tile as large as L0B allows, and an L1 k tile of up to 1024 (as many L0 k steps as the A and B slices fit in
    L1). In pypto 0.2.0's cost model every L1 k step costs a fixed reload, so the deep L1 tile halves the cube
    time (flash TP4 o_proj_a 90 → 45 µs, o_proj_b 60 → 33 µs against `cube_shapes`)."""
    return _pto_cube_args(*_pto_cube_tiles(m, k, n, dtype))


def _pto_cube_args(tm: int, tk: int, tk1: int, tn: int) -> str:
    return f"[{tm}, {tm}], [{tk}, {tk1}], [{tn}, {tn}]"


_PTO_CUBE_CORES = 24
_PTO_COPY_IN_CYCLES = 1400   # cost model: fixed cycles of one copy into L1 / UB ...
_PTO_COPY_IN_BYTES = 95      # ... plus a byte per this many ... (bytes / cycle)


def _pto_cube_shapes_spread(m: int, k: int, n: int, dtype: str, matmuls: int = 1) -> str:
    """`_pto_cube_shapes` with the output tile chosen for the whole kernel: each of the `matmuls` products
    [m,k]·[k,n] runs one pypto task per output tile, and a task's time is its L1 copies (a fixed cost each, then
    bandwidth: the A and B slices of every L1 k step), so the tile minimising waves × task time over the cube
    cores wins (smaller tiles than 128 × 256 when that leaves cores idle; kernels.compressor's
    kv_score_proj)."""
    item = ITEMSIZE[dtype]

    def time(tiles):
        tm, _tk, tk1, tn = tiles
        tasks = matmuls * ceil_div(m, tm) * ceil_div(n, tn)
        copy = 2 * ceil_div(k, tk1) * _PTO_COPY_IN_CYCLES + (tm + tn) * k * item / _PTO_COPY_IN_BYTES
        return ceil_div(tasks, _PTO_CUBE_CORES) * copy, tasks

    options = {_pto_cube_tiles(m, k, n, dtype, tm_cap, tn_cap) for tm_cap in (128, 64, 32) for tn_cap in (256, 128, 64)}
    return _pto_cube_args(*min(options, key=lambda t: (time(t), -t[0], -t[3])))


_PTO_TASK_CYCLES = 270           # the AICPU's scheduling per pypto task (serial over the kernel's tasks)


def _pto_cube_tiles_filled(m: int, k: int, n: int, dtype: str):
    """(tm, tk, tk1, tn) for [m,k]·[k,n], one pypto task per output tile: every 16-aligned output tile up to
    256 × 256 (32-aligned n for int8) that fits L0C, its k tiles those of `_pto_k_tiles`. A task's time is its
    L1 copies (a fixed cost each, then bandwidth), so the tiles minimising waves × task time over the cube
    cores, plus the AICPU's scheduling, win; ties: fewer tasks, then whole column blocks of the right operand
    (a partial one at a group's row offset slowed the AICPU's dispatch: flash TP4 o_proj_a group 1, 128 × 176
    tiles 37.1 µs, 176 × 128 tiles 32.3 µs). Output tiles sized to fill the cube cores once beat 128 × 256
    tiles that leave cores idle."""
    item = ITEMSIZE[dtype]
    align = 32 if item == 1 else 16

    def plan(tm, tn):
        tk, tk1 = _pto_k_tiles(tm, tn, k, item)
        tasks = ceil_div(m, tm) * ceil_div(n, tn)
        task = 2 * ceil_div(k, tk1) * _PTO_COPY_IN_CYCLES + (tm + tn) * k * item / _PTO_COPY_IN_BYTES
        cost = ceil_div(tasks, _PTO_CUBE_CORES) * task + tasks * _PTO_TASK_CYCLES
        return cost, tasks, n % tn != 0, (tm, tk, tk1, tn)

    plans = [plan(tm, tn) for tm in range(16, min(256, round_up(max(m, 1), 16)) + 1, 16)
             for tn in range(align, min(256, round_up(max(n, 1), align)) + 1, align) if tm * tn * 4 <= L0C_BYTES]
    return min(plans)[-1]


def _pto_offset(base: int, block: str) -> str:
    """Source of base + a block offset expression ("0" outside a loop)."""
    if block == "0":
        return str(base)
    return f"{base} + {block}" if base else block


@template(OProjA)
def pypto_o_proj_a(spec: KernelSpec) -> str:
    """One bf16 cube matmul of group g: the parameters reshaped in place to 2-D (no copies), then a loop over
    the output tiles of `_pto_cube_tiles_filled`, one pypto task each (no hub fan-out; the 3-D parameters'
    reshapes are the only link before them). Flash TP4: 176 × 128 tiles, 24 tasks, 44.5 → 32.3 µs."""
    heads, wo_a = spec.operands
    out = spec.results[0]
    g = int(spec.attrs["group"])
    groups, rows, width = heads.shape
    _, n, _ = wo_a.shape
    tm, tk, tk1, tn = _pto_cube_tiles_filled(rows, width, n, "bf16")
    src = Src(spec.static().signature())
    src(f"a = pypto.reshape({heads.name}, [{groups * rows}, {width}], inplace=True)")
    src(f"b = pypto.reshape({wo_a.name}, [{groups * n}, {width}], inplace=True)")
    with _pto_block_loop(src, rows, tm, ("rows_loop", "mb", "r0", "rv")) as r, _pto_block_loop(src, n, tn) as c:
        src(f"pypto.set_cube_tile_shapes({_pto_cube_args(tm, tk, tk1, tn)})")
        a = _pto_view("a", [r.width, width], [_pto_offset(g * rows, r.c0), 0], [r.valid or r.width, width])
        b = _pto_view("b", [c.width, width], [_pto_offset(g * n, c.c0), 0], [c.valid or c.width, width])
        src(f"c = pypto.matmul({a}, {b}, pypto.DT_FP32, b_trans=True)")
        src(f"pypto.assemble(c, [{r.c0}, {c.c0}], {out.name})")
    return src.text()


_PTO_QUANT_ROWS = 256   # rows per loop iteration: one forced subgraph each (flash: 250 → ~42 µs in the cost model)
_PTO_QUANT_TILE_BYTES = 64 * 1024   # one f32 vector tile


@template(QuantRows)
def pypto_quant_rows(spec: KernelSpec) -> str:
    """q8 per row, one forced subgraph per block of rows, vector tiles of ≤ 64 KiB f32 (`_pto_quant_block_rows`).
    Rows are independent, so any split into blocks is bitwise."""
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
    return src.text()


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
    cube plan and column-block loop (`kernels.matmul`): output tiles that share their row block's activations
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
    plan = _pto_cube_plan(x.shape[0], br, 1, k, n, "i8", blocks=spec.blocks)
    with loop.loop(), _pto_col_loop(src, n, plan.merge * plan.tn) as col:
        _pto_cube_setup(src, plan)
        src(f"w = {_pto_view(wo_b.name, [col.width, k], [col.c0, g * k], [col.valid or col.width, k])}")
        src(f"c = pypto.matmul({loop.view(x)}, w, pypto.DT_INT32, b_trans=True)")
        src(f"pypto.assemble(c, [{'r0' if loop.looped else '0'}, {col.c0}], {out.name})")
    return src.text()


_PTO_DEQUANT_TILE_BYTES = 64 * 1024  # one f32 [r, N] operand tile
_PTO_DEQUANT_CORES = 48              # vector cores: the row blocks (one forced subgraph each) run in one wave


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
    rows, n = parts[0].shape
    tile_rows = max(1, min(rows, _PTO_DEQUANT_TILE_BYTES // (4 * n)))
    block = round_up(ceil_div(rows, _PTO_DEQUANT_CORES), tile_rows)
    src = Src(spec.signature())
    loop = RowLoop(src, parts[0], block)
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
            term = f"pypto.mul({cast_expr(loop.view(parts[i]), 'i32', 'f32')}, s{i // 2})"
            src(f"total = {term}" if i == 0 else f"total = pypto.add(total, {term})")
        src(f"y = {cast_expr('pypto.mul(total, swv)', 'f32', out.dtype)}")
        loop.store("y", out)
        src("pypto.set_pass_options(sg_set_scope=-1)")
    return src.text()

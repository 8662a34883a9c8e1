"""pypto 0.2.0 templates of the matmul kernel family (the ops' numpy semantics: dspark_ir/semantics/matmul.py)."""
from __future__ import annotations

import numpy as np

# ---- pypto 0.2.0 template ------------------------------------------------------------------------
# Source generator for the lowering (see kernels/pto.py). Mirrors `matmul` above: bf16/fp16 x bf16/fp16
# and int8 x int8 (-> int32) on the cube; an atomic task adds each of its k_split contiguous K slices into
# the seeded f32 accumulator, in ascending split order (the reference order). The row block is the IR's
# tile; inside it the cube tiles and pypto's task grouping are planned for pypto 0.2.0's cost model
# (`_pto_cube_plan`).
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from dspark_ir.ops.core import Matmul

from .pto import (ITEMSIZE, L0A_BYTES, L0B_BYTES, L0C_BYTES, KernelSpec, RowLoop, Src, ceil_div,
                     py_list, round_up, row_block, vec_tile)
from .registry import template

_PTO_CUBE_CORES = 24            # the modelled chip's cube cores (ASCEND_910B2)
_PTO_L1_BYTES = 512 * 1024      # L1: the A and B slices of one L1 k step (single-buffered; beyond it pypto spills)
_PTO_COPY_CYCLES = 1400         # cost model: fixed cycles of one copy into L1 (one MTE_IN pipe per core) ...
_PTO_COPY_BYTES_PER_CYCLE = 95  # ... plus its bytes at this rate
_PTO_ROUND_CYCLES = 4500        # the gap before a core's next task (dispatch and start latency)
_PTO_TASK_CYCLES = 270          # the AICPU's scheduling per task (serial over the kernel's tasks)


@dataclass(frozen=True)
class _CubePlan:
    """Cube tiles (`set_cube_tile_shapes`: L0 m/k/n, the L1 k tile) and how many output tiles that share their
    left operand pypto merges into one task (`cube_l1_reuse_setting`)."""

    tm: int
    tk: int
    tk1: int
    tn: int
    merge: int

    def shapes(self) -> str:
        return f"[{self.tm}, {self.tm}], [{self.tk}, {self.tk1}], [{self.tn}, {self.tn}]"


def _pto_copy_cycles(nbytes: int) -> float:
    return _PTO_COPY_CYCLES + nbytes / _PTO_COPY_BYTES_PER_CYCLE


def _pto_k_tiles(tm: int, tn: int, k: int, item: int) -> tuple[int, int]:
    """(tk, tk1) for a tm × tn output tile: the L0 k tile as large as L0A and L0B allow (up to 256, 512 for
    int8), the L1 k tile the deepest multiple of it whose A and B slices fit L1 (K need not divide it: pypto
    runs a shorter last step; every L1 step costs a fixed copy each of A and B)."""
    tk = min(256 if item > 1 else 512, round_up(max(k, 1), 32 if item == 1 else 16))
    while (tm * tk * item > L0A_BYTES or tk * tn * item > L0B_BYTES) and tk > (32 if item == 1 else 16):
        tk //= 2
    return tk, max(tk, min(round_up(k, tk), _PTO_L1_BYTES // ((tm + tn) * item) // tk * tk))


def _pto_cube_plan(rows: int, br: int, slices: int, k: int, n: int, dtype: str, blocks: int = 0) -> _CubePlan:
    """The plan for `slices` products [br, k]·[k, n] per row block of `rows` rows, by an estimate of pypto
    0.2.0's cost model: a task streams its A and B slices into L1 one copy at a time (a fixed cost per copy,
    so the L1 k tile is as deep as L1 holds), a core runs its tasks in rounds with a gap between them, and the
    AICPU schedules every task. Output tiles n 128 to 256 wide in steps of 32, and the merge count, minimise
    the estimate (ties: fewer tasks); 64 and 96 wide tiles won it for all-off qr_proj, whose 72 tasks' total
    work it leaves out (46.5 → 51.7 µs). Flash TP4 (µs alone, default / all-off row blocks): qr_proj 42.0 →
    29.1 / 138 → 51, qproj (i8) 59.6 → 28.5 / 90 → 37, kv_proj 49.4 → 27.5 / 86 → 42 against `cube_shapes`;
    tiles 160-224 wide: kv_proj → 27.1 / 38.6, all-off qr_proj 46.5 → 44.9. With the task's SPMD `blocks`
    given, the estimate is also at least the schedule's ceil(blocks / cube cores) rounds of work / blocks (the
    work: each task and its gap), which favours fewer, larger tasks when blocks exceed the cores."""
    item = ITEMSIZE[dtype]
    align = 32 if item == 1 else 16
    tm = min(128, round_up(max(br, 1), 16))
    groups = ceil_div(rows, br) * slices * ceil_div(br, tm)   # output-tile rows, each sharing one A slice
    best = None
    for tn in sorted({min(t, round_up(max(n, 1), align)) for t in range(128, 257, 32)}):
        if tm * tn * 4 > L0C_BYTES:
            continue
        tk, tk1 = _pto_k_tiles(tm, tn, k, item)
        steps, tiles = ceil_div(k, tk1), ceil_div(n, tn)
        for merge in range(1, tiles + 1):
            tasks = groups * ceil_div(tiles, merge)
            task = steps * (_pto_copy_cycles(tm * tk1 * item) + merge * _pto_copy_cycles(tk1 * tn * item))
            cost = ceil_div(tasks, _PTO_CUBE_CORES) * (task + _PTO_ROUND_CYCLES) + tasks * _PTO_TASK_CYCLES
            if blocks:
                cost = max(cost, ceil_div(blocks, _PTO_CUBE_CORES) * tasks * (task + _PTO_ROUND_CYCLES) / blocks)
            if best is None or (cost, tasks) < best[:2]:
                best = (cost, tasks, _CubePlan(tm, tk, tk1, tn, merge))
    return best[2]


def _pto_cube_setup(src: Src, plan: _CubePlan) -> None:
    """Emit the plan's task grouping and cube tiles (before the block's matmuls)."""
    src(f"pypto.set_pass_options(cube_l1_reuse_setting={{-1: {plan.merge}}})")
    src(f"pypto.set_cube_tile_shapes({plan.shapes()})")


_PTO_ACC_TILE_BYTES = 64 * 1024  # f32 tiles of the atomic adds: fewer vector tasks after the cube phase

_pto_OUT = {"f32": "pypto.DT_FP32", "bf16": "pypto.DT_BF16", "fp16": "pypto.DT_FP16", "i32": "pypto.DT_INT32"}


def _pto_acc_tile(plan: _CubePlan, br: int, width: int) -> list[int]:
    """The vector tile of the atomic adds in a column block: the cube's row tile by the block, ≤ 64 KiB f32."""
    return vec_tile((min(br, plan.tm), width), 4, _PTO_ACC_TILE_BYTES)


@dataclass(frozen=True)
class _ColBlock:
    """One iteration's block of `_pto_block_loop`: offset expression, width, valid width when partial."""

    c0: str
    width: int
    valid: str | None


@contextmanager
def _pto_block_loop(src: Src, extent: int, block: int,
                    names=("cols_loop", "nb", "c0", "cv")) -> Iterator[_ColBlock]:
    """A `pypto.loop` over a static extent in blocks (none when one block covers it); `names` are the loop's,
    its index's, the block offset's and its valid extent's (emitted for a partial last block)."""
    loop, idx, offset, valid = names
    if extent <= block:
        yield _ColBlock("0", extent, None)
        return
    with src.block(f"for {idx} in pypto.loop(0, {ceil_div(extent, block)}, 1, name=\"{loop}\", idx_name=\"{idx}\"):"):
        src(f"{offset} = {idx} * {block}")
        if extent % block:
            src(f"{valid} = pypto.min({extent} - {offset}, {block})")
        yield _ColBlock(offset, block, valid if extent % block else None)


def _pto_col_loop(src: Src, n: int, block: int):
    """The loop over n in blocks of the plan's task width (merge · tn), so each iteration's products are one
    pypto task per K slice and its adds wait for those alone. A root function whose tasks share an operand view
    starts them through a hub task, and adds over several blocks wait for all of them through another: each a
    link of ~3 µs in the chain (flash TP4 qr_proj 29.1 → 20.6 µs)."""
    return _pto_block_loop(src, n, block)


def _pto_view(name: str, shape: list, offsets: list, valid: list) -> str:
    """`pypto.view` source; the valid shape only when it differs from the shape."""
    tail = f", valid_shape={py_list(valid)}" if [str(v) for v in valid] != [str(x) for x in shape] else ""
    return f"pypto.view({name}, {py_list(shape)}, {py_list(offsets)}{tail})"


def _pto_split_bounds(extent: int, splits: int) -> list[tuple[int, int]]:
    """Contiguous K slices exactly as the reference cuts them (np.linspace bounds)."""
    bounds = np.linspace(0, extent, splits + 1).astype(int)
    return [(int(bounds[i]), int(bounds[i + 1])) for i in range(splits)]


@template(Matmul)
def pypto_matmul(spec: KernelSpec) -> str:
    a, b = spec.operands[:2]
    acc = spec.operands[2] if len(spec.operands) > 2 else None
    out = spec.results[0]
    trans_b = bool(spec.attrs.get("trans_b", False))
    m, k = a.shape
    n = b.shape[0] if trans_b else b.shape[1]
    src = Src(spec.signature())
    default_rows = 64 if (a.is_dynamic(0) or m > 128) else m
    loop = RowLoop(src, a, row_block(spec, default=default_rows))
    br = loop.shape(a)[0]
    splits = _pto_split_bounds(k, int(spec.attrs.get("k_split", 1))) if acc is not None else [(0, k)]
    k_tile = max(hi - lo for lo, hi in splits)
    trans = ", b_trans=True" if trans_b else ""
    plan = _pto_cube_plan(m, br, len(splits), k_tile, n, a.dtype)
    r0 = "r0" if loop.looped else "0"
    rows_valid = "valid" if loop.looped and loop.partial else br
    with loop.loop(), _pto_col_loop(src, n, plan.merge * plan.tn) as col:
        _pto_cube_setup(src, plan)
        cols_valid = col.valid or col.width

        def b_part(lo: int, hi: int) -> str:
            if (lo, hi) == (0, k) and col.width == n:
                return b.name
            if trans_b:
                return _pto_view(b.name, [col.width, hi - lo], [col.c0, lo], [cols_valid, hi - lo])
            return _pto_view(b.name, [hi - lo, col.width], [lo, col.c0], [hi - lo, cols_valid])

        def block(t) -> str:
            return _pto_view(t.name, [br, col.width], [r0, col.c0], [rows_valid, cols_valid])

        def store(value: str) -> None:
            src(f"pypto.assemble({value}, [{r0}, {col.c0}], {out.name})")

        if acc is None:
            src(f"c = pypto.matmul({loop.view(a)}, {b_part(0, k)}, {_pto_OUT[out.dtype]}{trans})")
            store("c")
            return src.text()
        for s, (lo, hi) in enumerate(splits):
            a_part = loop.view(a) if (lo, hi) == (0, k) else _pto_cols(loop, a, lo, hi - lo)
            src(f"p{s} = pypto.matmul({a_part}, {b_part(lo, hi)}, pypto.DT_FP32{trans})")
        src(f"pypto.set_vec_tile_shapes({', '.join(map(str, _pto_acc_tile(plan, br, col.width)))})")
        src(f"total = {block(acc) if col.width < n else loop.view(acc)}")
        for s in range(len(splits)):
            src(f"total = pypto.add(total, p{s})")
        store("total")  # the in-place result: same buffer as `acc`, written through its own parameter
    return src.text()


def _pto_cols(loop: RowLoop, t, start: int, size: int) -> str:
    """The block's view of columns [start, start + size) of a 2-D operand."""
    rows = loop.shape(t)[0]
    r0 = "r0" if loop.looped else "0"
    valid = f", valid_shape=[valid, {size}]" if loop.looped and loop.partial else ""
    return f"pypto.view({t.name}, [{rows}, {size}], [{r0}, {start}]{valid})"

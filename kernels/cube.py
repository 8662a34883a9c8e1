"""Cube-side building blocks of the pypto 0.2.0 templates: cube tile plans by an estimate of pypto 0.2.0's cost
model, column-block loops and views, shared by the matmul, splitk, oproj, compressor, indexer and sparse templates.

* `pto_cube_plan` / `pto_cube_setup` (`CubePlan`): the tiles and task merging of the matmul family's row blocks.
* `pto_cube_shapes`, `pto_cube_shapes_spread`, `pto_cube_tiles_filled`, `pto_cube_args`: the O projections'
  deep-L1 tiles (and their whole-kernel variants).
* `pto_k_tiles`, `pto_block_loop` / `pto_col_loop` (`ColBlock`), `pto_view`, `pto_split_bounds`.
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import numpy as np

from dspark_ir.hardware import HARDWARE

from .pto import ITEMSIZE, L0A_BYTES, L0B_BYTES, L0C_BYTES, Src, ceil_div, py_list, round_up

_PTO_CUBE_CORES = HARDWARE.cube_cores
_PTO_L1_BYTES = HARDWARE.l1_bytes  # L1: the A and B slices of one L1 k step (single-buffered; beyond it pypto spills)
# the O projections' L1 share of one cube tile's A and B slices (576 KiB overflows)
_PTO_L1_SHARE_BYTES = HARDWARE.l1_bytes * 3 // 4
# cost model: fixed cycles of one copy into L1 / UB (one MTE_IN pipe per core) ...
_PTO_COPY_CYCLES = HARDWARE.copy_in_cycles
_PTO_COPY_BYTES_PER_CYCLE = HARDWARE.copy_in_bytes_per_cycle  # ... plus its bytes at this rate
_PTO_ROUND_CYCLES = HARDWARE.task_round_cycles  # the gap before a core's next task (dispatch and start latency)
_PTO_TASK_CYCLES = HARDWARE.task_schedule_cycles  # the AICPU's scheduling per task (serial over the kernel's tasks)


@dataclass(frozen=True)
class CubePlan:
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


def pto_k_tiles(tm: int, tn: int, k: int, item: int) -> tuple[int, int]:
    """(tk, tk1) for a tm × tn output tile: the L0 k tile as large as L0A and L0B allow (up to 256, 512 for
    int8), the L1 k tile the deepest multiple of it whose A and B slices fit L1 (K need not divide it: pypto
    runs a shorter last step; every L1 step costs a fixed copy each of A and B)."""
    tk = min(256 if item > 1 else 512, round_up(max(k, 1), 32 if item == 1 else 16))
    while (tm * tk * item > L0A_BYTES or tk * tn * item > L0B_BYTES) and tk > (32 if item == 1 else 16):
        tk //= 2
    return tk, max(tk, min(round_up(k, tk), _PTO_L1_BYTES // ((tm + tn) * item) // tk * tk))


def pto_cube_plan(rows: int, br: int, slices: int, k: int, n: int, dtype: str, blocks: int = 0) -> CubePlan:
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
        tk, tk1 = pto_k_tiles(tm, tn, k, item)
        steps, tiles = ceil_div(k, tk1), ceil_div(n, tn)
        for merge in range(1, tiles + 1):
            tasks = groups * ceil_div(tiles, merge)
            task = steps * (_pto_copy_cycles(tm * tk1 * item) + merge * _pto_copy_cycles(tk1 * tn * item))
            cost = ceil_div(tasks, _PTO_CUBE_CORES) * (task + _PTO_ROUND_CYCLES) + tasks * _PTO_TASK_CYCLES
            if blocks:
                cost = max(cost, ceil_div(blocks, _PTO_CUBE_CORES) * tasks * (task + _PTO_ROUND_CYCLES) / blocks)
            if best is None or (cost, tasks) < best[:2]:
                best = (cost, tasks, CubePlan(tm, tk, tk1, tn, merge))
    return best[2]


def pto_cube_setup(src: Src, plan: CubePlan) -> None:
    """Emit the plan's task grouping and cube tiles (before the block's matmuls)."""
    src(f"pypto.set_pass_options(cube_l1_reuse_setting={{-1: {plan.merge}}})")
    src(f"pypto.set_cube_tile_shapes({plan.shapes()})")


@dataclass(frozen=True)
class ColBlock:
    """One iteration's block of `pto_block_loop`: offset expression, width, valid width when partial."""

    c0: str
    width: int
    valid: str | None


@contextmanager
def pto_block_loop(src: Src, extent: int, block: int,
                    names=("cols_loop", "nb", "c0", "cv")) -> Iterator[ColBlock]:
    """A `pypto.loop` over a static extent in blocks (none when one block covers it); `names` are the loop's,
    its index's, the block offset's and its valid extent's (emitted for a partial last block)."""
    loop, idx, offset, valid = names
    if extent <= block:
        yield ColBlock("0", extent, None)
        return
    with src.block(f"for {idx} in pypto.loop(0, {ceil_div(extent, block)}, 1, name=\"{loop}\", idx_name=\"{idx}\"):"):
        src(f"{offset} = {idx} * {block}")
        if extent % block:
            src(f"{valid} = pypto.min({extent} - {offset}, {block})")
        yield ColBlock(offset, block, valid if extent % block else None)


def pto_col_loop(src: Src, n: int, block: int):
    """The loop over n in blocks of the plan's task width (merge · tn), so each iteration's products are one
    pypto task per K slice and its adds wait for those alone. A root function whose tasks share an operand view
    starts them through a hub task, and adds over several blocks wait for all of them through another: each a
    link of ~3 µs in the chain (flash TP4 qr_proj 29.1 → 20.6 µs)."""
    return pto_block_loop(src, n, block)


def pto_view(name: str, shape: list, offsets: list, valid: list) -> str:
    """`pypto.view` source; the valid shape only when it differs from the shape."""
    tail = f", valid_shape={py_list(valid)}" if [str(v) for v in valid] != [str(x) for x in shape] else ""
    return f"pypto.view({name}, {py_list(shape)}, {py_list(offsets)}{tail})"


def pto_split_bounds(extent: int, splits: int) -> list[tuple[int, int]]:
    """Contiguous K slices exactly as the reference cuts them (np.linspace bounds)."""
    bounds = np.linspace(0, extent, splits + 1).astype(int)
    return [(int(bounds[i]), int(bounds[i + 1])) for i in range(splits)]


def _pto_cube_tiles(m: int, k: int, n: int, dtype: str, tm_cap: int = 128, tn_cap: int = 256):
    """(tm, tk, tk1, tn) of `pto_cube_shapes` with output tiles of up to tm_cap × tn_cap."""
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
    while tk1 * 2 <= min(1024, round_up(k, tk)) and (tm + tn) * tk1 * 2 * item <= _PTO_L1_SHARE_BYTES:
        tk1 *= 2
    return tm, tk, tk1, tn


def pto_cube_shapes(m: int, k: int, n: int, dtype: str) -> str:
    """`set_cube_tile_shapes` for the O projections' [m,k]·[k,n]: output tiles of up to 128 × 256, the L0 k
    tile as large as L0B allows, and an L1 k tile of up to 1024 (as many L0 k steps as the A and B slices fit in
    L1). In pypto 0.2.0's cost model every L1 k step costs a fixed reload, so the deep L1 tile halves the cube
    time (flash TP4 o_proj_a 90 → 45 µs, o_proj_b 60 → 33 µs against `cube_shapes`)."""
    return pto_cube_args(*_pto_cube_tiles(m, k, n, dtype))


def pto_cube_args(tm: int, tk: int, tk1: int, tn: int) -> str:
    return f"[{tm}, {tm}], [{tk}, {tk1}], [{tn}, {tn}]"


def pto_cube_shapes_spread(m: int, k: int, n: int, dtype: str, matmuls: int = 1) -> str:
    """`pto_cube_shapes` with the output tile chosen for the whole kernel: each of the `matmuls` products
    [m,k]·[k,n] runs one pypto task per output tile, and a task's time is its L1 copies (a fixed cost each, then
    bandwidth: the A and B slices of every L1 k step), so the tile minimising waves × task time over the cube
    cores wins (smaller tiles than 128 × 256 when that leaves cores idle; kernels.compressor's
    kv_score_proj)."""
    item = ITEMSIZE[dtype]

    def time(tiles):
        tm, _tk, tk1, tn = tiles
        tasks = matmuls * ceil_div(m, tm) * ceil_div(n, tn)
        copy = 2 * ceil_div(k, tk1) * _PTO_COPY_CYCLES + (tm + tn) * k * item / _PTO_COPY_BYTES_PER_CYCLE
        return ceil_div(tasks, _PTO_CUBE_CORES) * copy, tasks

    options = {_pto_cube_tiles(m, k, n, dtype, tm_cap, tn_cap) for tm_cap in (128, 64, 32) for tn_cap in (256, 128, 64)}
    return pto_cube_args(*min(options, key=lambda t: (time(t), -t[0], -t[3])))


def pto_cube_tiles_filled(m: int, k: int, n: int, dtype: str):
    """(tm, tk, tk1, tn) for [m,k]·[k,n], one pypto task per output tile: every 16-aligned output tile up to
    256 × 256 (32-aligned n for int8) that fits L0C, its k tiles those of `pto_k_tiles`. A task's time is its
    L1 copies (a fixed cost each, then bandwidth), so the tiles minimising waves × task time over the cube
    cores, plus the AICPU's scheduling, win; ties: fewer tasks, then whole column blocks of the right operand
    (a partial one at a group's row offset slowed the AICPU's dispatch: flash TP4 o_proj_a group 1, 128 × 176
    tiles 37.1 µs, 176 × 128 tiles 32.3 µs). Output tiles sized to fill the cube cores once beat 128 × 256
    tiles that leave cores idle."""
    item = ITEMSIZE[dtype]
    align = 32 if item == 1 else 16

    def plan(tm, tn):
        tk, tk1 = pto_k_tiles(tm, tn, k, item)
        tasks = ceil_div(m, tm) * ceil_div(n, tn)
        task = 2 * ceil_div(k, tk1) * _PTO_COPY_CYCLES + (tm + tn) * k * item / _PTO_COPY_BYTES_PER_CYCLE
        cost = ceil_div(tasks, _PTO_CUBE_CORES) * task + tasks * _PTO_TASK_CYCLES
        return cost, tasks, n % tn != 0, (tm, tk, tk1, tn)

    plans = [plan(tm, tn) for tm in range(16, min(256, round_up(max(m, 1), 16)) + 1, 16)
             for tn in range(align, min(256, round_up(max(n, 1), align)) + 1, align) if tm * tn * 4 <= L0C_BYTES]
    return min(plans)[-1]

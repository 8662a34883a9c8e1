"""pypto 0.2.0 templates of the matmul kernel family (the ops' numpy semantics: dspark_ir/semantics/matmul.py)."""
from __future__ import annotations

# ---- pypto 0.2.0 template ------------------------------------------------------------------------
# Source generator for the lowering (see kernels/pto.py). Mirrors `matmul` above: bf16/fp16 x bf16/fp16
# and int8 x int8 (-> int32) on the cube; an atomic task adds each of its k_split contiguous K slices into
# the seeded f32 accumulator, in ascending split order (the reference order). The row block is the IR's
# tile; inside it the cube tiles and pypto's task grouping are planned for pypto 0.2.0's cost model
# (`pto_cube_plan`).
from dspark_ir.ops.core import Matmul

from .cube import CubePlan, pto_col_loop, pto_cube_plan, pto_cube_setup, pto_split_bounds, pto_view
from .pto import WIDE_VEC_TILE_BYTES, KernelSpec, RowLoop, Src, row_block, vec_tile
from .registry import template

_PTO_ACC_TILE_BYTES = WIDE_VEC_TILE_BYTES  # f32 tiles of the atomic adds: fewer vector tasks after the cube phase

_pto_OUT = {"f32": "pypto.DT_FP32", "bf16": "pypto.DT_BF16", "fp16": "pypto.DT_FP16", "i32": "pypto.DT_INT32"}


def _pto_acc_tile(plan: CubePlan, br: int, width: int) -> list[int]:
    """The vector tile of the atomic adds in a column block: the cube's row tile by the block, ≤ 64 KiB f32."""
    return vec_tile((min(br, plan.tm), width), 4, _PTO_ACC_TILE_BYTES)


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
    splits = pto_split_bounds(k, int(spec.attrs.get("k_split", 1))) if acc is not None else [(0, k)]
    k_tile = max(hi - lo for lo, hi in splits)
    trans = ", b_trans=True" if trans_b else ""
    plan = pto_cube_plan(m, br, len(splits), k_tile, n, a.dtype)
    r0 = "r0" if loop.looped else "0"
    rows_valid = "valid" if loop.looped and loop.partial else br
    with loop.loop(), pto_col_loop(src, n, plan.merge * plan.tn) as col:
        pto_cube_setup(src, plan)
        cols_valid = col.valid or col.width

        def b_part(lo: int, hi: int) -> str:
            if (lo, hi) == (0, k) and col.width == n:
                return b.name
            if trans_b:
                return pto_view(b.name, [col.width, hi - lo], [col.c0, lo], [cols_valid, hi - lo])
            return pto_view(b.name, [hi - lo, col.width], [lo, col.c0], [hi - lo, cols_valid])

        def block(t) -> str:
            return pto_view(t.name, [br, col.width], [r0, col.c0], [rows_valid, cols_valid])

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

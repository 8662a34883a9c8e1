"""Matmul kernels: numpy references (the pypto templates live beside them)."""
from __future__ import annotations

import numpy as np

from ._np import as_dtype, f32


def matmul(a, b, acc=None, *, out="f32", trans_b=False, k_split=1, split_order=None, **_):
    """a @ b. With `acc` (atomic accumulation) each of the `k_split` contiguous K slices is added to
    `acc` in f32, in `split_order` (default ascending: the reference order of an atomic reduction)."""
    a_np, b_np = np.asarray(a), np.asarray(b)
    if trans_b:
        b_np = b_np.T
    if a_np.dtype == np.int8 and b_np.dtype == np.int8:
        return as_dtype(a_np.astype(np.int64) @ b_np.astype(np.int64), out)
    if acc is None:
        return as_dtype(f32(a_np) @ f32(b_np), out)
    total = f32(acc).copy()
    bounds = np.linspace(0, a_np.shape[1], k_split + 1).astype(int)
    for k in (split_order if split_order is not None else range(k_split)):
        lo, hi = bounds[k], bounds[k + 1]
        total = total + f32(a_np[:, lo:hi]) @ f32(b_np[lo:hi])
    return total


# ---- pypto 0.2.0 template ------------------------------------------------------------------------
# Source generator for the lowering (see kernels/_pypto.py). Mirrors `matmul` above: bf16/fp16 x bf16/fp16
# and int8 x int8 (-> int32) on the cube; an atomic task adds each of its k_split contiguous K slices into
# the seeded f32 accumulator, in ascending split order (the reference order).
from ._pypto import KernelSpec, RowLoop, Src, cube_shapes, py_list, row_block, vec_tile  # noqa: E402

_pto_OUT = {"f32": "pypto.DT_FP32", "bf16": "pypto.DT_BF16", "fp16": "pypto.DT_FP16", "i32": "pypto.DT_INT32"}


def _pto_split_bounds(extent: int, splits: int) -> list[tuple[int, int]]:
    """Contiguous K slices exactly as the reference cuts them (np.linspace bounds)."""
    bounds = np.linspace(0, extent, splits + 1).astype(int)
    return [(int(bounds[i]), int(bounds[i + 1])) for i in range(splits)]


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
    with loop.loop():
        src(f"pypto.set_cube_tile_shapes({cube_shapes(br, k_tile, n, a.dtype)})")
        if acc is None:
            dt = _pto_OUT[out.dtype]
            src(f"c = pypto.matmul({loop.view(a)}, {b.name}, {dt}{trans})")
            loop.store("c", out)
            return src.text()
        for s, (lo, hi) in enumerate(splits):
            a_part = loop.view(a) if (lo, hi) == (0, k) else _pto_cols(loop, a, lo, hi - lo)
            b_shape, b_off = ([n, hi - lo], [0, lo]) if trans_b else ([hi - lo, n], [lo, 0])
            b_part = b.name if (lo, hi) == (0, k) else f"pypto.view({b.name}, {py_list(b_shape)}, {py_list(b_off)})"
            src(f"p{s} = pypto.matmul({a_part}, {b_part}, pypto.DT_FP32{trans})")
        src(f"pypto.set_vec_tile_shapes({', '.join(map(str, vec_tile((br, n), 4)))})")
        src(f"total = {loop.view(acc)}")
        for s in range(len(splits)):
            src(f"total = pypto.add(total, p{s})")
        loop.store("total", out)  # the in-place result: same buffer as `acc`, written through its own parameter
    return src.text()


def _pto_cols(loop: RowLoop, t, start: int, size: int) -> str:
    """The block's view of columns [start, start + size) of a 2-D operand."""
    rows = loop.shape(t)[0]
    r0 = "r0" if loop.looped else "0"
    valid = f", valid_shape=[valid, {size}]" if loop.looped and loop.partial else ""
    return f"pypto.view({t.name}, [{rows}, {size}], [{r0}, {start}]{valid})"


PYPTO_TEMPLATES = {"matmul": pypto_matmul}

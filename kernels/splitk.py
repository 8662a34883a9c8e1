"""pypto 0.2.0 templates of the splitk kernel family (the ops' numpy semantics: dspark_ir/semantics/splitk.py)."""
from __future__ import annotations

import numpy as np

# ---- pypto 0.2.0 template ------------------------------------------------------------------------
# Source generators for the lowering (see kernels/pto.py).
# * matmul_partials: per row block, one cube matmul per contiguous K slice (the np.linspace cut of the
#   reference), each f32 product assembled into its own row block s·M + m of the partials buffer. The
#   cube sums a slice in its own order, so the partials equal the reference bit for bit only where every
#   sum is exact (otherwise to f32 summation-order rounding).
# * split_reduce: the op is hc_pre_linear_reduce under another name (same attributes, same reference), so
#   it reuses that template: the k_split row blocks added in ascending split order, bitwise.
from dspark_ir.ops.splitk import MatmulPartials, SplitReduce

from .cube import pto_cube_plan, pto_cube_setup
from .hc import pypto_hc_pre_linear_reduce
from .pto import KernelSpec, RowLoop, Src, py_list, vec_tile
from .registry import template


def _pto_split_bounds(extent: int, splits: int) -> list[tuple[int, int]]:
    bounds = np.linspace(0, extent, splits + 1).astype(int)   # the reference's cut
    return [(int(bounds[i]), int(bounds[i + 1])) for i in range(splits)]


@template(MatmulPartials)
def pypto_matmul_partials(spec: KernelSpec) -> str:
    a, b = spec.operands
    out = spec.results[0]
    trans_b = bool(spec.attrs.get("trans_b", False))
    m, k = a.shape
    n = b.shape[0] if trans_b else b.shape[1]
    splits = _pto_split_bounds(k, int(spec.attrs.get("k_split", 1)))
    src = Src(spec.signature())
    # one block of up to 64 rows per loop iteration (fewer task chains than the IR's SPMD m-tile; the cube
    # tiles and task grouping inside the block: `pto_cube_plan`)
    loop = RowLoop(src, a, 64 if (a.is_dynamic(0) or m > 128) else m)
    br = loop.shape(a)[0]
    rows = f"{a.name}.shape[0]" if a.is_dynamic(0) else str(m)
    r0 = "r0" if loop.looped else "0"
    valid = loop.looped and loop.partial
    trans = ", b_trans=True" if trans_b else ""
    k_tile = max(hi - lo for lo, hi in splits)
    plan = pto_cube_plan(m, br, len(splits), k_tile, n, a.dtype)
    with loop.loop():
        pto_cube_setup(src, plan)
        for s, (lo, hi) in enumerate(splits):
            if (lo, hi) == (0, k):
                a_part, b_part = loop.view(a), b.name
            else:
                vs = f", valid_shape=[valid, {hi - lo}]" if valid else ""
                a_part = f"pypto.view({a.name}, [{br}, {hi - lo}], [{r0}, {lo}]{vs})"
                b_shape, b_off = ([n, hi - lo], [0, lo]) if trans_b else ([hi - lo, n], [lo, 0])
                b_part = f"pypto.view({b.name}, {py_list(b_shape)}, {py_list(b_off)})"
            src(f"p{s} = pypto.matmul({a_part}, {b_part}, pypto.DT_FP32{trans})")
        src(f"pypto.set_vec_tile_shapes({', '.join(map(str, vec_tile((br, n), 4)))})")
        for s in range(len(splits)):
            row = f"{s} * {rows} + {r0}" if s else r0
            src(f"pypto.assemble(p{s}, [{row}, 0], {out.name})")
    return src.text()

template(SplitReduce)(pypto_hc_pre_linear_reduce)

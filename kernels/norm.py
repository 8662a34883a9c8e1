"""pypto 0.2.0 templates of the norm kernel family (the ops' numpy semantics: dspark_ir/semantics/norm.py)."""
from __future__ import annotations

# ---- pypto 0.2.0 template ------------------------------------------------------------------------
# Source generator for the lowering (see kernels/pto.py); mirrors `rmsnorm` above: fp32 math,
# x · inv first, then · w, one bf16 rounding. Each row block is one forced subgraph with ≤ 64 KiB f32 tiles.
from dspark_ir.ops.core import RmsNorm

from .pto import WIDE_VEC_TILE_BYTES, KernelSpec, RowLoop, Src, cast_expr, py_list, row_block, vec_tile
from .registry import template


def pto_rmsnorm_rows(src: Src, width: int, eps: float, out_dtype: str, result: str) -> None:
    """Emit rmsnorm's math on the f32 rows `xf` [.., width] and the f32 weight row `wf`: 1/rms per row, x · inv
    first, then · w, one rounding to `out_dtype`, bound to `result`."""
    src("sq = pypto.sum(pypto.mul(xf, xf), -1, keepdim=True)")
    src(f"inv = pypto.rsqrt(pypto.add(pypto.mul(sq, {1.0 / width!r}), {eps!r}))")
    src(f"{result} = {cast_expr('pypto.mul(pypto.mul(xf, inv), wf)', 'f32', out_dtype)}")


@template(RmsNorm)
def pypto_rmsnorm(spec: KernelSpec) -> str:
    x, w = spec.operands[:2]
    out = spec.results[0]
    width = x.shape[-1]
    eps = float(spec.attrs.get("eps", 1e-6))
    src = Src(spec.signature())
    loop = RowLoop(src, x, row_block(spec, default=8))
    tile = vec_tile(tuple(loop.shape(x)), 4, budget=WIDE_VEC_TILE_BYTES)
    with loop.loop():
        src("pypto.set_pass_options(sg_set_scope=1)")  # one task per row block (flash attn.rms_norm 36 → 5 µs)
        src(f"pypto.set_vec_tile_shapes({', '.join(map(str, tile))})")
        src(f"xf = {cast_expr(loop.view(x), x.dtype, 'f32')}")
        w_shape = py_list([1] * (x.rank - 1) + [width])
        src(f"wf = {cast_expr(f'pypto.reshape({w.name}, {w_shape})', w.dtype, 'f32')}")
        pto_rmsnorm_rows(src, width, eps, out.dtype, result="y")
        loop.store("y", out)
        src("pypto.set_pass_options(sg_set_scope=-1)")
    return src.text()

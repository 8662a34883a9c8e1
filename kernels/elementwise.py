"""pypto 0.2.0 templates of the elementwise kernel family.

The ops' numpy semantics: dspark_ir/semantics/elementwise.py.
"""
from __future__ import annotations

# ---- pypto 0.2.0 template ------------------------------------------------------------------------
# Source generators for the lowering (see kernels/pto.py). The numpy references above define the
# numbers; each template mirrors its reference's op order and rounding points.
from dspark_ir.ops.core import Add, Cast, Concat, Mul, Reshape, Slice, Zeros

from .pto import BLOCK_BYTES, KernelSpec, RowLoop, Src, cast_expr, py_list, row_block, vec_tile
from .registry import template
from .vector import pto_align

_pto_BINARY = {"add": "pypto.add", "mul": "pypto.mul"}


@template(Add, Mul)
def pypto_binary(spec: KernelSpec) -> str:
    """add / mul: fp32 math, one rounding back to the operand dtype (integers stay integer)."""
    a, b = spec.operands[:2]
    out = spec.results[0]
    src = Src(spec.signature())
    loop = RowLoop(src, a, row_block(spec, default=16))
    floating = a.dtype in ("bf16", "fp16", "f32")
    with loop.loop():
        src(f"pypto.set_vec_tile_shapes({', '.join(map(str, vec_tile(tuple(loop.shape(a)), 4)))})")
        if floating:
            src(f"av = {cast_expr(loop.view(a), a.dtype, 'f32')}")
            src(f"bv = {cast_expr(loop.view(b), b.dtype, 'f32')}")
            src(f"y = {cast_expr(f'{_pto_BINARY[spec.op]}(av, bv)', 'f32', out.dtype)}")
        else:
            src(f"y = {_pto_BINARY[spec.op]}({loop.view(a)}, {loop.view(b)})")
        loop.store("y", out)
    return src.text()


@template(Cast)
def pypto_cast(spec: KernelSpec) -> str:
    """cast: floats narrow with round-to-nearest-even, floats to integers with rint (like `cast`)."""
    x = spec.operands[0]
    out = spec.results[0]
    src = Src(spec.signature())
    loop = RowLoop(src, x, row_block(spec, default=16))
    with loop.loop():
        src(f"pypto.set_vec_tile_shapes({', '.join(map(str, vec_tile(tuple(loop.shape(x)), 4)))})")
        src(f"y = {cast_expr(loop.view(x), x.dtype, out.dtype)}")
        loop.store("y", out)
    return src.text()


@template(Zeros)
def pypto_zeros(spec: KernelSpec) -> str:
    """zeros: the seed of an accumulation, filled block by block."""
    out = spec.results[0]
    src = Src(spec.signature())
    loop = RowLoop(src, out, row_block(spec, default=16))
    fill = "pypto.DT_INT32" if out.dtype in ("i8", "i32", "i64") else "pypto.DT_FP32"
    value = "0" if fill == "pypto.DT_INT32" else "0.0"
    shape = loop.shape(out)
    with loop.loop():
        src(f"pypto.set_vec_tile_shapes({', '.join(map(str, vec_tile(tuple(shape), 4)))})")
        valid = ""
        if loop.looped and loop.partial:
            valid = f", valid_shape={py_list(['valid'] + [str(s) for s in out.shape[1:]])}"
        src(f"z = pypto.full({py_list(shape)}, {value}, {fill}{valid})")
        dst = "i32" if fill == "pypto.DT_INT32" else "f32"
        src(f"y = {cast_expr('z', dst, out.dtype)}")
        loop.store("y", out)
    return src.text()


@template(Reshape)
def pypto_reshape(spec: KernelSpec) -> str:
    """reshape as a copy task (when no strided view of the operand expresses it)."""
    spec = spec.static()
    x, out = spec.operands[0], spec.results[0]
    src = Src(spec.signature())
    src(f"pypto.set_vec_tile_shapes({', '.join(map(str, vec_tile(x.shape, x.itemsize)))})")
    src(f"y = pypto.reshape({x.name}, {py_list(out.shape)})")
    src(f"pypto.set_vec_tile_shapes({', '.join(map(str, vec_tile(out.shape, out.itemsize)))})")
    src(f"pypto.assemble(pypto.clone(y), {py_list([0] * out.rank)}, {out.name})")
    return src.text()


@template(Concat)
def pypto_concat(spec: KernelSpec) -> str:
    """concat as a copy task: each operand assembled at its offset along the axis."""
    spec = spec.static()
    out = spec.results[0]
    axis = int(spec.attrs["axis"])
    src = Src(spec.signature())
    offset = 0
    for x in spec.operands:
        offsets = [0] * out.rank
        offsets[axis] = offset
        src(f"pypto.set_vec_tile_shapes({', '.join(map(str, vec_tile(x.shape, x.itemsize)))})")
        src(f"pypto.assemble(pypto.clone({x.name}), {py_list(offsets)}, {out.name})")
        offset += x.shape[axis]
    return src.text()


@template(Slice)
def pypto_slice(spec: KernelSpec) -> str:
    """slice as a copy task: the operand's view at `start` along `axis`, assembled whole into the result (bitwise).
    The lowering makes a slice a strided view of its operand (no task); this is its form as a kernel of its own,
    for a view rule that declines."""
    spec = spec.static()
    x, out = spec.operands[0], spec.results[0]
    offsets = [0] * out.rank
    offsets[int(spec.attrs["axis"])] = int(spec.attrs["start"])
    tile = vec_tile(out.shape, out.itemsize)
    tile[-1] = pto_align(tile[-1], BLOCK_BYTES // out.itemsize)   # a narrow slice's tile still spans 32-byte blocks
    src = Src(spec.signature())
    src(f"pypto.set_vec_tile_shapes({', '.join(map(str, tile))})")
    src(f"y = pypto.view({x.name}, {py_list(out.shape)}, {py_list(offsets)})")
    src(f"pypto.assemble(pypto.clone(y), {py_list([0] * out.rank)}, {out.name})")
    return src.text()


def pypto_copy(spec: KernelSpec) -> str:
    """out = x, block by block (copies and in-place self-copies such as a WAR marker)."""
    x = spec.operands[0]
    out = spec.results[0]
    src = Src(spec.signature())
    loop = RowLoop(src, x, row_block(spec, default=16))
    with loop.loop():
        src(f"pypto.set_vec_tile_shapes({', '.join(map(str, vec_tile(tuple(loop.shape(x)), x.itemsize)))})")
        src(f"y = pypto.clone({loop.view(x)})")
        loop.store("y", out)
    return src.text()

"""pypto 0.2.0 templates of the wire kernel family (the CP compressor payloads' pack and unpack waves).

The ops' numpy semantics: dspark_ir/semantics/wire.py. Each f32 column pair is moved as its bits: pypto.view with a
`dtype` reinterprets a whole tensor's bytes (its shape and offsets are ignored), so each row block is cloned on chip
and that tile reinterpreted (f32[r, W] <-> bf16[r, 2·W]); both waves are bitwise copies, row block by row block.
cp_typed_readback (kernels/collective.py) is the unpack's loop run on the exchange window's rows.
"""
from __future__ import annotations

from dspark_ir.ops.wire import CpWirePack, CpWireUnpack

from .pto import WIDE_VEC_TILE_BYTES, KernelSpec, RowLoop, Src, vec_tile
from .registry import template

BLOCK_BYTES = 1 << 20     # rows per loop step: about a MiB of wire rows (as window_copy_out's copy)


def _rows_per_block(cols: int) -> int:
    return max(1, BLOCK_BYTES // (2 * max(1, cols)))


@template(CpWirePack)
def pypto_cp_wire_pack(spec: KernelSpec) -> str:
    """wire[:, 0:2W] = bits(values), wire[:, 2W:4W] = bits(scores), wire[:, 4W:] = kv, per row block."""
    values, scores, *kv = spec.operands
    wire = spec.results[0]
    width = values.shape[1]
    src = Src(spec.signature())
    loop = RowLoop(src, wire, _rows_per_block(wire.shape[1]))
    r0 = "r0" if loop.looped else "0"
    with loop.loop():
        n = loop.shape(wire)[0]
        valid = ", valid_shape=[valid, {c}]" if loop.looped and loop.partial else ""
        for col, part in ((0, values), (2 * width, scores)):
            # the dtype view reinterprets a whole tensor (pypto ignores its shape and offsets), so the block's rows
            # are cloned on chip first and their tile is reinterpreted: f32[n, W] -> bf16[n, 2W]
            src(f"pypto.set_vec_tile_shapes({', '.join(map(str, vec_tile((n, width), 4, WIDE_VEC_TILE_BYTES)))})")
            src(f"p = pypto.clone(pypto.view({part.name}, [{n}, {width}], [{r0}, 0]{valid.format(c=width)}))")
            src(f"pypto.assemble(pypto.view(p, dtype=pypto.DT_BF16), [{r0}, {col}], {wire.name})")
        for k in kv:
            cols = k.shape[1]
            src(f"pypto.set_vec_tile_shapes({', '.join(map(str, vec_tile((n, cols), 2, WIDE_VEC_TILE_BYTES)))})")
            src(f"y = pypto.clone(pypto.view({k.name}, [{n}, {cols}], [{r0}, 0]{valid.format(c=cols)}))")
            src(f"pypto.assemble(y, [{r0}, {4 * width}], {wire.name})")
    return src.text()


def unpack_source(spec: KernelSpec) -> str:
    """values = f32(wire[:, 0:2W]), scores = f32(wire[:, 2W:4W]), kv = wire[:, 4W:4W+K] over the results' rows
    (the wire operand may have more rows: a window's pad rows are not read)."""
    wire = spec.operands[0]
    values, scores, *kv = spec.results
    width = values.shape[1]
    src = Src(spec.signature())
    loop = RowLoop(src, values, _rows_per_block(wire.shape[1]))
    r0 = "r0" if loop.looped else "0"
    with loop.loop():
        n = loop.shape(values)[0]
        valid = ", valid_shape=[valid, {c}]" if loop.looped and loop.partial else ""
        # the dtype view reinterprets a whole tensor (pypto ignores its shape and offsets; on a dynamic-row
        # parameter it is refused at flash), so the block's value and score words are cloned on chip first and
        # that tile is reinterpreted: bf16[n, 4W] -> f32[n, 2W]
        src(f"pypto.set_vec_tile_shapes({', '.join(map(str, vec_tile((n, 4 * width), 2, WIDE_VEC_TILE_BYTES)))})")
        src(f"w = pypto.clone(pypto.view({wire.name}, [{n}, {4 * width}], [{r0}, 0]{valid.format(c=4 * width)}))")
        src("f = pypto.view(w, dtype=pypto.DT_FP32)")
        src(f"pypto.set_vec_tile_shapes({', '.join(map(str, vec_tile((n, width), 4, WIDE_VEC_TILE_BYTES)))})")
        for col, part in ((0, values), (width, scores)):
            src(f"y = pypto.clone(pypto.view(f, [{n}, {width}], [0, {col}]))")
            src(f"pypto.assemble(y, [{r0}, 0], {part.name})")
        for k in kv:
            cols = k.shape[1]
            src(f"pypto.set_vec_tile_shapes({', '.join(map(str, vec_tile((n, cols), 2, WIDE_VEC_TILE_BYTES)))})")
            src(f"y = pypto.clone(pypto.view({wire.name}, [{n}, {cols}], [{r0}, {4 * width}]{valid.format(c=cols)}))")
            src(f"pypto.assemble(y, [{r0}, 0], {k.name})")
    return src.text()


template(CpWireUnpack)(unpack_source)

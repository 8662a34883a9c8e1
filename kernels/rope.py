"""pypto 0.2.0 templates of the rope kernel family (the ops' numpy semantics: dspark_ir/semantics/rope.py)."""
from __future__ import annotations

# ---- pypto 0.2.0 template ------------------------------------------------------------------------
# Source generator for the lowering (see kernels/pto.py), mirroring `rope` above op for op:
# * the even/odd elements of the rope part are split by data movement only: reshape [.., rd/2, 2] →
#   transpose → the two planes [.., 1, rd/2] (no last-dim-1 views: pypto 0.2.0 needs 32-byte tile rows);
# * first / second are the reference's own f32 expressions (e·c − o·s, e·s + o·c; inverse e·c + o·s,
#   o·c − e·s) with c, s the per-row half tables broadcast over the middle axis, so every element is
#   bitwise the reference's before its one rounding to `out`;
# * the halves are interleaved back by concat → transpose → reshape (exact), rounded once, and assembled
#   beside the rounded nope part (rounding before or after pure data movement gives the same bits).
# No index tensor is needed (the op has no index operand; in-kernel indices are unsafe on pypto 0.2.0).
from dspark_ir.ops.core import Rope

from .pto import KernelSpec, RowLoop, Src, cast_expr, py_list, vec_tile
from .registry import template


def _pto_set(src: Src, shape, align: int = 1) -> None:
    """Set the vector tile; the last dim rounded up to `align` elements (pypto checks that a tile's last dim
    spans a multiple of 32 bytes for every operand dtype; a tile wider than the tensor is fine)."""
    shape = [int(s) for s in shape]
    shape[-1] = -(-shape[-1] // align) * align
    src(f"pypto.set_vec_tile_shapes({', '.join(map(str, shape))})")


A8, A16 = 8, 16   # tile last-dim alignment in elements: f32-only tiles / tiles with 2-byte operands


def _pto_lead(lead, budget_elems: int) -> list[int]:
    """A tile for the leading dims: innermost dims whole, outer ones as the element budget allows."""
    tile = [1] * len(lead)
    room = max(1, budget_elems)
    for i in range(len(lead) - 1, -1, -1):
        tile[i] = max(1, min(lead[i], room))
        room = max(1, room // tile[i])
    return tile


@template(Rope)
def pypto_rope(spec: KernelSpec) -> str:
    """Interleaved RoPE (or inverse) on the last rope_dim dims of x [T, *mid, W]; cos/sin [T, rd/2].

    Work unit: `chunk` (row, head) pairs of the rope part, one transpose tile (the UB holds ~13 of them),
    as rows × a group of heads, each unit one fused vector subgraph (sg_set_scope): the units spread over
    the vector cores and cost one task chain each instead of one per op. The nope part is a separate copy
    (or rounding) per row block."""
    x, cos, sin = spec.operands
    out = spec.results[0]
    rd = int(spec.attrs["rope_dim"])
    half = rd // 2
    inverse = bool(spec.attrs.get("inverse", False))
    width = x.shape[-1]
    nope = width - rd
    mid = 1
    for d in x.shape[1:-1]:
        mid *= d
    merge = x.rank > 3          # several middle axes: one [rows, mid, rd] view (one broadcast axis for c, s)
    three = x.rank >= 3
    chunk = max(1, 512 // rd)
    group = mid if merge else min(mid, chunk)      # heads per unit
    src = Src(spec.signature())
    loop = RowLoop(src, x, max(1, min(32, chunk // group)))
    br = loop.shape(x)[0]
    partial = loop.looped and loop.partial
    r0 = "r0" if loop.looped else "0"

    def valid(*rest) -> str:
        return f", valid_shape={py_list(['valid'] + [str(r) for r in rest])}" if partial else ""

    xlead = list(loop.shape(x)[:-1])
    xoffs = [r0] + ["0"] * (x.rank - 2)
    heads = list(range(0, mid, group)) if three and not merge else [0]
    with loop.loop():
        if nope:  # the nope part: one rounding to `out` (a plain copy when the dtypes agree)
            _pto_set(src, vec_tile(tuple(xlead) + (nope,), 4), A16)
            view = f"pypto.view({x.name}, {py_list(xlead + [nope])}, {py_list(xoffs + ['0'])}{valid(*xlead[1:], nope)})"
            value = f"pypto.clone({view})" if x.dtype == out.dtype else cast_expr(view, x.dtype, out.dtype)
            src(f"nv = {value}")
            src(f"pypto.assemble(nv, {py_list(xoffs + ['0'])}, {out.name})")
        for unit, h0 in enumerate(heads):
            lead = [br, min(group, mid - h0)] if three else [br]   # the last head group may be narrower
            k = len(lead)
            zeros = [0] * k
            t_lead = _pto_lead(lead, chunk)
            bshape = [br] + [1] * (k - 1) + [1, half]
            src(f"pypto.set_pass_options(sg_set_scope={unit + 1})")
            _pto_set(src, vec_tile((br, half), 4), A16)
            for name, t in (("cb", cos), ("sb", sin)):
                src(f"{name} = {cast_expr(loop.view(t), t.dtype, 'f32')}")
            _pto_set(src, vec_tile(tuple(bshape), 4), A8)
            for name in ("cb", "sb"):
                src(f"{name} = pypto.reshape({name}, {py_list(bshape)}{valid(*bshape[1:])})")
            if merge:
                shape, offs = xlead + [rd], xoffs + [str(nope)]
            else:
                shape = lead + [rd]
                offs = [r0] + ([str(h0)] if three else []) + [str(nope)]
            _pto_set(src, vec_tile(tuple(shape), 4), A16)
            view = f"pypto.view({x.name}, {py_list(shape)}, {py_list(offs)}{valid(*shape[1:])})"
            src(f"rp = {cast_expr(view, x.dtype, 'f32')}")
            if merge:
                src(f"rp = pypto.reshape(rp, {py_list(lead + [rd])}{valid(mid, rd)})")
            _pto_set(src, t_lead + [half, 8])  # a reshape's tile needs a 32-byte last dim even onto a 2-wide axis
            src(f"p4 = pypto.reshape(rp, {py_list(lead + [half, 2])}{valid(*lead[1:], half, 2)})")
            _pto_set(src, t_lead + [2, half], A8)
            src(f"pt = pypto.transpose(p4, {k}, {k + 1})")
            for name, plane in (("ev", 0), ("od", 1)):
                src(f"{name} = pypto.view(pt, {py_list(lead + [1, half])}, {py_list(zeros + [plane, 0])}"
                    f"{valid(*lead[1:], 1, half)})")
            _pto_set(src, t_lead + [1, half], A8)
            if inverse:
                src("fa = pypto.add(pypto.mul(ev, cb), pypto.mul(od, sb))")
                src("fb = pypto.sub(pypto.mul(od, cb), pypto.mul(ev, sb))")
            else:
                src("fa = pypto.sub(pypto.mul(ev, cb), pypto.mul(od, sb))")
                src("fb = pypto.add(pypto.mul(ev, sb), pypto.mul(od, cb))")
            _pto_set(src, t_lead + [2, half], A8)
            src(f"cat = pypto.concat([fa, fb], {k})")
            _pto_set(src, t_lead + [half, 2])
            src(f"pb = pypto.transpose(cat, {k}, {k + 1})")
            _pto_set(src, t_lead + [rd], A16)
            src(f"ro = pypto.reshape(pb, {py_list(lead + [rd])}{valid(*lead[1:], rd)})")
            src(f"ro = {cast_expr('ro', 'f32', out.dtype)}")
            if merge:
                src(f"ro = pypto.reshape(ro, {py_list(shape)}{valid(*shape[1:])})")
            _pto_set(src, vec_tile(tuple(shape), 4), A16)
            src(f"pypto.assemble(ro, {py_list(offs)}, {out.name})")
            src("pypto.set_pass_options(sg_set_scope=-1)")
    return src.text()

"""pypto 0.2.0 templates of the window_release kernel family.

The ops' numpy semantics: dspark_ir/semantics/window_release.py.
"""
from __future__ import annotations

# ---- pypto 0.2.0 template ------------------------------------------------------------------------
# window_release is a rendezvous (barrier 2 with every peer, then the credit reset) and moves no data.
# pypto 0.2.0 expresses cross-rank signalling only through pypto.distributed / shmem ops, which compile
# but segfault in the CPU cost-model simulation and which the host calculator cannot interpret, so it has
# no template; the lowering runs it as a collective (numpy, all ranks in lockstep).
#
# The data part of its "before" form, `window_copy_out` (family `collective`, registered in
# kernels/collective.py's template section from here), is a single-rank copy: the data rows [0, rows) of
# this rank's exchange window along `axis` into a local tensor. Its template is that local copy only
# (view → clone → assemble, bitwise); barrier 2 and the credit reset around it stay with the collective
# runtime (the lowering runs collectives on numpy; pypto's distributed ops cannot run on CPU).
from dspark_ir.ops.window_release import WindowRelease

from .pto import BLOCK_BYTES, WIDE_VEC_TILE_BYTES, KernelSpec, RowLoop, Src, vec_tile
from .registry import unsupported

unsupported(WindowRelease, "cross-rank barrier + credit reset with no data: pypto 0.2.0 distributed/shmem ops "
                           "segfault in the CPU simulation and the calculator cannot interpret them")


def pypto_window_copy_out(spec: KernelSpec) -> str:
    """out = window[:rows] along `axis` (every other axis whole): the window's data region starts at 0 on
    every axis, so out[i] = window[i] for every index i of out; copied block by block over out's rows."""
    w = spec.operands[0]
    out = spec.results[0]
    src = Src(spec.signature())
    row_bytes = max(1, out.itemsize)
    for d in out.shape[1:]:
        row_bytes *= d
    loop = RowLoop(src, out, max(1, min(out.shape[0], (1 << 20) // row_bytes)))
    shape = loop.shape(out)
    offsets = ["r0" if loop.looped else "0"] + ["0"] * (out.rank - 1)
    valid = ""
    if loop.looped and loop.partial:
        valid = ", valid_shape=[" + ", ".join(["valid"] + [str(s) for s in out.shape[1:]]) + "]"
    with loop.loop():
        tile = vec_tile(tuple(shape), out.itemsize, WIDE_VEC_TILE_BYTES)
        align = BLOCK_BYTES // out.itemsize  # pypto refuses a tile whose last dim is not whole 32-byte blocks
        tile[-1] = -(-tile[-1] // align) * align
        src(f"pypto.set_vec_tile_shapes({', '.join(map(str, tile))})")
        src(f"y = pypto.clone(pypto.view({w.name}, [{', '.join(map(str, shape))}], [{', '.join(offsets)}]{valid}))")
        loop.store("y", out)
    return src.text()

"""pypto 0.2.0 templates of the signal kernel family (the ops' numpy semantics: dspark_ir/semantics/signal.py)."""
from __future__ import annotations

# ---- pypto 0.2.0 template ------------------------------------------------------------------------
# Source generators for the lowering (see kernels/pto.py).
# * window: one rank's zero-filled window buffer (the reference's `window`), filled block by block like the
#   `zeros` op: a runtime loop over every leading axis but the last two, blocks of rows of the second-to-last
#   axis, the last axis whole. i8 goes through an i32 fill and the documented i32 → f16 → i8 casts
#   (`pypto.full(..., DT_INT8)` kills the process in pypto 0.2.0's SIM run). Bitwise (zeros).
# * signal_notify / signal_wait / signal_barrier / put are cross-rank (declared `unsupported` below).
from dspark_ir.ops.signal import Put, SignalBarrier, SignalNotify, SignalWait, Window

from .pto import KernelSpec, Src, cast_expr, py_list
from .registry import template, unsupported

_PTO_CROSS_RANK = ("pypto 0.2.0 expresses remote stores and signals only with pypto.distributed / shmem ops, "
                   "which compile but SIGSEGV in the CPU cost-model simulation and which the host calculator "
                   "cannot interpret (no numbers on CPU)")
unsupported(SignalNotify, "cross-rank AtomicAdd into every peer's signal cell; " + _PTO_CROSS_RANK + ". At one rank "
                          "it has no peer and changes nothing, so there is nothing local to compute")
unsupported(SignalWait, "cross-rank spin-wait on peers' signal cells (data-dependent termination); " + _PTO_CROSS_RANK
                        + ". At one rank it has no peer: a no-op")
unsupported(SignalBarrier, "cross-rank notify + spin-wait; " + _PTO_CROSS_RANK + ". At one rank: a no-op")
unsupported(Put, "one-sided row puts into peers' windows (pld.tensor.put / remote_store); " + _PTO_CROSS_RANK
                 + ". Its only local part (peer == my rank) is a row scatter whose rows are data (row[i]) and whose "
                 "order on duplicate rows is the reference's sequential order, which scatter_update does not promise")


@template(Window)
def pypto_window(spec: KernelSpec) -> str:
    out = spec.results[0]
    fill_dtype = {"i8": "i32", "bf16": "bf16", "fp16": "fp16", "i32": "i32", "f32": "f32"}.get(out.dtype, "f32")
    item = 4 if fill_dtype in ("i32", "f32") else 2
    pto_fill = {"i32": "pypto.DT_INT32", "f32": "pypto.DT_FP32", "bf16": "pypto.DT_BF16",
                "fp16": "pypto.DT_FP16"}[fill_dtype]
    value = "0" if fill_dtype == "i32" else "0.0"
    if out.rank == 1:  # one block
        spec = spec.static()
        out = spec.results[0]
        src = Src(spec.signature())
        src(f"pypto.set_vec_tile_shapes({max(out.shape[0], 32 // item)})")
        src(f"z = pypto.full([{out.shape[0]}], {value}, {pto_fill})")
        src(f"zc = {cast_expr('z', fill_dtype, out.dtype)}")
        src(f"pypto.assemble(zc, [0], {out.name})")
        return src.text()
    shape = list(out.shape)
    lead_names = [f"i{a}" for a in range(len(shape) - 2)]
    rows, last = shape[-2], shape[-1]
    block = max(1, min(rows, (16 * 1024) // max(1, last * item)))
    last_tile = max(last, 32 // item)
    src = Src(spec.signature())
    for a, name in enumerate(lead_names):
        extent = f"{out.name}.shape[0]" if (a == 0 and out.is_dynamic(0)) else str(shape[a])
        src(f'for {name} in pypto.loop(0, {extent}, 1, name="axis{a}_loop", idx_name="{name}"):')
        src.depth += 1
    n_rows = f"{out.name}.shape[0]" if (out.is_dynamic(0) and out.rank == 2) else str(rows)
    src(f"nrows = {n_rows}")
    with src.block(f'for blk in pypto.loop(0, (nrows + {block - 1}) // {block}, 1, name="rows_loop", idx_name="blk"):'):
        src(f"r0 = blk * {block}")
        src(f"valid = pypto.min(nrows - r0, {block})")
        lead_shape = [1] * len(lead_names)
        src(f"pypto.set_vec_tile_shapes({', '.join(map(str, lead_shape + [block, last_tile]))})")
        src(f"z = pypto.full({py_list(lead_shape + [block, last])}, {value}, {pto_fill}, "
            f"valid_shape={py_list(lead_shape + ['valid', last])})")
        src(f"zc = {cast_expr('z', fill_dtype, out.dtype)}")
        src(f"pypto.assemble(zc, {py_list(lead_names + ['r0', '0'])}, {out.name})")
    return src.text()

"""pypto 0.2.0 templates of the collective kernel family.

The ops' numpy semantics: dspark_ir/semantics/collective.py.
"""
from __future__ import annotations

# ---- pypto 0.2.0 template ------------------------------------------------------------------------
# window_copy_out's local copy (the template lives in kernels/window_release.py with the window release).
from dataclasses import replace

from dspark_ir.ops.collective import (
    CpAllGather,
    CpOwnRows,
    CpRankRows,
    CpTypedAllGather,
    CpTypedReadback,
    OGroupA2A,
    TpODequantReduceScatter,
    TpOReduceScatter,
    WindowCopyOut,
)

from .oproj import pypto_o_proj_b_dequant
from .pto import WIDE_VEC_TILE_BYTES, KernelSpec, Src, TensorArg, cast_expr, vec_tile
from .registry import cost_template, template, unsupported
from .window_release import pypto_window_copy_out
from .wire import unpack_source

# o_group_a2a, cp_allgather and tp_o_reduce_scatter are cross-rank rendezvous collectives: no template
# (declared `unsupported`); their local parts are cost forms (below).
_PTO_CROSS_RANK = ("pypto 0.2.0 expresses remote stores and signals only with pypto.distributed / shmem ops, which "
                   "compile but SIGSEGV in the CPU cost-model simulation and which the host calculator cannot "
                   "interpret (no numbers on CPU); the lowering runs collective tasks on numpy")
unsupported(OGroupA2A, "rendezvous all-to-all: puts this rank's O groups into every peer's exchange window, then "
                       "barrier 1; " + _PTO_CROSS_RANK + ". The layers emit it only at TP > 1 (TP1 uses the local O "
                       "path), so there is no one-rank instance to template")
unsupported(TpOReduceScatter, "rendezvous reduce-scatter: every peer's f32 partial rows of this rank, summed over "
                              "ranks in ascending order, then one rounding; " + _PTO_CROSS_RANK + ". The layers emit "
                              "it only at TP > 1, so there is no one-rank instance to template")
unsupported(TpODequantReduceScatter, "rendezvous reduce-scatter fed by its own publish workers: each dequantises its "
                                     "O-B tiles into the owners' windows (remote stores, then a notify), the owner "
                                     "sums its window's source lanes in ascending rank order; " + _PTO_CROSS_RANK +
                                     ". The pass emits it only at TP > 1, so there is no one-rank instance to "
                                     "template")
unsupported(CpAllGather, "rendezvous context-parallel all-gather: pushes this rank's payload rows into every peer's "
                         "window, then waits for every peer's rows (decode_cp_allgather push + payload wait); "
                         + _PTO_CROSS_RANK + ". Its read-back is the window_copy_out that follows, which has a "
                         "template")
unsupported(CpOwnRows, "modelling glue for the per-rank goldens (no seed task): which rows a rank keeps depends on its "
                       "TP rank, which the lowering's per-rank numpy collectives know and a one-rank pypto kernel "
                       "does not")

unsupported(CpTypedAllGather, "rendezvous typed all-gather push: this rank's typed payload rows, read as their wire "
                              "bits, into every peer's window, then the wait for every peer's rows; "
                              + _PTO_CROSS_RANK + ". Its read-back is the cp_typed_readback that follows, which has a "
                              "template")
unsupported(CpRankRows, "modelling glue for the per-rank goldens (no seed task): which rows a rank keeps depends on "
                        "its TP rank, which a one-rank pypto kernel does not know")

template(WindowCopyOut)(pypto_window_copy_out)
# the typed read-back's local part: the window's wire rows decoded into the typed tensors (the unpack's loop)
template(CpTypedReadback)(unpack_source)


# ---- cost forms: each collective's local part at one rank (perf's cost model only; never lowered) -------------
# The rank's own share of the work, on its own buffers standing in for its peers' (same shapes and bytes, other
# values): what pypto can simulate on one process. The link transfer, the wait for the peers and the barriers
# are not in it (perf/README.md "Limits of the estimate").


@cost_template(OGroupA2A)
def pypto_o_group_a2a_local(spec: KernelSpec) -> str:
    """The put of one rank: for every peer s, its group slice [s·LG, (s+1)·LG) of packed written at the rows
    s·T … (s+1)·T − 1 of a window laid out as the peer's (this rank standing in as every source). Pad rows are
    zero-filled by the host and not written."""
    spec = spec.static()
    packed, window = spec.operands[0], spec.results[0]
    groups, tokens, width = packed.shape
    tp = int(spec.attrs["tp"])
    lg = groups // tp
    src = Src(spec.signature())
    tile = vec_tile((lg, tokens, width), packed.itemsize, WIDE_VEC_TILE_BYTES)
    src(f"pypto.set_vec_tile_shapes({', '.join(map(str, tile))})")
    for s in range(tp):
        src(f"y = pypto.clone(pypto.view({packed.name}, [{lg}, {tokens}, {width}], [{s * lg}, 0, 0]))")
        src(f"pypto.assemble(y, [0, {s * tokens}, 0], {window.name})")
    return src.text()


def _cp_push_local(spec: KernelSpec, parts: list[tuple[TensorArg, int, bool]]) -> str:
    """The push of one rank (decode_cp_allgather's *_allgather_push: every worker puts its row bands of the payload
    into the window of every rank of the group, its own included): the rank's rows written tp times, at the rows
    s·T of a window-shaped tensor for every s (this rank standing in as every peer's window). `parts`: (operand,
    first window column, bits) — a `bits` f32 operand goes as its bf16 bit pairs (the typed push's wire rows)."""
    spec = spec.static()
    window = spec.results[0]
    rows = spec.operands[0].shape[0]
    tp = int(spec.attrs["tp"])
    src = Src(spec.signature())
    for s in range(tp):
        for part, col, bits in parts:
            shape = list(part.shape)
            tile = vec_tile(tuple(shape), part.itemsize, WIDE_VEC_TILE_BYTES)
            src(f"pypto.set_vec_tile_shapes({', '.join(map(str, tile))})")
            src(f"y = pypto.clone(pypto.view({part.name}, {shape}, {[0] * len(shape)}))")
            value = "pypto.view(y, dtype=pypto.DT_BF16)" if bits else "y"
            at = [s * rows] + ([col] if len(shape) > 1 else []) + [0] * (len(shape) - 2)
            src(f"pypto.assemble({value}, {at}, {window.name})")
    return src.text()


@cost_template(CpAllGather)
def pypto_cp_allgather_local(spec: KernelSpec) -> str:
    """The untyped push of one rank: its payload rows into every rank's window (`_cp_push_local`)."""
    payload = spec.static().operands[0]
    return _cp_push_local(spec, [(payload, 0, False)])


@cost_template(CpTypedAllGather)
def pypto_cp_typed_allgather_local(spec: KernelSpec) -> str:
    """The typed push of one rank: its values and scores as their wire bits and its kv rows into every rank's
    window, in the wire layout of ops/wire.py (`_cp_push_local`): the same bytes as the untyped push."""
    values, scores, *kv = spec.static().operands
    width = values.shape[1]
    return _cp_push_local(spec, [(values, 0, True), (scores, 2 * width, True)] + [(k, 4 * width, False) for k in kv])


@cost_template(TpOReduceScatter)
def pypto_tp_o_reduce_scatter_local(spec: KernelSpec) -> str:
    """The reduce of one rank: its T rows summed over the tp sources in ascending order in f32, rounded once, the
    tp row slices of this rank's own partial standing in for the peers' slices of its rows."""
    spec = spec.static()
    partial, out = spec.operands[0], spec.results[0]
    rows, hidden = out.shape
    tp = int(spec.attrs["tp"])
    src = Src(spec.signature())
    src(f"pypto.set_vec_tile_shapes({', '.join(map(str, vec_tile((rows, hidden), 4, WIDE_VEC_TILE_BYTES)))})")
    for s in range(tp):
        part = f"pypto.view({partial.name}, [{rows}, {hidden}], [{s * rows}, 0])"
        src(f"acc = {part}" if s == 0 else f"acc = pypto.add(acc, {part})")
    src(f"pypto.assemble({cast_expr('acc', 'f32', out.dtype)}, [0, 0], {out.name})")
    return src.text()


@cost_template(TpODequantReduceScatter)
def pypto_tp_o_dequant_reduce_scatter_local(spec: KernelSpec) -> str:
    """The publish and the reduce of one rank: o_proj_b_dequant's body writes the tp·T dequantised rows into a
    window-shaped f32 tensor (standing in for the owners' windows the publish workers store into; the stores'
    link transfer is not in it), then the rank's T rows are summed over the tp lanes of that window in ascending
    order and rounded once, the window's lanes standing in for the peers' lanes of this rank's rows."""
    spec = spec.static()
    out = spec.results[0]
    rows, hidden = out.shape
    tp = int(spec.attrs["tp"])
    window = TensorArg("owner_window", (tp * rows, hidden), "f32")
    publish = pypto_o_proj_b_dequant(replace(spec, results=(window,), attrs={**spec.attrs, "out": "f32"}))
    src = Src(spec.signature())
    src(f'{window.name} = pypto.tensor([{tp * rows}, {hidden}], {window.pto}, "{window.name}")')
    src.lines += publish.splitlines()[publish.splitlines().index("):") + 1:]
    src(f"pypto.set_vec_tile_shapes({', '.join(map(str, vec_tile((rows, hidden), 4, WIDE_VEC_TILE_BYTES)))})")
    for s in range(tp):
        lane = f"pypto.view({window.name}, [{rows}, {hidden}], [{s * rows}, 0])"
        src(f"acc = {lane}" if s == 0 else f"acc = pypto.add(acc, {lane})")
    src(f"pypto.assemble({cast_expr('acc', 'f32', out.dtype)}, [0, 0], {out.name})")
    return src.text()

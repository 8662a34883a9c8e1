"""pypto 0.2.0 templates of the collective kernel family (numpy semantics: dspark_ir/semantics/collective.py)."""
from __future__ import annotations

# ---- pypto 0.2.0 template ------------------------------------------------------------------------
# window_copy_out's local copy (the template lives in kernels/window_release.py with the window release).
from dspark_ir.ops.collective import CpAllGather, CpOwnRows, OGroupA2A, TpOReduceScatter, WindowCopyOut

from .registry import template, unsupported
from .window_release import pypto_window_copy_out

# o_group_a2a, cp_allgather and tp_o_reduce_scatter are cross-rank rendezvous collectives: no template
# (declared `unsupported`).
_PTO_CROSS_RANK = ("pypto 0.2.0 expresses remote stores and signals only with pypto.distributed / shmem ops, which "
                   "compile but SIGSEGV in the CPU cost-model simulation and which the host calculator cannot "
                   "interpret (no numbers on CPU); the lowering runs collective tasks on numpy")
unsupported(OGroupA2A, "rendezvous all-to-all: puts this rank's O groups into every peer's exchange window, then "
                       "barrier 1; " + _PTO_CROSS_RANK + ". The layers emit it only at TP > 1 (TP1 uses the local O "
                       "path), so there is no one-rank instance to template")
unsupported(TpOReduceScatter, "rendezvous reduce-scatter: every peer's f32 partial rows of this rank, summed over "
                              "ranks in ascending order, then one rounding; " + _PTO_CROSS_RANK + ". The layers emit "
                              "it only at TP > 1, so there is no one-rank instance to template")
unsupported(CpAllGather, "rendezvous context-parallel all-gather: pushes this rank's payload rows into every peer's "
                         "window, then waits for every peer's rows (decode_cp_allgather push + payload wait); "
                         + _PTO_CROSS_RANK + ". Its read-back is the window_copy_out that follows, which has a "
                         "template")
unsupported(CpOwnRows, "modelling glue for the per-rank goldens (no seed task): which rows a rank keeps depends on its "
                       "TP rank, which the lowering's per-rank numpy collectives know and a one-rank pypto kernel "
                       "does not")

template(WindowCopyOut)(pypto_window_copy_out)

"""pypto 0.2.0 templates of the topk_bypass kernel family.

The ops' numpy semantics: dspark_ir/semantics/topk_bypass.py.
"""
from __future__ import annotations

# ---- pypto 0.2.0 template ------------------------------------------------------------------------
# The guarded bypass as one kernel (see kernels/indexer.py's template section): per request, the bounded row
# where visible[t] ≤ k, else the fallback row (i32 → f32 → i32 exact for |index| < 2^24).
from dspark_ir.ops.topk_bypass import IdxTopkSelect

from .indexer import pto_bounded_topk
from .pto import KernelSpec
from .registry import template


@template(IdxTopkSelect)
def pypto_idx_topk_select(spec: KernelSpec) -> str:
    fallback, pos, kv_len = spec.operands
    return pto_bounded_topk(spec, pos, kv_len, spec.results[0], fallback)

"""pypto 0.2.0 templates of the topk_bypass kernel family (the ops' numpy semantics: dspark_ir/semantics/topk_bypass.py)."""
from __future__ import annotations

# ---- pypto 0.2.0 template ------------------------------------------------------------------------
# The guarded bypass as one kernel (see kernels/indexer.py's template section): per request, the bounded row
# where visible[t] ≤ k, else the fallback row (i32 → f32 → i32 exact for |index| < 2^24).
from ._pypto import KernelSpec  # noqa: E402
from .indexer import _pto_bounded  # noqa: E402


def pypto_idx_topk_select(spec: KernelSpec) -> str:
    fallback, pos, kv_len = spec.operands
    return _pto_bounded(spec, pos, kv_len, spec.results[0], fallback)


PYPTO_TEMPLATES = {"idx_topk_select": pypto_idx_topk_select}

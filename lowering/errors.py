"""The lowering's user-facing error."""
from __future__ import annotations

from dspark_ir.errors import DsparkError


class LoweringError(DsparkError):
    """A graph cannot be lowered, a task graph is malformed, or an executor failed."""

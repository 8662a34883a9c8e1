"""Passes over the DSpark graph IR: the pass base, registry, pipeline strings, toggles, the manager and
its instruments (verify, round trip, numeric contracts, timing, dumps, bisection, reproducers), and one
module per pass (`passes/<snake_name>.py` registers `<kebab-name>`).

    from passes import PassContext, run_pipeline
    with PassContext(disabled=["cse"], check_numerics=True, dump_dir="dumps"):
        result = run_pipeline(graph)             # the default pipeline, toggles applied
    result.graph, result.runs, result.cache_key
"""
from __future__ import annotations

from .base import Pass, RewriteRecord, Skip, register_pass
from .bisect import BisectResult, bisect_pipeline
from .context import PassContext
from .contracts import BITWISE, EXACT_INDICES, Contract, approx, bounded_reassoc, exact_indices
from .defaults import DEFAULT_PIPELINE
from .errors import PassError, PipelineError
from .manager import OptResult, PassManager, PassRun, run_pipeline
from .pipeline import Pipeline, format_pass, parse_pipeline
from .properties import register_property
from .registry import get_pass, registered_names, summary

__all__ = [
    "Pass", "RewriteRecord", "Skip", "register_pass", "BisectResult", "bisect_pipeline", "PassContext",
    "BITWISE", "EXACT_INDICES", "Contract", "approx", "bounded_reassoc", "exact_indices", "DEFAULT_PIPELINE",
    "PassError", "PipelineError", "OptResult", "PassManager", "PassRun", "run_pipeline", "Pipeline",
    "format_pass", "parse_pipeline", "register_property", "get_pass", "registered_names", "summary",
    "default_pipeline",
]


def default_pipeline() -> Pipeline:
    """The default pipeline with its default-off entries off and no toggles applied."""
    return PassContext(use_env=False).effective_pipeline()

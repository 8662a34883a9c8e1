"""Passes over the DSpark graph IR: one module per pass (`passes/<snake_name>.py` registers `<kebab-name>`),
and in `passes.infra` the machinery: the pass base, registry, pipeline strings, toggles, the default pipeline,
the manager and its instruments (verify, round trip, numeric contracts, timing, dumps, bisection, reproducers).

    from passes import PassContext, run_pipeline
    with PassContext(disabled=["cse"], check_numerics=True, dump_dir="dumps"):
        result = run_pipeline(graph)             # the default pipeline, toggles applied
    result.graph, result.runs, result.cache_key
"""
from __future__ import annotations

from .infra.base import Pass, RewriteRecord, Skip, register_pass
from .infra.bisect import BisectResult, bisect_pipeline
from .infra.context import PassContext
from .infra.contracts import BITWISE, EXACT_INDICES, Contract, approx, bounded_reassoc, exact_indices
from .infra.defaults import DEFAULT_PIPELINE
from .infra.errors import PassError, PipelineError
from .infra.manager import OptResult, PassManager, PassRun, run_pipeline
from .infra.options import option
from .infra.pipeline import Pipeline, format_pass, parse_entries, parse_pipeline
from .infra.properties import register_property
from .infra.registry import describe, get_pass, registered_names, summary

__all__ = [
    "Pass", "RewriteRecord", "Skip", "register_pass", "BisectResult", "bisect_pipeline", "PassContext",
    "BITWISE", "EXACT_INDICES", "Contract", "approx", "bounded_reassoc", "exact_indices", "DEFAULT_PIPELINE",
    "PassError", "PipelineError", "OptResult", "PassManager", "PassRun", "run_pipeline", "Pipeline",
    "format_pass", "parse_entries", "parse_pipeline", "register_property", "get_pass", "registered_names",
    "describe", "option", "summary", "default_pipeline",
]


def default_pipeline() -> Pipeline:
    """The default pipeline with its default-off entries off and no toggles applied."""
    return PassContext(use_env=False).effective_pipeline()

"""Passes over the DSpark graph IR: one module per pass (`passes/<snake_name>.py` registers `<kebab-name>`),
and in `passes.infra` the machinery: the pass base, registry, pipeline strings, toggles, the default pipeline,
the manager and its instruments (verify, round trip, numeric contracts, timing, dumps, bisection, reproducers).

    from passes import PassContext, run_pipeline
    with PassContext(disabled=["cse"], check_numerics=True, dump_dir="dumps"):
        result = run_pipeline(graph)             # the default pipeline, toggles applied
    result.graph, result.runs, result.cache_key
"""
from __future__ import annotations

import importlib

_HOME = {
    **dict.fromkeys(["Pass", "RewriteRecord", "Skip", "register_pass"], "infra.base"),
    **dict.fromkeys(["BisectResult", "bisect_pipeline"], "infra.bisect"),
    **dict.fromkeys(["PassContext"], "infra.context"),
    **dict.fromkeys(["BITWISE", "EXACT_INDICES", "Contract", "approx", "bounded_reassoc", "exact_indices"],
        "infra.contracts"),
    **dict.fromkeys(["DEFAULT_PIPELINE"], "infra.defaults"),
    **dict.fromkeys(["PassError", "PipelineError"], "infra.errors"),
    **dict.fromkeys(["option"], "infra.options"),
    **dict.fromkeys(["OptResult", "PassManager", "PassRun", "run_pipeline"], "infra.manager"),
    **dict.fromkeys(["Pipeline", "format_pass", "parse_entries", "parse_pipeline"], "infra.pipeline"),
    **dict.fromkeys(["register_property"], "infra.properties"),
    **dict.fromkeys(["describe", "get_pass", "registered_names", "summary"], "infra.registry"),
}

__all__ = [
    "Pass", "RewriteRecord", "Skip", "register_pass", "BisectResult", "bisect_pipeline", "PassContext",
    "BITWISE", "EXACT_INDICES", "Contract", "approx", "bounded_reassoc", "exact_indices", "DEFAULT_PIPELINE",
    "PassError", "PipelineError", "OptResult", "PassManager", "PassRun", "run_pipeline", "Pipeline",
    "format_pass", "parse_entries", "parse_pipeline", "register_property", "get_pass", "registered_names",
    "describe", "option", "summary", "default_pipeline",
]


def __getattr__(name: str):
    """The public names load their module on first use: listing passes imports no pass machinery."""
    if name not in _HOME:
        raise AttributeError(f"module 'passes' has no attribute '{name}'")
    value = getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
    globals()[name] = value
    return value


def default_pipeline() -> "Pipeline":  # noqa: F821 (a lazy name, see __getattr__)
    """The default pipeline with its default-off entries off and no toggles applied."""
    from .infra.context import PassContext

    return PassContext(use_env=False).effective_pipeline()

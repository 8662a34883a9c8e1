"""Independent numpy references of the DeepSeek-V4-Flash (DSpark) decode layers.

Written from the shared notes dsv4-math.md (the spec) and dspark-model.md; imports numpy and ml_dtypes only.
Entry points: `config_by_name`, `make_inputs` / `make_rank_inputs`, `run_layer` / `run_layer_ranks`
(or `decode_swa|csa|hca`, `moe_layer` and their `_tp` / `_ep` forms), `compare.check`.

The names load their module on first use (PEP 562): `goldens.config` alone does not import numpy.
"""
from __future__ import annotations

import importlib

_HOME = {
    **dict.fromkeys([
        "CacheGeometry", "ConfigError", "ModelConfig", "TileConfig", "cache_geometry", "config_by_name",
        "layer_kinds", "tiles_for", "with_context"
    ], "config"),
    **dict.fromkeys([
        "input_specs", "make_inputs", "make_rank_inputs", "merge_rank_inputs", "output_specs",
        "split_rank_outputs", "typed_inputs", "typed_outputs"
    ], "inputs"),
    **dict.fromkeys([
        "decode_csa", "decode_csa_tp", "decode_hca", "decode_hca_tp", "decode_swa", "decode_swa_tp",
        "moe_layer", "moe_layer_ep", "run_layer", "run_layer_ranks"
    ], "layers"),
}

__all__ = list(_HOME)


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module 'goldens' has no attribute '{name}'")
    value = getattr(importlib.import_module(f".{_HOME[name]}", __name__), name)
    globals()[name] = value
    return value


"""Independent numpy references of the DeepSeek-V4-Flash (DSpark) decode layers.

Written from the shared notes dsv4-math.md (the spec) and dspark-model.md; imports numpy and ml_dtypes only.
Entry points: `config_by_name`, `make_inputs` / `make_rank_inputs`, `run_layer` / `run_layer_ranks`
(or `decode_swa|csa|hca`, `moe_layer` and their `_tp` / `_ep` forms), `compare.check`.
"""
from .config import (
    CacheGeometry,
    ConfigError,
    ModelConfig,
    TileConfig,
    cache_geometry,
    config_by_name,
    layer_kinds,
    tiles_for,
)
from .inputs import (
    input_specs,
    make_inputs,
    make_rank_inputs,
    merge_rank_inputs,
    output_specs,
    split_rank_outputs,
    typed_inputs,
    typed_outputs,
)
from .layers import (
    decode_csa,
    decode_csa_tp,
    decode_hca,
    decode_hca_tp,
    decode_swa,
    decode_swa_tp,
    moe_layer,
    moe_layer_ep,
    run_layer,
    run_layer_ranks,
)

__all__ = [
    "CacheGeometry", "ConfigError", "ModelConfig", "TileConfig", "cache_geometry", "config_by_name", "layer_kinds",
    "tiles_for", "input_specs", "make_inputs", "make_rank_inputs", "merge_rank_inputs", "output_specs",
    "split_rank_outputs", "typed_inputs", "typed_outputs", "decode_csa", "decode_csa_tp", "decode_hca", "decode_hca_tp",
    "decode_swa", "decode_swa_tp", "moe_layer", "moe_layer_ep", "run_layer", "run_layer_ranks",
]

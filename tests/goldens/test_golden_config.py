"""Configs, tiles, cache geometry and the layer sequence (goldens/config.py)."""
from __future__ import annotations

import dataclasses

import pytest

from goldens.config import ConfigError, ModelConfig, cache_geometry, config_by_name, layer_kinds, tiles_for

DESIGN_FIELDS = (
    "name hidden heads head_dim rope_dim q_lora o_lora o_groups window idx_heads idx_head_dim idx_topk hc_mult "
    "sinkhorn_iters hc_eps rms_eps vocab n_experts topk_experts n_shared moe_inter routed_scale swiglu_limit "
    "n_hash_layers csa_ratio hca_ratio block_size max_pos decode_batch seq tp ep rope_theta compress_rope_theta "
    "yarn_factor yarn_orig yarn_beta_fast yarn_beta_slow context"
).split()


def test_fields_are_the_design_contract():
    assert [f.name for f in dataclasses.fields(ModelConfig)] == DESIGN_FIELDS


def test_flash_values(flash):
    assert (flash.batch, flash.tokens, flash.nope_dim, flash.heads_per_group) == (16, 128, 448, 8)
    assert (flash.local_o_groups, flash.score_len, flash.mix_hc, flash.hc_dim) == (2, 4096, 24, 16384)
    assert flash.softmax_scale == pytest.approx(0.0441941738)
    assert flash.index_weights_scale == pytest.approx(0.011048543)
    assert (flash.n_experts, flash.topk_experts, flash.moe_inter, flash.hca_ratio) == (256, 6, 2048, 128)


def test_tiny_values(tiny):
    assert (tiny.batch, tiny.tokens, tiny.nope_dim, tiny.heads_per_group, tiny.score_len) == (4, 16, 48, 2, 128)


@pytest.mark.parametrize("tp,batch,tokens,t_pad", [(1, 8, 32, 32), (2, 4, 16, 16), (4, 2, 8, 16)])
def test_tiny_tp_variants(tiny, tp, batch, tokens, t_pad):
    cfg = tiny.with_(tp=tp)
    assert (cfg.batch, cfg.tokens, cfg.t_pad, cfg.local_o_groups) == (batch, tokens, t_pad, 4 // tp)
    tiles_for(cfg)


def test_with_batch_and_tokens(tiny):
    assert tiny.with_(batch=3).decode_batch == 6
    assert tiny.with_(tokens=12).batch == 3
    assert tiny.with_(tp=4, batch=1).decode_batch == 4
    assert tiny.with_(seq=8).tokens == 32


@pytest.mark.parametrize("overrides,field", [
    ({"tp": 3}, "tp"),
    ({"o_groups": 3}, "o_groups"),
    ({"tokens": 10}, "tokens"),
    ({"ep": 3}, "ep"),
    ({"rope_dim": 15}, "rope_dim"),
    ({"hc_mult": 2}, "hc_mult"),
    ({"seq": 0}, "seq"),
    ({"bogus": 1}, "bogus"),
])
def test_invalid_overrides_name_the_field(tiny, overrides, field):
    with pytest.raises(ConfigError) as err:
        tiny.with_(**overrides)
    message = str(err.value)
    assert message.startswith(field) and "\n" not in message
    assert isinstance(err.value, ValueError)


def test_unknown_config():
    with pytest.raises(ConfigError, match="^name"):
        config_by_name("huge")


def test_layer_kinds(flash, tiny):
    kinds = layer_kinds(flash)
    assert len(kinds) == 43 and kinds[:4] == ("swa", "swa", "csa", "hca") and kinds[-1] == "csa"
    assert kinds.count("csa") == 21 and kinds.count("hca") == 20
    assert layer_kinds(tiny) == ("swa", "csa", "hca", "csa")


def test_tiles(flash, tiny):
    ft, tt = tiles_for(flash), tiles_for(tiny)
    assert (ft.LINEAR_OK, ft.KV_OM, ft.KV_RMS_T_TILE, ft.H_TILE, ft.ATTN_K_TILE) == (4, 4, 8, 16, 128)
    assert (ft.BIAS_T_TILE, ft.CMP_PAGES_PER_WORK, ft.HCA_MAX_COMPRESSED_ROWS) == (8, 4, 8192)
    assert (tt.H_TILE, tt.ATTN_K_TILE, tt.BIAS_T_TILE, tt.KV_OM, tt.SCORE_LEN) == (4, 16, 4, 2, 128)
    assert ft.SPARSE_BLOCKS == max(2, -(-(flash.window + flash.idx_topk) // ft.ATTN_K_TILE))
    assert tt.SPARSE_BLOCKS == max(2, -(-(tiny.window + tiny.idx_topk) // tt.ATTN_K_TILE))


def test_cache_geometry(flash, tiny):
    f, t = cache_geometry(flash), cache_geometry(tiny)
    assert (f.ctx_cap, f.csa_state_blocks, f.hca_state_blocks) == (8192, 2, 8)
    assert (t.ctx_cap, t.csa_state_blocks, t.hca_state_blocks) == (256, 2, 4)
    assert t.rows(t.kv_blocks) == tiny.batch * 256

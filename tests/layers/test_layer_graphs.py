"""Every layer graph the registry builds: verifies, prints → parses → prints byte-identically, builds
deterministically; the build API's errors are one-line DsparkErrors."""
from __future__ import annotations

from functools import lru_cache

import pytest

import runner
from dspark_ir import ConfigError, DsparkError, layers, parse_graph, print_graph, verify
from dspark_ir.layers.swa import build_swa

CASES = [(name, "tiny", tp) for name in layers.LAYER_NAMES for tp in (1, 2, 4)]
CASES += [("decode-swa", "flash", 4), ("decode-swa", "flash", 1)]


@lru_cache(maxsize=None)
def built(name, config, tp):
    return layers.build(name, config=config, tp=tp)


@pytest.mark.parametrize("name, config, tp", CASES, ids=lambda x: str(x))
def test_round_trip_and_verify(name, config, tp):
    g = built(name, config, tp)
    verify(g)
    text = print_graph(g)
    again = parse_graph(text)
    verify(again)
    assert again.structurally_equal(g)
    assert print_graph(again) == text


@pytest.mark.parametrize("name, config, tp", CASES, ids=lambda x: str(x))
def test_two_builds_print_identically(name, config, tp):
    assert print_graph(layers.build(name, config=config, tp=tp)) == print_graph(layers.build(name, config=config,
                                                                                                tp=tp))


@pytest.mark.parametrize("name, config, tp", CASES, ids=lambda x: str(x))
def test_layer_attributes_and_symbols(name, config, tp):
    g = built(name, config, tp)
    a = g.attributes
    assert a["layer"] == name and a["config"] == config and a["tp"] == tp and a["ranks"] >= 1
    assert len(a["outputs"]) == len(g.returns)
    assert {"T", "B", "S"} <= set(g.symbols) and all(v is not None for v in g.symbols.values())
    assert g.symbols["T"] == g.symbols["B"] * g.symbols["S"]


def test_swa_parameters_are_the_golden_input_names():
    from goldens.inputs import input_specs

    for tp in (1, 4):
        g = built("decode-swa", "tiny", tp)
        cfg = layers.graph_config(g)
        specs = input_specs("swa", cfg, rank_local=tp > 1)
        assert [p.name for p in g.params] == list(specs)
        for p in g.params:
            dtype, shape = specs[p.name]
            assert p.type.dtype.value == dtype and p.type.concrete_shape(g.env) == shape, p.name
        assert a_outputs(g) == ["x_out", "kv_cache"]


def a_outputs(g):
    return list(g.attributes["outputs"])


def test_swa_stage_names_follow_the_seed():
    g = built("decode-swa", "tiny", 4)
    names = set(g.nodes)
    for stage in ("hc.hc_pre_rms", "hc.hc_pre_linear", "hc.split_pre_post", "hc.comb_sinkhorn", "hc.mix_x",
                  "attn.rms_norm", "attn.late_dep", "qkv.q_rope_prepare", "qkv.qr_proj_seed", "qkv.qr_proj_matmul",
                  "qkv.qr_rms_norm_quant", "qkv.qproj_matmul", "qkv.qproj_dequant_rms_nope_rope",
                  "qkv.kv_proj_seed", "qkv.kv_proj_matmul", "qkv.kv_rms_norm_rope",
                  "swa.swa_cache_insert_valid_bias", "swa.swa_gather_kv", "swa.qk_pv", "swa.rope_cs",
                  "swa.merge_norm", "o.o_group_a2a", "o.tp_o_a.g0", "o.tp_o_a_quant.g0", "o.tp_o_b.g0",
                  "o.tp_o_b_dequant", "o.tp_o_reduce_scatter", "hc.hc_post"):
        assert stage in names, stage
    kv = g.nodes["qkv.kv_proj_matmul"]
    assert kv.attrs["accumulate"] == "atomic" and kv.attrs["m_split"] == 1
    assert [d.name for d in kv.deps] == ["attn.late_dep"]
    assert kv.operands[2].producer.op == "zeros"
    assert g.nodes["hc.hc_pre_linear"].attrs["accumulate"] == "atomic"
    assert g.nodes["qkv.kv_rms_norm_rope"].attrs["tile"] == (layers.GraphBuilder("decode-swa",
                                                             layers.graph_config(g)).tiles.KV_RMS_T_TILE,)


def test_flash_tp4_block_counts_match_the_seed_table():
    """dspark-model.md §3.1/§3.2/§3.5 block counts at TP4, T = 128; the KV side over the group's 512 rows
    (docs/seed-baselines.md "SWA": kv_rms_norm_rope and the KV RoPE tables ceil(512/8))."""
    g = built("decode-swa", "flash", 4)
    blocks = {n.name: n.attrs.get("blocks").value(g.env) for n in g.nodes.values() if "blocks" in n.attrs}
    expected = {"hc.hc_pre_rms": 16, "hc.hc_pre_linear": 32, "hc.split_pre_post": 16, "hc.comb_sinkhorn": 16,
                "hc.mix_x": 64, "attn.rms_norm": 16, "qkv.q_rope_prepare": 16, "qkv.qr_proj_matmul": 16,
                "qkv.qr_rms_norm_quant": 16, "qkv.qproj_matmul": 64, "qkv.qproj_dequant_rms_nope_rope": 16,
                "qkv.kv_proj_matmul": 16, "qkv.kv_rms_norm_rope": 64, "qkv.kv_rope_prepare": 64,
                "cp.x_normed_allgather": 16, "cp.x_normed_allgather.copy_out": 16, "swa.swa_cache_insert_valid_bias": 1,
                "swa.swa_gather_kv": 512, "swa.qk_pv": 128, "swa.merge_norm": 512, "o.tp_o_a.g0": 256,
                "o.tp_o_b.g1": 32, "o.tp_o_b_dequant": 512, "hc.hc_post": 128}
    assert {k: blocks[k] for k in expected} == expected


def test_build_errors_are_one_line():
    with pytest.raises(DsparkError, match=r"unknown layer 'decode-swx' \(did you mean 'decode-swa'\?\)"):
        layers.build("decode-swx")
    with pytest.raises(ConfigError, match=r"^tp: 3 is not supported for config 'tiny' \(choose 1, 2 or 4\)$"):
        layers.build("decode-swa", tp=3)
    with pytest.raises(ConfigError, match=r"^tp: 2 is not supported for config 'flash'"):
        layers.build("decode-swa", config="flash", tp=2)
    with pytest.raises(ConfigError, match=r"not a parameter of layer 'decode-swa'"):
        layers.build("decode-swa", kv_rowz=3)
    with pytest.raises(ConfigError, match=r"^name: unknown config 'huge'"):
        layers.build("decode-swa", config="huge")
    with pytest.raises(ConfigError, match=r"^batch: must be positive"):
        layers.build("decode-swa", batch=0)
    for e in (ConfigError("x"),):
        assert "\n" not in str(e)


def test_build_accepts_a_config_object_and_overrides():
    from goldens.config import config_by_name

    g = layers.build("decode-swa", config=config_by_name("tiny"), tp=4, batch=3, seq=2)
    assert (g.symbols["B"], g.symbols["S"], g.symbols["T"]) == (3, 2, 6)
    assert g.attributes["tp"] == 4 and g.attributes["ranks"] == 4
    verify(g)


def test_registry_summary_and_names():
    assert layers.LAYER_NAMES[:4] == ("decode-swa", "decode-csa", "decode-hca", "moe")
    assert all(layers.summary(n) for n in layers.LAYER_NAMES)
    assert "window" in layers.summary("decode-swa")
    assert "window_boundary" in runner.regimes("decode-swa")


def test_registry_holds_the_builder_functions():
    spec = layers.layer_spec("decode-swa")
    assert spec.builder is build_swa and spec.golden == "swa"
    assert all(callable(layers.layer_spec(n).builder) for n in layers.LAYER_NAMES)

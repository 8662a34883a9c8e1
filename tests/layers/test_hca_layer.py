"""decode-hca: the graph builds and verifies (tiny TP1/2/4, flash TP1/4), round-trips through the text form, shows
the HCA stage table of dspark-model.md §3.3 in the two-stream form (merge and pack kept as two ops for the
fuse-merge-rope-pack pass), matches the independent golden on the reference interpreter (tiny; TP1, TP4; 3 seeds ×
every input regime; S = 8 too), is bitwise equal to the golden stage by stage given the same upstream values, and
the checks are not vacuous."""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

import runner
from dspark_cli.main import main
from dspark_ir import layers, parse_graph, print_graph
from dspark_ir.semantics import sparse as KS
from goldens.attention import (
    attend,
    derotate_pack,
    even_tiles,
    gather_keys,
    hca_compressed_rows,
    sparse_window,
    tile_partial,
    work_rows,
)
from goldens.compressor import compress_step, compressor_weights, hca_spec
from goldens.inputs import ATTENTION_REGIMES
from goldens.layers import write_cmp_entries
from goldens.numerics import rope_half
from goldens.paging import write_rows
from goldens.tolerances import compare_layer

from .helpers import assert_layer_matches, per_rank, run_case

LAYER = "decode-hca"
SEEDS = (0, 1, 2)

# The HCA stage table (dspark-model.md §3.3) as node name → op kind. Shared prefix and O path: L1's tests.
HCA_STAGES = {
    "hca.cmp_rope_rows": "rope_gather_rows",                       # 2' (boundary rows for the entry)
    "hca.rope_interleave": "rope_interleave",                      # 2'
    "hca.hca_cache_writeback": "kv_cache_writeback",               # 5
    "cmp.kv_score_proj": "cmp_kv_score_proj",                      # 6a
    "cmp.scatter_softmax_pool": "cmp_scatter_softmax_pool",        # 6b
    "cmp.rmsnorm_rope_cache_write": "cmp_rmsnorm_rope_cache_write",  # 6c
    "hca.cache_ready_dep": "join",                                 # 7
    "hca.hca_gather_kv": "swa_gather_kv",                          # 8a
    "hca.hca_raw_transpose": "hca_raw_transpose",                  # 8b
    "hca.rope_swap": "rope_swap_idx",                              # 8c
    "hca.rope_cs": "rope_tables",                                  # 8d
    "hca.hca_raw_attn": "hca_raw_attn",                            # 8e
    "hca.hca_cmp_work_gather": "hca_cmp_work_gather",              # 8f
    "hca.hca_cmp_qk_pv": "hca_cmp_qk_pv",                          # 8g
    "hca.hca_stream_merge": "hca_stream_merge",                    # 8h
    "hca.hca_stream_pack": "hca_stream_pack",                      # 8i
    "hca.hca_output_bridge": "o_local_bridge",                     # 9-11 (TP > 1)
}
OWN_BLOCKS = {"hca", "cmp"}


@lru_cache(maxsize=None)
def graph(tp: int, config: str = "tiny", seq: int | None = None):
    return layers.build(LAYER, config=config, tp=tp, seq=seq)


# ---- structure ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("config,tp", [("tiny", 1), ("tiny", 2), ("tiny", 4), ("flash", 1), ("flash", 4)])
def test_graph_verifies_and_round_trips(config, tp):
    g = graph(tp, config)
    text = print_graph(g)
    again = parse_graph(text)
    assert again.structurally_equal(g)
    assert print_graph(again) == text
    assert g.attributes["outputs"] == ["x_out", "kv_cache", "cmp_kv", "cmp_state"]
    assert [p.name for p in g.params if p.inout] == ["kv_cache", "cmp_kv", "cmp_state"]


def test_flash_tp4_shows_the_hca_stage_table(capsys):
    """`dspark show decode-hca --config flash --tp 4` lists every stage of dspark-model.md §3.3, one per line."""
    assert main(["show", LAYER, "--config", "flash", "--tp", "4"]) == 0
    lines = [ln.strip() for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("%") and " = " in ln]
    shown = {ln.split(" ", 1)[0].rstrip(",")[1:]: ln.split(" = ", 1)[1].split("(", 1)[0] for ln in lines}
    assert {k: v for k, v in shown.items() if k.split(".")[0] in OWN_BLOCKS} == HCA_STAGES
    g = graph(4, "flash")
    n = g.nodes
    ready = n["hca.cache_ready_dep"]
    assert {v.name for v in ready.deps} == {"hca.hca_cache_writeback", "cmp.rmsnorm_rope_cache_write"}
    for reader in ("hca.hca_gather_kv", "hca.hca_cmp_work_gather"):
        assert ready.result in n[reader].deps
    assert g.values["attn.late_dep"] in n["cmp.kv_score_proj"].deps
    assert n["hca.hca_raw_attn"].attrs["blocks"].value(g.env) == 512
    assert n["hca.hca_raw_transpose"].attrs["blocks"].value(g.env) == 512
    assert n["cmp.kv_score_proj"].attrs["blocks"].value(g.env) == 64


def test_merge_and_pack_are_two_ops_for_the_fusion_pass():
    """hca_stream_merge → (normalised f32 stream heads, used only by) → hca_stream_pack, whose other operands are
    the rope_swap / rope_cs tables: the BEFORE structure of dspark-model.md §6(c)."""
    g = graph(4, "flash")
    merge, pack = g.nodes["hca.hca_stream_merge"], g.nodes["hca.hca_stream_pack"]
    assert [u.name for u in g.users(merge.result)] == ["hca.hca_stream_pack"]
    assert str(merge.result.type) == "f32[T,64,512]"
    producers = {v.producer.name for v in pack.operands}
    assert producers == {"hca.hca_stream_merge", "hca.rope_cs", "hca.rope_swap"}
    assert {v.producer.name for v in merge.operands if v.producer} == {"hca.hca_raw_attn", "hca.hca_cmp_qk_pv"}


# ---- golden match -------------------------------------------------------------------------------------------
def check_stages(cfg, inp, env):
    """My stages, fed the graph's own upstream values, against the golden's functions: bitwise."""
    mismatched = []

    def check(name, want, got=None):
        got = env[name] if got is None else got
        a, b = np.asarray(got, np.float64), np.asarray(want, np.float64).reshape(np.shape(got))
        if not np.array_equal(a, b):
            mismatched.append(name)

    pos, q = inp["positions"], env["qkv.qproj_dequant_rms_nope_rope"]
    state, entries = compress_step(cfg, hca_spec(cfg), env["attn.rms_norm"], pos, compressor_weights(inp, "cmp_"),
                                   inp["cmp_state"], inp["cmp_state_block_table"], inp["rope_cos"], inp["rope_sin"])
    check("cmp.scatter_softmax_pool", state)
    cmp_kv = write_cmp_entries(inp["cmp_kv"], entries, inp["cmp_slot_mapping"])
    check("cmp.rmsnorm_rope_cache_write", cmp_kv)
    kv_cache = write_rows(inp["kv_cache"], inp["swa_slot_mapping"], env["qkv.kv_rms_norm_rope"])
    check("hca.hca_cache_writeback", kv_cache)
    win_keys, win_valid = gather_keys(kv_cache, *sparse_window(inp["swa_indices"]))
    check("hca.hca_gather_kv", win_keys)
    raw = tile_partial(q, win_keys, win_valid, cfg.softmax_scale)
    for name, want in zip(("hca.hca_raw_attn", "hca.stream_state_l", "hca.stream_heads"), raw):
        check(name, want)
    rows = hca_compressed_rows(cfg, pos, inp["kv_seq_len"], inp["cmp_block_table"])
    cmp_keys, cmp_valid = gather_keys(cmp_kv, rows)
    keys = np.concatenate([win_keys, cmp_keys], axis=1)
    valid = np.concatenate([win_valid, cmp_valid], axis=1)
    win = win_keys.shape[1]
    out = attend(cfg, q, keys, valid, [(0, win)] + even_tiles(win, keys.shape[1], work_rows(cfg)), inp["attn_sink"])
    check("hca.hca_stream_merge", out)
    packed = derotate_pack(cfg, out, rope_half(inp["rope_cos"], pos), rope_half(inp["rope_sin"], pos))
    check("hca.hca_stream_pack", packed[:, : cfg.tokens])
    fused = KS.hca_stream_merge_pack(env["hca.hca_raw_attn"], env["hca.stream_state_l"], env["hca.stream_heads"],
                                     env["hca.hca_cmp_qk_pv"], env["hca.hca_cmp_qk_pv.l"], env["hca.hca_cmp_qk_pv.o"],
                                     inp["attn_sink"], env["hca.rope_cs"], env["hca.rope_cs.sin"],
                                     env["hca.rope_swap"], o_groups=cfg.o_groups)
    check("hca.hca_stream_pack", fused, env["hca.hca_stream_pack"])
    return mismatched


@pytest.mark.parametrize("regime", ATTENTION_REGIMES)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("tp", [1, 4])
def test_hca_matches_golden(tp, seed, regime):
    g = graph(tp)
    inputs = runner.layer_inputs(g, seed, regime)
    envs, got = run_case(g, inputs)
    assert_layer_matches(got, per_rank(runner.golden_outputs(g, inputs)), LAYER, g.symbols["S"])
    cfg = layers.graph_config(g)
    for rank, (inp, env) in enumerate(zip(per_rank(inputs), envs)):
        assert check_stages(cfg, inp, env) == [], f"rank {rank}"


@pytest.mark.parametrize("seed", SEEDS)
def test_hca_seq8_matches_golden(seed):
    g = graph(1, seq=8)
    inputs = runner.layer_inputs(g, seed, "default")
    envs, got = run_case(g, inputs)
    assert_layer_matches(got, per_rank(runner.golden_outputs(g, inputs)), LAYER, g.symbols["S"])
    assert check_stages(layers.graph_config(g), inputs, envs[0]) == []


# ---- non-vacuity --------------------------------------------------------------------------------------------
def pooling_case(tp):
    """The first (seed, regime) in which some request pools an HCA entry this step (an R boundary in its chunk)."""
    g = graph(tp)
    for seed in range(20):
        for regime in ("short_cache", "long_cache", "default"):
            inputs = runner.layer_inputs(g, seed, regime)
            if any(np.any(d["cmp_slot_mapping"] >= 0) for d in per_rank(inputs)):
                return g, inputs
    raise AssertionError("no input regime pools an HCA entry")


def breaks(tp, inputs_case, name, factor, bias, output):
    g, inputs = inputs_case
    want = per_rank(runner.golden_outputs(g, inputs))
    changed = [dict(d) for d in per_rank(inputs)]
    for d in changed:
        d[name] = (np.asarray(d[name]).astype(np.float32) * factor + bias).astype(d[name].dtype)
    _, got = run_case(g, changed if tp > 1 else changed[0])
    result = {c.name: c for c in compare_layer(got, want, LAYER)}[output]
    return not result.ok


@pytest.mark.parametrize("tp", [1, 4])
def test_perturbing_the_compressor_breaks_the_match(tp):
    """The entry pooled this step is attended by its boundary token: a changed wkv moves x_out; a changed norm_w
    moves cmp_kv."""
    case = pooling_case(tp)
    assert breaks(tp, case, "cmp_wkv", 3.0, 0.5, "x_out")
    assert breaks(tp, case, "cmp_norm_w", 3.0, 0.5, "cmp_kv")


@pytest.mark.parametrize("tp", [1, 4])
def test_the_compressed_stream_is_attended(tp):
    """long_cache: every token sees compressed rows; scaling the compressed pool moves x_out."""
    g = graph(tp)
    inputs = runner.layer_inputs(g, 0, "long_cache")
    cfg = layers.graph_config(g)
    for d in per_rank(inputs):
        kv_len = d["kv_seq_len"][np.arange(cfg.tokens) // cfg.seq]
        assert np.all(np.minimum((d["positions"] + 1) // cfg.hca_ratio, kv_len // cfg.hca_ratio) > 0)
    assert breaks(tp, (g, inputs), "cmp_kv", 4.0, 0.0, "x_out")

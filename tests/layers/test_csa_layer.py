"""decode-csa: the graph builds and verifies (tiny TP1/2/4, flash TP1/4), round-trips through the text form, shows
the CSA stage table of dspark-model.md §3.4, matches the independent golden on the reference interpreter (tiny;
TP1, TP4; 3 seeds × every input regime; S = 8 too), is bitwise equal to the golden stage by stage given the same
upstream values, and the checks are not vacuous (perturbed compressor / indexer weights leave the tolerance; the
long-cache regime really selects a strict subset through top-k)."""
from __future__ import annotations

from functools import lru_cache

import numpy as np
import pytest

import runner
from dspark_cli.main import main
from dspark_ir import layers, parse_graph, print_graph
from goldens.attention import attend, csa_compressed_rows, derotate_pack, even_tiles, gather_keys, sparse_window
from goldens.compressor import compress_step, compressor_weights, csa_spec, indexer_spec
from goldens.config import tiles_for
from goldens.indexer import head_weights, index_query, index_scores, topk_indices, visible_lengths, write_index_cache
from goldens.inputs import ATTENTION_REGIMES
from goldens.layers import write_cmp_entries
from goldens.numerics import rope_half
from goldens.paging import request_of_tokens, write_rows
from goldens.tolerances import compare_layer

from .helpers import assert_layer_matches, per_rank, run_case

LAYER = "decode-csa"
SEEDS = (0, 1, 2)

# The CSA stage table (dspark-model.md §3.4) as node name → op kind, in table order. The shared prefix (hc.*,
# attn.*, qkv.*) and the O path (o.*) are L1's sub-blocks and are checked by their own tests.
CSA_STAGES = {
    "csa.csa_rope_step": "rope_gather_rows",                       # 2'
    "csa.rope_interleave.step": "rope_interleave",                 # 2''
    "csa.csa_cmp_rope": "rope_gather_rows",                        # 2''
    "csa.rope_interleave.cmp": "rope_interleave",                  # 2''
    "csa.csa_cache_writeback": "kv_cache_writeback",               # 5
    "cmp.kv_score_proj": "cmp_kv_score_proj",                      # 6
    "cmp.scatter_softmax_pool": "cmp_scatter_softmax_pool",
    "cmp.rmsnorm_rope_cache_write": "cmp_rmsnorm_rope_cache_write",
    "idx.idx_qr_proj_matmul": "matmul",                            # 7a-f
    "idx.idx_qr_proj_dequant": "idx_qr_dequant",
    "idx.qr_rope_swap_idx": "rope_swap_idx",
    "idx.qr_rope": "idx_qr_rope",
    "idx.qr_hadamard_matmul": "idx_hadamard_matmul",
    "idx.qr_hadamard_quant": "idx_q_quant",
    "idx.weights_proj": "idx_weights_proj",                        # 7g-h
    "idx.weights_proj_reduce": "idx_weights_reduce",
    "icmp.kv_score_proj": "cmp_kv_score_proj",                     # 7i
    "icmp.scatter_softmax_pool": "cmp_scatter_softmax_pool",
    "icmp.rmsnorm_rope": "cmp_rmsnorm_rope",
    "icmp.kv_hadamard": "cmp_kv_hadamard",
    "icmp.kv_and_cache_write": "idx_kv_cache_write",
    "idx.score": "idx_score",                                      # 7j
    "idx.topk": "idx_topk",                                        # 7k
    "csa.kv_touch": "kv_touch",                                    # 8a
    "csa.csa_slots_build_valid_qk_plan": "csa_slots_build_valid_qk_plan",  # 8b
    "csa.qk_pv": "csa_qk_pv",                                      # 8c
    "csa.rope_cs": "rope_tables",                                  # 8d
    "csa.merge_norm": "csa_merge_norm",                            # 8e
    "csa.csa_o_local_bridge": "o_local_bridge",                    # 9-13 (TP > 1)
}
OWN_BLOCKS = {"csa", "cmp", "icmp", "idx"}


@lru_cache(maxsize=None)
def graph(tp: int, config: str = "tiny", seq: int | None = None, max_context: int | None = None):
    params = {} if max_context is None else {"max_context": max_context}
    return layers.build(LAYER, config=config, tp=tp, seq=seq, **params)


# ---- structure ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("config,tp", [("tiny", 1), ("tiny", 2), ("tiny", 4), ("flash", 1), ("flash", 4)])
def test_graph_verifies_and_round_trips(config, tp):
    g = graph(tp, config)
    text = print_graph(g)
    again = parse_graph(text)
    assert again.structurally_equal(g)
    assert print_graph(again) == text
    assert g.attributes["layer"] == LAYER and g.attributes["tp"] == tp and g.attributes["ranks"] == tp
    assert g.attributes["outputs"] == ["x_out", "kv_cache", "cmp_kv", "cmp_state", "idx_kv_cache", "idx_kv_scale",
                                       "idx_cmp_state"]
    assert [p.name for p in g.params if p.inout] == ["kv_cache", "cmp_kv", "cmp_state", "idx_kv_cache",
                                                     "idx_kv_scale", "idx_cmp_state"]


def shown_stages(capsys, layer: str) -> dict[str, str]:
    """node name → op kind of every line `dspark show <layer> --config flash --tp 4` prints."""
    assert main(["show", layer, "--config", "flash", "--tp", "4"]) == 0
    lines = [ln.strip() for ln in capsys.readouterr().out.splitlines() if ln.strip().startswith("%") and " = " in ln]
    return {ln.split(" ", 1)[0].rstrip(",")[1:]: ln.split(" = ", 1)[1].split("(", 1)[0] for ln in lines}


def test_flash_tp4_shows_the_csa_stage_table(capsys):
    """`dspark show decode-csa --config flash --tp 4` lists every stage of dspark-model.md §3.4, one per line."""
    shown = shown_stages(capsys, LAYER)
    assert {k: v for k, v in shown.items() if k.split(".")[0] in OWN_BLOCKS} == CSA_STAGES
    g = graph(4, "flash")
    n = g.nodes
    assert n["csa.qk_pv"].attrs["workers"] == 24 and n["idx.score"].attrs["blocks"].value(g.env) == 256
    assert n["cmp.kv_score_proj"].attrs["blocks"].value(g.env) == 128
    assert n["csa.merge_norm"].attrs["blocks"].value(g.env) == 512
    assert n["idx.weights_proj"].attrs["blocks"].value(g.env) == 32
    late = g.values["attn.late_dep"]
    assert all(late in n[name].deps for name in ("cmp.kv_score_proj", "icmp.kv_score_proj", "idx.weights_proj"))


def test_topk_path_records_the_bypass_facts():
    """idx.score → idx.topk is a separate pair whose attributes say when the top-k is a permutation of
    [0, visible): max_visible ≤ k (dspark-model.md §6(a))."""
    g = graph(1)
    topk = g.nodes["idx.topk"]
    assert topk.operands[0] is g.nodes["idx.score"].result
    assert [u.name for u in g.users(g.nodes["idx.score"].result)] == ["idx.topk"]
    assert topk.attrs["k"] == 16 and topk.attrs["max_visible"] == 64
    assert graph(1, max_context=64).nodes["idx.topk"].attrs["max_visible"] == 16
    assert graph(4, "flash").nodes["idx.topk"].attrs["max_visible"] == 2048


def test_context_bound_sets_the_live_qk_blocks():
    """A context bound that leaves top-k blocks empty shrinks csa.qk_pv to its live blocks (flash 16×256: window
    128 + 64 visible entries → 2 of 5 blocks of 128); the cache capacity leaves it whole (no attribute)."""
    from dspark_ir.layers.csa import live_qk_blocks

    bounded = layers.build("decode-csa", config="flash", tp=4, batch=16, seq=8, max_context=256)
    qk = bounded.nodes["csa.qk_pv"]
    assert qk.attrs["live_blocks"] == 2 and qk.results[0].type.shape[1].value() == 2
    assert bounded.nodes["csa.merge_norm"].operands[0] is qk.results[0]
    assert "live_blocks" not in graph(4, "flash").nodes["csa.qk_pv"].attrs
    assert live_qk_blocks(128, 512, 2048, 128) == {} and live_qk_blocks(128, 512, 0, 128) == {"live_blocks": 1}
    assert live_qk_blocks(128, 512, 384, 128) == {"live_blocks": 4} and live_qk_blocks(128, 512, 385, 128) == {}


# ---- golden match -------------------------------------------------------------------------------------------
def check_stages(cfg, inp, env):
    """My stages, fed the graph's own upstream values, against the golden's functions: bitwise (head weights:
    within 4 ulp of Σ|partials|, see test_indexer_ops)."""
    mismatched = []

    def check(name, want, got=None):
        got = env[name] if got is None else got
        a, b = np.asarray(got, np.float64), np.asarray(want, np.float64).reshape(np.shape(got))
        if not np.array_equal(a, b):
            mismatched.append(name)

    pos, x_normed = inp["positions"], env["attn.rms_norm"]
    state, entries = compress_step(cfg, csa_spec(cfg), x_normed, pos, compressor_weights(inp, "cmp_"),
                                   inp["cmp_state"], inp["cmp_state_block_table"], inp["rope_cos"], inp["rope_sin"])
    check("cmp.scatter_softmax_pool", state)
    cmp_kv = write_cmp_entries(inp["cmp_kv"], entries, inp["cmp_slot_mapping"])
    check("cmp.rmsnorm_rope_cache_write", cmp_kv)
    istate, ientries = compress_step(cfg, indexer_spec(cfg), x_normed, pos, compressor_weights(inp, "idx_cmp_"),
                                     inp["idx_cmp_state"], inp["idx_cmp_state_block_table"], inp["rope_cos"],
                                     inp["rope_sin"])
    check("icmp.scatter_softmax_pool", istate)
    cache, scale = write_index_cache(inp["idx_kv_cache"], inp["idx_kv_scale"], ientries, inp["idx_slot_mapping"],
                                     inp["idx_hadamard"])
    check("icmp.kv_and_cache_write", cache)
    check("icmp.kv_and_cache_write.scale", scale)
    first = pos[request_of_tokens(len(pos), cfg.seq) * cfg.seq]
    q_i8, q_s = index_query(cfg, env["qkv.qr_rms_norm_quant"], env["qkv.qr_rms_norm_quant.scale"][:, None],
                            inp["idx_wq_b"], inp["idx_wq_b_scale"], inp["idx_hadamard"],
                            rope_half(inp["rope_cos"], first), rope_half(inp["rope_sin"], first))
    check("idx.qr_hadamard_quant", q_i8)
    check("idx.qr_hadamard_quant.scale", q_s)
    w = env["idx.weights_proj_reduce"]
    exact = head_weights(cfg, x_normed, inp["idx_weights_proj"])
    if not np.allclose(w, exact, rtol=1e-5, atol=1e-7):
        mismatched.append("idx.weights_proj_reduce")
    vis = visible_lengths(cfg, pos, inp["kv_seq_len"])
    check("idx.score", index_scores(cfg, q_i8, q_s, w, cache, scale, inp["idx_block_table"], vis))
    check("idx.topk", topk_indices(cfg, env["idx.score"], vis))
    kv_cache = write_rows(inp["kv_cache"], inp["swa_slot_mapping"], env["qkv.kv_rms_norm_rope"])
    check("csa.kv_touch", kv_cache)
    rows = csa_compressed_rows(cfg, env["idx.topk"], pos, inp["cmp_block_table"])
    check("csa.csa_slots_build_valid_qk_plan", rows)
    win_keys, win_valid = gather_keys(kv_cache, *sparse_window(inp["swa_indices"]))
    cmp_keys, cmp_valid = gather_keys(cmp_kv, rows)
    keys = np.concatenate([win_keys, cmp_keys], axis=1)
    valid = np.concatenate([win_valid, cmp_valid], axis=1)
    out = attend(cfg, env["qkv.qproj_dequant_rms_nope_rope"], keys, valid,
                 even_tiles(0, keys.shape[1], tiles_for(cfg).ATTN_K_TILE), inp["attn_sink"])
    packed = derotate_pack(cfg, out, rope_half(inp["rope_cos"], pos), rope_half(inp["rope_sin"], pos))
    check("csa.merge_norm", packed[:, : cfg.tokens])
    return mismatched


@pytest.mark.parametrize("regime", ATTENTION_REGIMES)
@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("tp", [1, 4])
def test_csa_matches_golden(tp, seed, regime):
    """Whole-layer outputs within the documented tolerances (goldens/tolerances.py), and every CSA
    stage bitwise equal to the golden's function given the graph's own upstream values."""
    g = graph(tp)
    inputs = runner.layer_inputs(g, seed, regime)
    envs, got = run_case(g, inputs)
    assert_layer_matches(got, per_rank(runner.golden_outputs(g, inputs)), LAYER, g.symbols["S"])
    cfg = layers.graph_config(g)
    for rank, (inp, env) in enumerate(zip(per_rank(inputs), envs)):
        assert check_stages(cfg, inp, env) == [], f"rank {rank}"


@pytest.mark.parametrize("seed", SEEDS)
def test_csa_seq8_matches_golden(seed):
    """S = 8: two ratio-4 boundaries per chunk, only the first pooled; the indexer's step RoPE row is the chunk's
    first position for all 8 tokens."""
    g = graph(1, seq=8)
    inputs = runner.layer_inputs(g, seed, "default")
    envs, got = run_case(g, inputs)
    assert_layer_matches(got, per_rank(runner.golden_outputs(g, inputs)), LAYER, g.symbols["S"])
    assert check_stages(layers.graph_config(g), inputs, envs[0]) == []


# ---- non-vacuity --------------------------------------------------------------------------------------------
def perturbed(tp, regime, mutate):
    """(golden on the original inputs, graph outputs and envs on the mutated inputs)."""
    g = graph(tp)
    inputs = runner.layer_inputs(g, 0, regime)
    want = per_rank(runner.golden_outputs(g, inputs))
    changed = [dict(d) for d in per_rank(inputs)]
    for d in changed:
        mutate(d)
    envs, got = run_case(g, changed if tp > 1 else changed[0])
    return want, got, envs


def scaled(name, factor, bias=0.0):
    def mutate(d):
        a = np.asarray(d[name]).astype(np.float32) * factor + bias
        d[name] = a.astype(d[name].dtype)
    return mutate


@pytest.mark.parametrize("tp", [1, 4])
@pytest.mark.parametrize("what,regime,breaks", [
    ("cmp_wkv", "short_cache", "x_out"),              # main compressor: the entry pooled this step is attended
    ("cmp_norm_w", "default", "cmp_kv"),
    ("idx_cmp_wkv", "default", "idx_kv_cache"),        # inner compressor: the C8 key of this step
    ("idx_weights_proj", "long_cache", "x_out"),      # indexer: another top-k selection
    ("idx_wq_b_scale", "long_cache", "x_out"),
])
def test_perturbing_a_weight_breaks_the_match(tp, what, regime, breaks):
    flip = scaled(what, -1.0) if what in ("idx_weights_proj", "idx_wq_b_scale") else scaled(what, 3.0, 0.5)
    want, got, _ = perturbed(tp, regime, flip)
    results = {c.name: c for c in compare_layer(got, want, LAYER)}
    assert not results[breaks].ok, f"{what} → {breaks}: {results[breaks].detail}"


@pytest.mark.parametrize("tp", [1, 4])
@pytest.mark.parametrize("seed", SEEDS)
def test_long_cache_selects_a_strict_subset(tp, seed):
    """Every token sees more entries than IDX_TOPK, keeps exactly IDX_TOPK of them, and the choice is the scores'
    (not simply the first IDX_TOPK entries)."""
    g = graph(tp)
    inputs = per_rank(runner.layer_inputs(g, seed, "long_cache"))
    envs, _ = run_case(g, inputs if tp > 1 else inputs[0])
    cfg = layers.graph_config(g)
    k = cfg.idx_topk
    for inp, env in zip(inputs, envs):
        vis = visible_lengths(cfg, inp["positions"], inp["kv_seq_len"])
        topk = env["idx.topk"]
        assert np.all(vis > k)
        assert np.all((topk[:, :k] >= 0) & (topk[:, :k] < vis[:, None])) and np.all(topk[:, k:] == -1)
        assert np.all([len(set(row[:k])) == k for row in topk])
        assert any(set(row[:k]) != set(range(k)) for row in topk)
        assert np.all((env["csa.csa_slots_build_valid_qk_plan"] >= 0).sum(axis=1) == k)

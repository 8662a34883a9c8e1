"""max_context beyond the cache capacity (issue 17's 128K contexts): decode-hca / decode-csa at flash TP1 and TP4
build and verify at 131072 with the page tables, pools, RoPE rows and the indexer's score width following from it
(goldens.config.with_context); a bound within the capacity changes no shape; graph_config gives the grown config
back (so the goldens' inputs follow it: a tiny graph grown past its capacity still holds the golden); the text
form round-trips; `--context` on a layer name, one-line errors elsewhere. Graph building only: no flash-sized
arrays are allocated."""
from __future__ import annotations

import numpy as np
import pytest

import runner
from dspark_cli.main import main
from dspark_ir import layers, parse_graph, print_graph
from dspark_ir.interp import run
from goldens.config import FLASH, ConfigError, cache_geometry, with_context

CTX = 131072


def params(g) -> dict[str, str]:
    return {p.name: str(p.type) for p in g.params}


@pytest.mark.parametrize("tp", (1, 4))
def test_flash_hca_at_128k(tp):
    g = layers.build("decode-hca", config="flash", tp=tp, max_context=CTX)
    B = g.env["B"]
    pages = CTX // FLASH.hca_ratio // FLASH.block_size                  # 1024 compressed rows = 32 pages
    assert params(g)["cmp_block_table"] == f"i32[B,{pages}]"
    assert params(g)["kv_block_table"] == f"i32[B,{CTX // FLASH.block_size}]"
    assert params(g)["rope_cos"] == f"bf16[{CTX},64]"
    assert (g.env["KV"], g.env["CMP"]) == (B * CTX, B * pages * FLASH.block_size)
    gather, qk = g.nodes["hca.hca_cmp_work_gather"], g.nodes["hca.hca_cmp_qk_pv"]
    assert (gather.attrs["works"], qk.attrs["work_rows"], qk.attrs["max_rows"]) == (8, 128, 1024)
    assert g.attributes["max_context"] == CTX
    cfg = layers.graph_config(g)
    assert (cfg.context, cfg.max_pos, cache_geometry(cfg).hca_blocks) == (CTX, CTX, pages)


@pytest.mark.parametrize("tp", (1, 4))
def test_flash_csa_at_128k(tp):
    g = layers.build("decode-csa", config="flash", tp=tp, max_context=CTX)
    entries = CTX // FLASH.csa_ratio                                    # 32768 compressed entries
    assert params(g)["cmp_block_table"] == f"i32[B,{entries // FLASH.block_size}]"
    assert params(g)["idx_block_table"] == f"i32[B,{entries // FLASH.block_size}]"
    for name in ("idx.score", "idx.topk"):
        assert (g.nodes[name].attrs["score_len"], g.nodes[name].attrs["max_visible"]) == (entries, entries)
    assert g.nodes["idx.score"].results[0].type.shape[1].value() == entries


@pytest.mark.parametrize("layer", ("decode-hca", "decode-csa"))
def test_a_bound_within_the_capacity_changes_no_shape(layer):
    default = layers.build(layer, config="flash", tp=4)
    for ctx in (256, 8192):
        g = layers.build(layer, config="flash", tp=4, max_context=ctx)
        assert params(g) == params(default) and g.symbols == default.symbols
        assert layers.graph_config(g) == layers.graph_config(default)


def test_the_text_form_round_trips_at_128k():
    g = layers.build("decode-hca", config="flash", tp=1, max_context=CTX)
    back = parse_graph(print_graph(g))
    assert back.structurally_equal(g) and layers.graph_config(back).context == CTX


def test_with_context():
    assert with_context(FLASH, 8192) is FLASH
    grown = with_context(FLASH, 100_000)             # max_pos: a multiple of both ratios and the page size
    assert (grown.context, grown.max_pos, cache_geometry(grown).ctx_cap) == (100_000, 100_096, 100_000)
    with pytest.raises(ConfigError, match="context: must be positive"):
        with_context(FLASH, 0)
    with pytest.raises(ConfigError, match="context: 16385 > max_pos=16384"):
        FLASH.with_(context=16385)


def test_a_tiny_graph_grown_past_its_capacity_holds_the_golden():
    """tiny's caches hold 256 tokens; at max_context = 512 they grow, and the golden's inputs (long-cache
    starts up to 512 - S) follow the graph's config, so the interpreter still matches the golden."""
    g = layers.build("decode-hca", config="tiny", tp=1, max_context=512)
    assert layers.graph_config(g).context == 512
    inputs = runner.layer_inputs(g, 0, "long_cache")
    assert int(np.max(inputs["kv_seq_len"])) > 256
    out = run(g, inputs)
    bad = [c for c in runner.compare_outputs(g, out, runner.golden_outputs(g, inputs), inputs) if not c.ok]
    assert not bad, bad


def test_context_flag(capsys):
    assert main(["opt", "decode-hca", "--config", "flash", "--tp", "1", "--context", "128K", "-o", "-"]) == 0
    assert "max_context = 131072" in capsys.readouterr().out
    for argv, message in ((["opt", "decode-swa", "--context", "8K"], "--context: applies to decode-csa and "
                                                                      "decode-hca only"),
                          (["opt", "decode-hca", "--context", "8K,16K"], "--context: one value")):
        assert main(argv) != 0
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err

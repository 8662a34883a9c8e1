"""hca-attn-workers on the layers: bitwise on tiny decode-hca (3 seeds; both raw forms) and still within the golden
tolerance; no site on SWA, CSA or MoE; at flash TP4 (the default pipeline) the per-request raw attention goes from
512 blocks to 20 cyclic token workers and the compressed QK/PV from 128 blocks to 16 (one per request), the grids
of the captured code of the chip swimlane. Before/after cases: tests/passes/hca-attn-workers/."""
from __future__ import annotations

import pytest

from dspark_ir import layers, parse_graph
from passes import get_pass
from passes.infra.base import Skip

from .layer_support import SEEDS, flash_opt, golden_mismatches, optimise, statuses, tiny
from .support import HERE

RAW, CMP = "hca.hca_raw_attn", "hca.hca_cmp_qk_pv"
REQUEST = "hca-raw-kv-no-transpose,raw-kv-gather-per-request"


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("before", ["", REQUEST])
def test_bitwise_on_tiny_hca_and_within_the_golden_tolerance(before, seed):
    g = tiny("decode-hca")                                   # TP2: T = 16 tokens, S = 4
    tokens, seq = g.env["T"], g.env["S"]
    result = optimise(g, ",".join(filter(None, [before, "hca-attn-workers"])), seed)   # bitwise: checked
    assert statuses(result)["hca-attn-workers"] == "changed"
    raw = next(n for n in result.graph.nodes.values() if n.name.startswith(RAW))
    cmp = result.graph.nodes[CMP]
    assert (raw.attrs["workers"], raw.attrs["blocks"].value(g.env)) == (min(20, tokens), min(20, tokens))
    assert list(raw.attrs["tile"]) == [1, raw.operands[0].type.shape[1].value()]
    assert list(cmp.attrs["tile"]) == [seq] and cmp.attrs["blocks"].value(g.env) == tokens // seq * (
        g.nodes[CMP].attrs["blocks"].value(g.env) // tokens)
    assert not golden_mismatches(result.graph, seed)


@pytest.mark.parametrize("layer", ["decode-swa", "decode-csa", "moe"])
def test_no_op_elsewhere(layer):
    assert statuses(optimise(tiny(layer), "hca-attn-workers", numerics=False)) == {"hca-attn-workers": "no-op"}


def test_fires_at_flash_tp4(tmp_path):
    before = layers.build("decode-hca", config="flash", tp=4)
    after = flash_opt("decode-hca", tmp_path)
    assert before.nodes[RAW].attrs["blocks"].value(before.env) == 512
    assert before.nodes[CMP].attrs["blocks"].value(before.env) == 128
    raw = after.nodes["hca.hca_raw_attn_request"]
    assert (raw.attrs["workers"], raw.attrs["blocks"].value(after.env), list(raw.attrs["tile"])) == (20, 20, [1, 64])
    cmp = after.nodes[CMP]
    assert (cmp.attrs["blocks"].value(after.env), list(cmp.attrs["tile"])) == (16, [8]) and "workers" not in cmp.attrs


def test_skip_reasons():
    case = parse_graph((HERE / "hca-attn-workers" / "boundary.before.dsir").read_text())
    found = list(get_pass("hca-attn-workers")(raw_workers=4, cmp_per_request=False).match(case))
    reasons = {s.at: s.reason for s in found if isinstance(s, Skip)}
    assert [s.node.name for s in found if not isinstance(s, Skip)] == ["hca.hca_raw_attn_direct"]
    assert reasons == {"hca.hca_raw_attn": "already 3 blocks for 6 tokens (raw_workers = 4)",
                       "hca.hca_cmp_qk_pv": "already on 6 cyclic workers",
                       "hca.cmp2": "cmp_per_request = false"}
    sites = [s for s in get_pass("hca-attn-workers")().match(case) if not isinstance(s, Skip)]
    assert sorted(s.node.name for s in sites) == ["hca.cmp2", "hca.hca_raw_attn_direct"]

"""topk-merge-stage (dspark-model.md §6(h)): the prefill indexer top-k's extra 1024 merge stage.

The demonstration is examples/prefill_indexer_topk.dsir: a second 1024-token chunk whose score cap
(INDEXER_SCORE_CAP = 2·T / 4 = 512) exceeds the widest of the seed's sort stages (32, 64, 256). The expected top-k
is computed here with a plain numpy argsort of each visible score prefix, independently of the op's semantics.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dspark_cli.main import main
from dspark_ir import interp, parse_graph, print_graph
from dspark_ir.ops.indexer import SEED_PREFILL_SORT_STAGES
from dspark_ir.semantics.indexer import idx_topk
from passes import PassContext, run_pipeline
from passes.infra import properties
from passes.infra.errors import PassError
from passes.topk_merge_stage import TopkMergeStage

from .support import checked

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "prefill_indexer_topk.dsir"
START = 1024                     # the chunk's first position: a second chunk of the request


def example():
    return checked(EXAMPLE.read_text(), str(EXAMPLE))


def chunk_inputs(g, seed: int) -> dict:
    t = g.symbols["T"]
    rng = np.random.default_rng(seed)
    return {"score": rng.standard_normal((t, g.nodes["idx.topk"].attrs["score_len"])).astype(np.float32),
            "positions": np.arange(START, START + t, dtype=np.int32),
            "kv_seq_len": np.array([START + t], np.int32)}


def full_sort_topk(inputs: dict, k: int, cap: int) -> list[np.ndarray]:
    """Per token: the top-k of the visible prefix by a plain stable argsort (the intended keys)."""
    out = []
    for pos, row in zip(inputs["positions"], inputs["score"]):
        visible = min(int(inputs["kv_seq_len"][0]) // 4, (int(pos) + 1) // 4, cap)
        out.append(np.argsort(-row[:visible].astype(np.float64), kind="stable")[:min(k, visible)])
    return out


def rows_matching(got: np.ndarray, expected: list[np.ndarray]) -> np.ndarray:
    return np.array([np.array_equal(got[t, :len(e)], e) and (got[t, len(e):] == -1).all()
                     for t, e in enumerate(expected)])


def merged(g):
    return run_pipeline(g, "topk-merge-stage", ctx=PassContext(use_env=False, verify_each=True,
                                                               roundtrip_each=True)).graph


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_wrong_keys_without_the_stage_right_with_it(seed):
    g = example()
    node = g.nodes["idx.topk"]
    k, cap = node.attrs["k"], node.attrs["max_visible"]
    assert node.attrs["sort_stages"] == SEED_PREFILL_SORT_STAGES
    inputs = chunk_inputs(g, seed)
    expected = full_sort_topk(inputs, k, cap)
    visible = np.minimum((inputs["positions"] + 1) // 4, cap)
    before = rows_matching(interp.run(g, inputs)["idx.topk"], expected)
    # within one run of 256 the staged sort is the sort; past it nearly every token takes wrong keys
    assert before[visible <= 256].all()
    assert (~before[visible > 256]).mean() > 0.9, (~before[visible > 256]).mean()
    after_g = merged(g)
    assert after_g.nodes["idx.topk"].attrs["sort_stages"] == (32, 64, 256, 1024)
    assert rows_matching(interp.run(after_g, inputs)["idx.topk"], expected).all()


def test_flash_k_needs_a_cap_past_k():
    """At flash k = 512 a cap of 512 has no wrong keys (the top-512 of ≤ 512 visible entries is all of them, in
    another order); a 2048-token second chunk (cap 1024) does, and the pass then adds the 1024 stage."""
    rng = np.random.default_rng(0)
    t, cap, k = 8, 1024, 512
    positions = np.arange(4096 - t, 4096, dtype=np.int32)
    score = rng.standard_normal((t, 2048)).astype(np.float32)
    attrs = dict(k=k, ratio=4, seq=t, score_len=2048, max_visible=cap)
    full = idx_topk(score, positions, [4096], **attrs)
    staged = idx_topk(score, positions, [4096], sort_stages=[32, 64, 256], **attrs)
    fixed = idx_topk(score, positions, [4096], sort_stages=[32, 64, 256, 1024], **attrs)
    assert (np.sort(staged[:, :k], axis=1) == np.arange(k)).all()     # the first 512 entries, not the best
    assert not np.array_equal(np.sort(staged, axis=1), np.sort(full, axis=1))
    np.testing.assert_array_equal(fixed, full)
    half = idx_topk(score, positions, [4096], sort_stages=[32, 64, 256], **(attrs | {"max_visible": 512}))
    np.testing.assert_array_equal(np.sort(half, axis=1), np.sort(idx_topk(
        score, positions, [4096], **(attrs | {"max_visible": 512})), axis=1))


def test_the_check_names_the_top_k():
    g = example()
    why = properties.PROPERTIES["topk-sorts-prefix"].check(g)
    assert why is not None and why.startswith("%idx.topk: score prefix 512 exceeds the widest merge stage 256")
    assert "\n" not in why
    assert properties.PROPERTIES["topk-sorts-prefix"].check(merged(g)) is None


def test_a_stage_that_does_not_cover_breaks_the_guarantee():
    """A stage that cannot merge whole runs is refused (--explain); the guarantee then names the top-k."""
    g = example()
    with pytest.raises(PassError, match=r"guarantees 'topk-sorts-prefix', but %idx.topk: score prefix 512 "):
        run_pipeline(g, "topk-merge-stage{stage=384}", ctx=PassContext(use_env=False, verify_each=True))
    skips = [s for s in TopkMergeStage(stage=384).match(g)]
    assert [s.reason for s in skips] == ["stage = 384 does not merge whole runs of the widest stage 256 "
                                         "(needs a larger multiple of it)"]


def test_the_contract_has_teeth(monkeypatch):
    """--check-numerics compares with the full-sort meaning; compared with the staged input itself (no
    `intended`), the repair is a contract violation: the seeded inputs do reach the wrong keys."""
    case = Path(__file__).parent / "topk-merge-stage" / "adds_stage.before.dsir"
    g = checked(case.read_text(), str(case))
    seeds = range(8)
    for seed in seeds:
        run_pipeline(g, "topk-merge-stage{stage=8}", ctx=PassContext(use_env=False, check_numerics=True, seed=seed))
    monkeypatch.setattr(TopkMergeStage, "intended", lambda self, graph: graph)
    broken = 0
    for seed in seeds:
        try:
            run_pipeline(g, "topk-merge-stage{stage=8}", ctx=PassContext(use_env=False, check_numerics=True,
                                                                          seed=seed))
        except PassError as e:
            assert "broke its numeric contract exact-indices" in str(e)
            broken += 1
    assert broken >= len(seeds) // 2, broken


def test_decode_top_k_is_left_alone(capsys):
    assert main(["opt", "decode-csa", "--only", "topk-merge-stage", "--explain", "topk-merge-stage"]) == 0
    captured = capsys.readouterr()
    out = captured.out + captured.err
    assert "skipped  %idx.topk: no sort_stages: one full sort of the row (decode)" in out


def test_semantics_rejects_stages_that_do_not_merge_whole_runs():
    text = EXAMPLE.read_text().replace("sort_stages = [32, 64, 256]", "sort_stages = [32, 48]")
    with pytest.raises(Exception, match="each sort stage must merge whole runs"):
        checked(parse_graph(text, "<t>"))


def test_lowering_refuses_the_unrepaired_top_k(tmp_path, capsys):
    assert main(["lower", str(EXAMPLE), "-o", str(tmp_path / "bad")]) != 0
    err = capsys.readouterr().err.strip()
    assert "idx_topk template: score prefix 512 exceeds the widest merge stage 256" in err and "\n" not in err
    assert main(["lower", str(EXAMPLE), "-p", "topk-merge-stage", "-o", str(tmp_path / "ok")]) == 0
    assert "pypto.topk" in (tmp_path / "ok" / "kernels").joinpath("idx_topk.py").read_text()
    assert print_graph(example())   # the example file itself is untouched

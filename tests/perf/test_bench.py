"""The compile-speed benchmark runs and reports ratios (no timing assertion: machines differ)."""
from __future__ import annotations

from dspark_cli.main import main
from dspark_ir import verify
from perf.bench import bench_table, run_bench
from perf.model import model_graph


def test_model_graph_chains_the_layers():
    g = model_graph("tiny")                      # 4 decoder layers: SWA, CSA, HCA, CSA (+ MoE each)
    verify(g)
    assert g.attributes["layers"] == 4 and g.attributes["layer"] == "model"
    assert sum(1 for n in g.nodes if n.endswith("hc.hc_post")) == 8
    assert "positions" in {p.name for p in g.params} and "L3.moe.w1" in {p.name for p in g.params}
    doubled = model_graph("tiny", repeat=2)
    assert len(doubled) == 2 * len(g) and doubled.attributes["layers"] == 8


def test_bench_reports_stages_and_ratios():
    result = run_bench("tiny", repeat=1, kinds=False)
    names = [c.name for c in result.cases]
    assert names == ["decoder layer", "model", "model x2"]
    assert set(result.ratios()) == {"model / decoder layer", "model x2 / model"}
    for c in result.cases:
        assert set(c.seconds) == {"parse", "passes", "lowering", "codegen"} and c.total > 0 and c.kernels > 0
    table = bench_table(result)
    assert "| model x2 / model |" in table and "| doubling ≤ 2.2× |" in table
    print(table)


def test_cli(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "--config", "tiny", "--repeat", "1", "--no-kinds", "--no-doubled", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "model / decoder layer" in text and out.is_file()

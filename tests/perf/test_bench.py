"""The compile-speed benchmark runs and reports ratios (no timing assertion: machines differ)."""
from __future__ import annotations

from collections import Counter

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


def test_prefill_model_graph_chains_the_prefill_layers():
    g = model_graph("tiny", prefill=7)
    verify(g)
    assert g.symbols["T"] == 7 and g.name == "tiny_prefill_step"
    assert "L1.idx.topk" in g.nodes and "L2.cmp.prefill_pool" in g.nodes and "L0.moe.hc.hc_post" in g.nodes


def test_optimised_deps_grow_linearly_with_the_layers():
    """The default pipeline's explicit deps double when the model doubles: a release orders the next collective
    only and a one-notify barrier waits for its own layer's push, not for every earlier layer's (which made the
    deps, and everything downstream of them, grow with the square of the layers)."""
    from passes import PassContext, run_pipeline

    def deps(g) -> Counter:
        out = Counter()
        for n in g.nodes.values():
            out[n.op] += len(n.deps)
        return out

    once = deps(run_pipeline(model_graph("tiny", tp=2), ctx=PassContext(use_env=False)).graph)
    twice = deps(run_pipeline(model_graph("tiny", tp=2, repeat=2), ctx=PassContext(use_env=False)).graph)
    for op in ("o_group_a2a", "o_proj_a", "window_release", "tp_o_reduce_scatter", "signal_barrier", "cp_allgather"):
        assert twice[op] == 2 * once[op], op
    # one release dep per layer; the SWA layer's a2a follows its x_normed gather's release (docs/seed-baselines.md)
    assert once["o_group_a2a"] == 1 and once["tp_o_reduce_scatter"] == 4
    assert all(twice[op] <= 2 * once[op] for op in twice), twice - once - once
    assert sum(twice.values()) <= 2 * sum(once.values())


def test_bench_reports_stages_and_ratios():
    result = run_bench("tiny", repeat=1, kinds=False)
    names = [c.name for c in result.cases]
    assert names == ["decoder layer", "model", "model x2", "prefill model"]
    assert set(result.ratios()) == {"model / decoder layer", "model x2 / model"}
    for c in result.cases:
        assert set(c.seconds) == {"parse", "passes", "lowering", "codegen"} and c.total > 0 and c.kernels > 0
    table = bench_table(result)
    assert "| model x2 / model |" in table and "| doubling ≤ 2.2× |" in table
    assert "| prefill model < 2.0 s |" in table
    print(table)


def test_cli(tmp_path, capsys):
    out = tmp_path / "bench.json"
    assert main(["bench", "--config", "tiny", "--repeat", "1", "--no-kinds", "--no-doubled", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert "model / decoder layer" in text and out.is_file()


# ---- the shortcuts the compile speed rests on give what the plain way gives ----------------------------------
def _compiled(config: str):
    from lowering import build_task_graph
    from passes import PassContext, run_pipeline

    result = run_pipeline(model_graph(config), ctx=PassContext(use_env=False, verify_each=False))
    return result.graph, build_task_graph(result.graph)


def _described(g) -> list:
    rows = [(g.name, g.loc, list(g.symbols.items()), repr(g.attributes), list(g.values),
             [(p.name, str(p.type), p.inout) for p in g.params], [v.name for v in g.returns], g._next_seq)]
    for n in g.nodes.values():
        rows.append((n.name, n.op, n.loc, n.seq, repr(n.attrs), [v.name for v in n.operands],
                     [v.name for v in n.deps], [(v.name, repr(v.type), v.index) for v in n.results]))
    return rows


def test_fast_parse_builds_what_the_grammar_builds():
    import pytest

    from dspark_ir import print_graph
    from dspark_ir.text import parser
    from dspark_ir.text.fastparse import Unsupported, parse_fast

    text = "# a header comment\n" + print_graph(model_graph("tiny"))
    fast = parse_fast(text, "m.dsir")
    grammar = [parser._GraphBuilder("m.dsir").build(t) for t in parser._parse_tree(text, "m.dsir", "start").children]
    assert [_described(g) for g in fast] == [_described(g) for g in grammar]
    for other in (text.replace(" : ", " # a comment inside a statement\n : ", 1),   # not the printer's layout
                  text.replace("= rmsnorm(", "= rmsnrom(", 1),                        # an error: the grammar words it
                  text.replace("}\n", "", 1)):
        with pytest.raises(Unsupported):
            parse_fast(other, "m.dsir")


def test_edit_log_rebuilds_the_clone():
    from dspark_ir import print_graph
    from passes.infra.rewriting import set_attrs

    g, _ = _compiled("tiny")
    was = g.clone()
    log = g.record_edits()
    node = next(iter(g.nodes.values()))
    set_attrs(g, node, **node.attrs)
    assert log.changes() == ([], [], [])
    assert _described(log.graph_before()) == _described(was)
    assert print_graph(log.graph_before()) == print_graph(was)


def test_repeated_kernels_are_renamed_copies():
    from lowering.codegen import kernel_body, kernel_module

    _, tg = _compiled("tiny")
    for t in tg.kernels:
        assert kernel_module(t, tg).endswith(kernel_body(t) or "")
    assert 0 < len(tg.bodies) < len(tg.kernels)

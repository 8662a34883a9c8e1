"""The manager's analysis cache (passes/infra/analysis.py): one per pass application, nothing kept outside a run."""
from __future__ import annotations

from dataclasses import dataclass

from dspark_ir import layers, parse_graph
from passes import Pass, RewriteRecord, get_pass, register_pass, run_pipeline
from passes.infra.analysis import AnalysisCache, analyses

TEXT = """graph @g(%x: bf16[4,8]) {
  %a = add(%x, %x) : bf16[4,8]
  %b = add(%a, %x) : bf16[4,8]
  %c = add(%b, %x) : bf16[4,8]
  return %c
}
"""
SEEN: list[tuple[int, bool]] = []          # (how many times the analysis ran, was the cache a kept one)


@register_pass
@dataclass(frozen=True)
class CountingAnalysis(Pass):
    """Planted: asks the run's analysis cache for the same fact at every node, records how often it ran."""

    name = "planted-counting-analysis"
    fixpoint = False

    def match(self, g):
        runs = []
        for node in g.topo_order():
            cache = analyses(g)
            cache.get("add-nodes", lambda: runs.append(1) or [n.name for n in g.nodes.values() if n.op == "add"])
            SEEN.append((len(runs), cache.keeps))
        return iter(())

    def rewrite(self, g, site):
        return RewriteRecord("none", site.name)


def test_a_pass_application_computes_an_analysis_once_and_the_next_starts_empty():
    SEEN.clear()
    run_pipeline(parse_graph(TEXT), "planted-counting-analysis,planted-counting-analysis", use_env=False)
    assert SEEN == [(1, True)] * 3 * 2     # once per application, however many nodes ask


def test_outside_a_run_the_cache_keeps_nothing():
    g = parse_graph(TEXT)
    SEEN.clear()
    list(CountingAnalysis().match(g))
    assert SEEN == [(1, False), (2, False), (3, False)]
    cache = analyses(g)
    assert cache.get("k", lambda: 1) == 1 and cache.peek("k") is None and len(cache) == 0


def test_invalidate_keeps_only_what_the_pass_maintains():
    cache = AnalysisCache(parse_graph(TEXT))
    cache.get("sites", lambda: [1])
    cache.get("linked", lambda: {"n": []})
    cache.invalidate(keep=("linked",))
    assert cache.peek("sites") is None and cache.peek("linked") == {"n": []}


def test_moe_handshake_deps_keeps_no_module_state():
    import passes.moe_handshake_deps as module

    g = layers.build("moe", "tiny")
    result = run_pipeline(g, "moe-handshake-deps", use_env=False)
    assert result.rewrites > 0
    assert not [k for k, v in vars(module).items() if isinstance(v, dict) and not k.startswith("__")]
    assert analyses(result.graph).keeps is False        # the run's cache went with the pass
    assert get_pass("moe-handshake-deps") is module.MoeHandshakeDeps

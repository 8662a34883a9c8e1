"""The 128K-context cases of the corpus (#1227 at TP1 and TP4, #1228 at TP1; perf/cases/post-seed-hca-attn.toml,
post-seed-tp1.toml): they load, are predicted (not `unsupported`), hold no hardware figure, build at 128K (the
caches grown to hold it) and their PR's pass fires there: the after graph differs from the before graph in the
case's scoped tasks, by the grid / K tile the PR changes."""
from __future__ import annotations

from fnmatch import fnmatchcase
from pathlib import Path

import pytest

from dspark_ir import layers
from passes import run_pipeline
from perf.ab import Case
from perf.cases import load_cases

CASES = Path(__file__).parents[2] / "perf" / "cases"
CTX = 131072
# case -> (the PR's pass, scoped node, attribute, before, after)
EXPECT = {
    "hca-cmp-gather-pages-tp1-128k": ("hca-cmp-gather-pages", "hca.hca_cmp_work_gather", "blocks", 512, 256),
    "hca-cmp-gather-pages-tp4-128k": ("hca-cmp-gather-pages", "hca.hca_cmp_work_gather", "blocks", 128, 64),
    "tp1-hca-cmp-wide-k-tile-128k": ("hca-cmp-wide-k-tile", "hca.hca_cmp_qk_pv", "work_rows", 32, 128),
}


def long_context_cases():
    cases = load_cases(str(CASES / "post-seed-hca-attn.toml")) + load_cases(str(CASES / "post-seed-tp1.toml"))
    return {c.name: c for c in cases if dict(c.shape.params).get("max_context") == CTX}


def test_the_128k_cases_load_predicted_and_held_back():
    cases = long_context_cases()
    assert set(cases) == set(EXPECT)
    for c in cases.values():
        assert not c.unsupported, c.name
        assert c.hw.before_us is None and c.hw.after_us is None and c.hw.delta is None, c.name


def scoped(graph, globs) -> dict[str, str]:
    return {n.name: f"{n.opdef.__name__} {sorted((k, str(v)) for k, v in n.attrs.items())}"
            for n in graph.nodes.values() if any(fnmatchcase(n.name, g) for g in globs)}


@pytest.mark.parametrize("name", sorted(EXPECT))
def test_the_pass_fires_at_128k(name):
    c = long_context_cases()[name]
    pass_name, node, attr, was, now = EXPECT[name]
    g = Case(c.layer, c.shape).build()
    assert layers.graph_config(g).context == CTX
    before, after = (run_pipeline(g, ctx=side.variant.context()) for side in (c.before, c.after))
    status = {side: {r.name: r.status for r in res.runs} for side, res in (("before", before), ("after", after))}
    assert status["after"].get(pass_name) == "changed" and status["before"].get(pass_name) != "changed"
    assert scoped(before.graph, c.scope) != scoped(after.graph, c.scope)
    value = {side: res.graph.nodes[node].attrs[attr] for side, res in (("before", before), ("after", after))}
    assert [v if isinstance(v, int) else v.value(g.env) for v in value.values()] == [was, now]

"""Graph's kept topological numbering (`_num`) across dep edits: new edges against the numbering are absorbed
by moving the region they put before their target (Graph._lower_ancestors) instead of a rebuild, and `reaches`
answers as networkx does."""
from __future__ import annotations

import random

import networkx as nx
import pytest

from dspark_ir import layers


def _edges_go_up(g) -> bool:
    num = g._num
    return all(num[v.producer.name] < num[n.name] for n in g.nodes.values() for v in (*n.operands, *n.deps)
               if v.producer is not None and v.producer.name in g.nodes)


@pytest.mark.parametrize("seed", range(6))
def test_random_dep_edges_keep_the_numbering_topological(seed):
    g = layers.build("decode-hca", config="tiny", tp=2)
    rng = random.Random(seed)
    g.reaches(*list(g.nodes.values())[:2])            # builds the numbering
    rebuilt = 0
    for _ in range(60):
        nodes = list(g.nodes.values())
        a, b = rng.sample(nodes, 2)
        if a is b or g.reaches(b, a) or not a.results:
            continue
        g.set_deps(b, list(b.deps) + [a.results[0]])
        if g._num is None:                            # fell back to a rebuild: still correct, only slower
            rebuilt += 1
            g._numbering()
        assert _edges_go_up(g)
    nxg = g.to_networkx()
    nodes = list(g.nodes.values())
    for _ in range(300):
        a, b = rng.sample(nodes, 2)
        assert g.reaches(a, b) == (a.name in nx.ancestors(nxg, b.name))
    assert rebuilt == 0


def test_an_edge_against_the_numbering_moves_the_region_below_its_target():
    g = layers.build("decode-swa", config="tiny", tp=2)
    order = g.topo_order()
    g._numbering()
    late = order[-2]
    target = next(n for n in order if n is not late and not g.reaches(n, late) and not g.reaches(late, n))
    g.set_deps(target, list(target.deps) + [late.results[0]])
    assert g._num is not None and _edges_go_up(g)
    assert g._num[late.name] < g._num[target.name]

"""Properties on random valid graphs: the standard passes keep every check green (verifier, round trip,
bitwise numerics), are deterministic and reach a fixpoint in one run; the full default pipeline keeps every
check green and is deterministic."""
from __future__ import annotations

from hypothesis import given, settings

from dspark_ir import print_graph
from passes import PassContext, run_pipeline

from ..ir.strategies import graphs
from .strategies import rewrite_dense_graphs
from .support import checked

CTX = PassContext(pipeline="canonicalize,cse,dce", use_env=False, check_numerics=True, roundtrip_each=True)


def _check(g):
    g = checked(g)
    first = run_pipeline(g, ctx=CTX)
    second = run_pipeline(g, ctx=CTX)
    assert print_graph(first.graph) == print_graph(second.graph)
    assert not run_pipeline(first.graph, ctx=CTX).changed
    assert len(first.graph) <= len(g)
    return first


@settings(max_examples=30)
@given(graphs())
def test_default_pipeline_on_random_graphs(g):
    _check(g)


@settings(max_examples=60)
@given(rewrite_dense_graphs())
def test_default_pipeline_on_rewrite_dense_graphs(g):
    _check(g)


FULL = PassContext(use_env=False, check_numerics=True, roundtrip_each=True)  # the default pipeline as it stands


@settings(max_examples=25)
@given(rewrite_dense_graphs())
def test_full_default_pipeline_keeps_every_check_green(g):
    """Every pass in the default pipeline (the DSpark ones included) on random graphs: verifier, round trip
    and each pass's numeric contract after every pass, and the same output twice."""
    g = checked(g)
    assert print_graph(run_pipeline(g, ctx=FULL).graph) == print_graph(run_pipeline(g, ctx=FULL).graph)

"""The pass manager's change records (from the graph's edit log, dspark_ir/graph.py EditLog) on the real passes:
for every pass of the default pipeline with every pass on, over the tiny model, the tiny prefill model and the
flash prefill model, the added / removed / modified lists are those a whole-graph comparison of the node keys
gives (in print order), and the graph an instrument gets as `before` is the clone taken before the pass."""
from __future__ import annotations

import pytest

from passes import PassContext, run_pipeline
from passes.infra import instruments
from passes.infra.defaults import DEFAULT_PIPELINE
from perf.model import model_graph
from tests.graph_description import describe_graph

ALL_ON = tuple(e.spec.split("{")[0] for e in DEFAULT_PIPELINE if not e.enabled)


def _keys(g) -> dict[str, tuple]:
    return {n.name: g.node_key(n) for n in g.topo_order()}


class _ComparedWithClones(instruments.Instrument):
    uses_before = True

    def __init__(self):
        self.checked = []

    def before_pass(self, state, run, g):
        self.clone, self.keys = g.clone(), _keys(g)

    def after_pass(self, state, run, before, g):
        old, new = self.keys, _keys(g)
        assert run.added == [n for n in new if n not in old], run.name
        assert run.removed == [n for n in old if n not in new], run.name
        assert run.modified == [n for n in new if n in old and new[n] != old[n]], run.name
        assert run.changed == (old != new or self.clone.graph_key() != g.graph_key()), run.name
        assert describe_graph(before) == describe_graph(self.clone), run.name
        self.checked.append((run.name, run.changed))


@pytest.mark.parametrize("config, prefill", [("tiny", None), ("tiny", 64), ("flash", 512)])
def test_change_records_equal_a_whole_graph_comparison(config, prefill, monkeypatch):
    checker = _ComparedWithClones()
    build = instruments.build_instruments
    monkeypatch.setattr(instruments, "build_instruments", lambda ctx: [checker, *build(ctx)])
    run_pipeline(model_graph(config, prefill=prefill), None,
                 ctx=PassContext(use_env=False, verify_each=False, check_numerics=False, roundtrip_each=False,
                                 enabled=ALL_ON))
    assert len(checker.checked) >= 20 and sum(changed for _, changed in checker.checked) >= 8

"""The prefill layers through the pypto executor (tiny, TP1, a 7-token chunk from position 9, which is not a
multiple of either compress ratio): every task runs in pypto 0.2.0 on CPU (no numpy fallback: the prefill
compressor pool and finish included; the staged top-k is idx_topk, whose stages cover a 7-token chunk's prefix)
and pass-verifies; the layer output matches the golden. Minutes per layer on a loaded 2-core machine (every kernel
is its own pypto compile + simulation): `pypto` and `slow`."""
from __future__ import annotations

import pytest

from lowering import PyptoReport, build_task_graph, run_pypto
from lowering.pypto_exec import FALLBACK, PYPTO

pytestmark = [pytest.mark.pypto, pytest.mark.slow]

TIES_UNPINNED = {"idx_topk"}


@pytest.mark.parametrize("layer", ["prefill-swa", "prefill-hca", "prefill-csa"])
def test_prefill_layer_through_pypto_matches_golden(layer):
    import runner
    from dspark_ir import layers

    g = layers.build(layer, config="tiny", tp=1, chunk=7, start=9)
    inputs = runner.layer_inputs(g, 0)
    golden = runner.golden_outputs(g, inputs)
    tg = build_task_graph(g)
    report = PyptoReport()
    comparisons = runner.compare_outputs(g, run_pypto(tg, inputs, report=report), golden, inputs)
    assert all(c.ok for c in comparisons), [(c.name, c.detail) for c in comparisons if not c.ok]
    assert not report.failed
    by_id = {r.id: r for r in report.runs}
    for t in tg.tasks:
        if not t.is_dummy:
            assert by_id[t.id].backend == PYPTO, (t.name, by_id[t.id].why)
    assert not report.by_backend(FALLBACK)
    unverified = [r.name for r in report.by_backend(PYPTO) if not r.verify_ok and r.op not in TIES_UNPINNED]
    assert not unverified, unverified

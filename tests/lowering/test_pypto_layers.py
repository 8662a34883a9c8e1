"""A whole layer through the pypto executor (templated kernels in pypto 0.2.0, the rest on numpy),
compared with the independent golden. Slow: one harness batch per dependency wave (~2 min per layer)."""
from __future__ import annotations

import pytest

from lowering import PyptoReport, build_task_graph, run_pypto

pytestmark = [pytest.mark.pypto, pytest.mark.slow]


@pytest.mark.parametrize("layer", ["decode-swa"])
def test_layer_through_pypto_matches_golden(layer):
    from dspark_ir import layers
    from dspark_ir.layers.tolerances import compare_layer

    g = layers.build(layer, config="tiny", tp=1)
    inputs = layers.layer_inputs(g, 0)
    report = PyptoReport()
    result = layers.graph_outputs(g, run_pypto(build_task_graph(g), inputs, report=report))
    comparisons = compare_layer(result, layers.golden_outputs(g, inputs), layer)
    assert all(c.ok for c in comparisons), [(c.name, c.detail) for c in comparisons if not c.ok]
    on_pypto = [r for r in report.runs if r.backend == "pypto"]
    assert len(on_pypto) >= 26 and not report.failed

"""The planted-fault suite (issue 20): every fault planted on the graph side is caught by the layer comparison
or a sub-block check, and no unfaulted run fails. The whole kill table is the slow test:
    pytest -m slow -s tests/runner/test_planted_faults.py      (or: python -m tests.runner.planted_faults)"""
from __future__ import annotations

import pytest

from tests.runner import planted_faults as pf


@pytest.mark.parametrize("layer", pf.LAYERS)
@pytest.mark.parametrize("tp", pf.TPS)
def test_unfaulted_runs_pass(layer, tp):
    """24 of 24: layers swa/csa/hca/moe × TP 1/4 × 3 seeds, tiny."""
    for seed in pf.SEEDS:
        assert pf.failures(layer, tp, seed) == [], (layer, tp, seed)


def test_every_fault_applies_to_some_layer():
    assert all(pf.layers_with(f.op) for f in pf.FAULTS), [f.name for f in pf.FAULTS if not pf.layers_with(f.op)]
    assert len({f.name for f in pf.FAULTS}) == len(pf.FAULTS)


@pytest.mark.parametrize("fault", [f for f in pf.FAULTS if f.must], ids=lambda f: f.name)
def test_acceptance_faults_are_caught(fault):
    """The faults the issue names (Sinkhorn 19/10, one scaled channel ≥ 5 %, a RoPE sign in the written cache
    rows, an SWA window off by one, a wrong sink): caught in every layer that has the op, TP1, seed 0."""
    caught, runs, _ = pf.caught_runs(fault, tps=(1,), seeds=(0,))
    assert runs and caught == runs, f"{fault.name}: caught {caught}/{runs}"


@pytest.mark.slow
def test_kill_table():
    table, results = pf.kill_table()
    print("\n" + table)
    killed = [f for f, (caught, runs, _) in results.items() if caught == runs]
    assert len(killed) >= 0.95 * len(pf.FAULTS), table
    assert all(f in killed for f in pf.FAULTS if f.must), table

"""perf/cases/post-seed-csa.toml (issue 17, items 10 and 11): one case per PR, hardware figures held back, and each
case's "after" pipeline fires its PR's pass on the case's shape (stub costs: no pypto)."""
from __future__ import annotations

from pathlib import Path

import pytest

from perf.cases import load_cases, run_cases
from perf.costs import FunctionCosts, KernelCost
from perf.schedule import ScheduleParams

CASES = Path(__file__).resolve().parents[2] / "perf" / "cases" / "post-seed-csa.toml"
PASSES = {"csa-o-dequant-into-owner-windows": "dequant-into-owner-windows",
          "csa-o-publish-cross-core-slots": "dequant-into-owner-windows",
          "csa-early-resolve-producers": "early-resolve-csa-producers"}


def _stub(task):
    n = max(task.blocks, 1)
    return KernelCost("given", 1800.0, *((1800.0 * n, 0.0) if task.core == "cube" else (0.0, 1800.0 * n)))


@pytest.fixture(scope="module")
def cases():
    return {c.name: c for c in load_cases(str(CASES))}


def test_one_case_per_pr_no_hardware_figures(cases):
    assert {c.name: c.pr for c in cases.values()} == {"csa-o-dequant-into-owner-windows": 980,
                                                       "csa-o-publish-cross-core-slots": 998,
                                                       "csa-early-resolve-producers": 915}
    assert all(c.hw.to_json() is None and c.layer == "decode-csa" for c in cases.values())
    assert cases["csa-early-resolve-producers"].rows == 32
    assert "slots=0" in cases["csa-o-dequant-into-owner-windows"].after.text
    assert "slots" not in cases["csa-o-publish-cross-core-slots"].after.text      # the pass default: #998's 2


@pytest.mark.parametrize("name", sorted(PASSES))
def test_after_fires_the_prs_pass(cases, name):
    [r] = run_cases([cases[name]], FunctionCosts(_stub), ScheduleParams()).results
    assert PASSES[name] in r.after.fired and PASSES[name] not in r.before.fired
    assert r.before_us > 0 and r.after_us > 0

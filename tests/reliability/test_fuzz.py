"""Fuzzing the front end: every input parses or fails with a located error; no crash, no hang."""
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_ir import print_graph
from dspark_ir.fuzzing import HOSTILE_MUTATORS, check_one, generate_graph_text, mutate, run_fuzz

from ..ir.strategies import graphs

CORPUS = sorted((Path(__file__).parent / "corpus").glob("*.dsir"))
HANG_BUDGET_S = 30.0  # a hang check, not a speed goal: generous enough for a loaded CI machine


def test_fuzz_2000_inputs():
    result = run_fuzz(seed=20261129, count=2000, budget_s=HANG_BUDGET_S)
    assert result.inputs == 2000
    assert result.crashes == [], result.crashes[:3]
    assert result.parsed > 0 and result.rejected > 0  # both outcomes are exercised


@pytest.mark.parametrize("name", sorted(HOSTILE_MUTATORS))
def test_each_hostile_strategy_ends_in_a_graph_or_a_located_line(name):
    rng = random.Random(22)
    outcomes = set()
    for _ in range(60):
        status, detail = check_one(HOSTILE_MUTATORS[name](generate_graph_text(rng), rng), HANG_BUDGET_S)
        assert status != "crash", detail
        outcomes.add(status)
    assert "rejected" in outcomes


@pytest.mark.parametrize("path", CORPUS, ids=lambda p: p.name)
def test_regression_corpus(path):
    status, detail = check_one(path.read_text(), HANG_BUDGET_S)
    assert status == "rejected", detail
    assert detail.startswith("fuzz.dsir:")


@settings(max_examples=300)
@given(graphs(), st.randoms(use_true_random=False))
def test_mutated_generated_graphs(g, rng):
    status, detail = check_one(mutate(print_graph(g), rng), HANG_BUDGET_S)
    assert status != "crash", detail

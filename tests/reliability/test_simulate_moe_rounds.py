"""EP8 / EP16 MoE at a prefill chunk over several all-to-all rounds (dspark-model.md §6(g): EP8 prefill deadlocked
"once a request ran enough all-to-all rounds"; issue 18).

perf.model.moe_rounds_graph chains R MoE sublayers at T = 128 tokens per rank (a tiny prefill chunk; decode is
T = 32). Without moe-handshake-deps every round's combine_wait has no producer, so it is dispatched at step 0 and
spins on a core group: once the rounds reach the cube cores of a rank, nothing is left for the gate, and the peers
wait for that rank's dispatch and combine. The budget here is 4 cube + 8 vector cores per rank (one round in six of
the chip's 24 + 48) so 4 rounds suffice; one round completes on the same budget. With the pass, the waits are
anchored on their own round's push and combine and every round count completes. EP16 uses the tiny config with 16
experts (tiny has 8: EP ≤ 8); flash allows both (`dspark simulate moe --config flash --ep 16 --rounds R`).
Each simulation is one schedule, bounded by SimConfig.max_steps.
"""
from __future__ import annotations

import re

import pytest

from dspark_cli.main import main
from goldens.config import config_by_name
from lowering.simulate import simulate
from passes import PassContext, run_pipeline
from perf.model import moe_rounds_graph

BUDGET = dict(cube=4, vector=8, max_steps=20_000)
ROUNDS = 4
PREFILL = dict(batch=32, seq=4)        # T = 128 tokens per rank


def config(ep: int):
    tiny = config_by_name("tiny")
    return tiny if ep <= tiny.n_experts else tiny.with_(n_experts=ep)


def handshake(g):
    return run_pipeline(g, "moe-handshake-deps", ctx=PassContext(use_env=False)).graph


@pytest.mark.slow
@pytest.mark.parametrize("ep", [8, 16])
def test_enough_rounds_deadlock_without_the_handshake_and_complete_with_it(ep):
    g = moe_rounds_graph(config(ep), ep=ep, rounds=ROUNDS, **PREFILL)
    assert g.attributes["ranks"] == ep and g.symbols["T"] == 128
    before = simulate(g, seed=0, **BUDGET)
    assert before.status == "deadlock", before.summary()
    report = before.deadlock.format()
    # the rank, the task and the wait it is stuck on (a wait the pass anchors), and the early combine_waits
    assert re.search(r"rank \d+: task \d+ 'R\d\.moe\.(combine_wait|dispatch_wait|dispatch_meta)' holds a[a-z0-9 ]+, "
                     r"spinning since step \d+ on %R\d\.moe\.(combine_arrived|data_arrived|arrived) ", report), report
    assert re.search(r"rank \d+: [a-z0-9 ]+: task \d+ 'R\d\.moe\.combine_wait' spinning since step 0", report), report
    after = simulate(handshake(g), seed=0, **BUDGET)
    assert after.completed, after.report()


@pytest.mark.slow
def test_one_round_completes_on_the_same_budget():
    g = moe_rounds_graph(config(8), ep=8, rounds=1, **PREFILL)
    assert simulate(g, seed=0, **BUDGET).completed


@pytest.mark.slow
def test_the_cli_reports_the_deadlock_and_the_pass_removes_it(capsys):
    args = ["simulate", "moe", "--ep", "8", "--rounds", str(ROUNDS), "--batch", "32", "--cores-cube", "4",
            "--cores-vector", "8", "--schedules", "1"]
    assert main(args) == 1
    out = capsys.readouterr().out
    assert out.startswith("dspark simulate moe × 4 rounds · T = 128 · config tiny · ep 8 · 4 cube + 8 vector")
    assert "deadlock at step" in out and "'R0.moe.combine_wait'" in out
    assert main(args + ["-p", "moe-handshake-deps"]) == 0
    assert "completed in" in capsys.readouterr().out


def test_rounds_refused_off_the_moe_layer(capsys):
    assert main(["simulate", "decode-swa", "--rounds", "2"]) == 2
    assert "--rounds: applies to the moe layer only" in capsys.readouterr().err
    assert main(["simulate", "moe", "--rounds", "0"]) == 2

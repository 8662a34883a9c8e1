"""Trust flags (perf/trust.py) on the tiny SWA layer with stub costs: F, R and the sign rules."""
from __future__ import annotations

import pytest

from perf.ab import Case, Shape, run_ab, variants
from perf.costs import FunctionCosts, KernelCost
from perf.schedule import ScheduleParams
from perf.trust import LEGEND, flips, roofline_share, sign, trust

SPLIT = {"swa.swa_cache_insert_valid_bias", "swa.swa_cache_writeback", "swa.swa_valid_bias"}


def costs(source_of_split: str, insert_cycles: float = 1800.0):
    """1 µs per block everywhere; the split tasks from `source_of_split`, the fused insert `insert_cycles`."""
    def fn(task):
        n = max(task.blocks, 1)
        cyc = insert_cycles if task.name == "swa.swa_cache_insert_valid_bias" else 1800.0
        src = source_of_split if task.name in SPLIT else "pypto"
        return KernelCost(src, cyc, *((cyc * n, 0.0) if task.core == "cube" else (0.0, cyc * n)))
    return FunctionCosts(fn)


def run(source, params=ScheduleParams()):
    vl = [v for v in variants(["split-writeback-bias"], steps=False)]
    return run_ab([Case("decode-swa", Shape("tiny"))], source, params, variant_list=vl).cases[0]


def test_a_gain_on_roofline_only_tasks_is_flagged_r():
    c = run(costs("roofline"))
    t = c.trust["+split-writeback-bias"]
    assert "R" in t.flags and t.detail["roofline_share"] == pytest.approx(1.0)
    assert "+split-writeback-bias" in c.mostly_roofline()
    same = run(costs("pypto"))
    assert "R" not in same.trust["+split-writeback-bias"].flags
    assert same.trust["+split-writeback-bias"].detail["roofline_share"] == 0.0


def test_a_gain_that_rests_on_a_kernel_far_over_its_roofline_is_flagged_f():
    far = run(costs("pypto", insert_cycles=2e6))         # ~1.1 ms for a tiny cache insert: far over its roofline
    t = far.trust["+split-writeback-bias"]
    assert "F" in t.flags and t.detail["far_kernels"]
    assert abs(t.detail["delta_far_at_roofline_pct"] - t.delta) > 5
    near = run(costs("pypto"))
    assert "F" not in near.trust["+split-writeback-bias"].flags


def test_rows_and_markdown_carry_the_flags():
    c = run(costs("roofline"))
    assert "all-off" not in c.trust and c.trust["-split-writeback-bias"].detail is not None
    from perf.ab import ABReport

    md = ABReport([c], "given", ScheduleParams()).markdown()
    row = next(line for line in md.splitlines() if line.startswith("| +split-writeback-bias |"))
    assert "[R" in row
    assert "gain mostly from roofline-only tasks" in md and LEGEND["R"] in md
    assert "seed-only pipeline" in md and "floor of what a rank must move" in md


def test_sign_and_flip_rules():
    assert sign(0.4) == 0 and sign(-0.6) == -1 and sign(None) == 0
    assert flips(3.0, -1.0) and not flips(3.0, 0.3) and not flips(-2.0, -9.0)


def test_trust_of_a_variant_against_itself_is_clean():
    c = run(costs("roofline"))
    r = c.results["default"]
    t = trust(r, r, ScheduleParams())
    assert t.delta == 0 and t.flags == ()
    assert roofline_share(r, r) == (0.0, 0.0)


def fused_insert_costs():
    """The fused insert: a short span but a long one-core work (the `work` and `grid` models pay the work of its
    one block, `span` the span); the split tasks cost the same in every model."""
    def fn(task):
        n = max(task.blocks, 1)
        if task.name == "swa.swa_cache_insert_valid_bias":
            return KernelCost("pypto", 1800.0, 0.0, 2e6)
        cyc = 1e5 if task.name in SPLIT else 1800.0
        return KernelCost("pypto", cyc, *((cyc * n, 0.0) if task.core == "cube" else (0.0, cyc * n)))
    return FunctionCosts(fn)


def test_a_gain_whose_sign_flips_under_the_other_block_model_is_flagged_b():
    """So the split wins under `work` and `grid` and loses under `span`."""
    t = run(fused_insert_costs()).trust["+split-writeback-bias"]
    others = t.detail["delta_other_block_models_pct"]
    assert set(others) == {"span", "grid"}
    assert t.delta > 0 > others["span"] and others["grid"] > 0 and "B" in t.flags


def test_the_b_flag_checks_the_grid_rule_too():
    """Under `span` the split loses; `grid` (like `work`) says it wins: flagged, and grid is among the checks."""
    t = run(fused_insert_costs(), ScheduleParams(block_model="span")).trust["+split-writeback-bias"]
    others = t.detail["delta_other_block_models_pct"]
    assert set(others) == {"work", "grid"} and t.delta < 0 < others["grid"] and "B" in t.flags


def publish_costs(fused_cycles: float):
    """1 µs per block, the unfused O-B dequant and reduce-scatter 0.5 ms each (local parts), the fused dequant +
    reduce-scatter publish `fused_cycles` (its local part)."""
    def fn(task):
        n = max(task.blocks, 1)
        cyc = {"tp_o_dequant_reduce_scatter": fused_cycles, "o_proj_b_dequant": 9e5,
               "tp_o_reduce_scatter": 9e5}.get(task.op, 1800.0)
        return KernelCost("pypto", cyc, *((cyc * n, 0.0) if task.core == "cube" else (0.0, cyc * n)))
    return FunctionCosts(fn)


def test_a_gain_that_rests_on_a_link_overlap_is_flagged_l():
    """A link of 10 MB/s makes the tiny layer's reduce-scatter transfer 1.6 ms. The fused publish (1.5 ms of local
    part) wins while that transfer hides under it; read as serial (the trust check), it loses to the unfused
    dequant + reduce (0.5 ms each, the publish before the reduce anyway). Flagged L; a quick fused publish is not."""
    slow_link = ScheduleParams(cross_rank=True, link_bytes_per_s=1e7)
    vl = [v for v in variants(["dequant-into-owner-windows"], steps=False)]

    def fused(cycles, params=slow_link):
        case = run_ab([Case("decode-swa", Shape("tiny"))], publish_costs(cycles), params, variant_list=vl).cases[0]
        return case.trust["+dequant-into-owner-windows"]

    t = fused(2.7e6)
    assert t.delta > 0 > t.detail["delta_link_serial_pct"] and "L" in t.flags
    quick = fused(1800.0)
    assert quick.delta > 0 and quick.detail["delta_link_serial_pct"] > 0 and "L" not in quick.flags
    assert fused(2.7e6, ScheduleParams()).detail["delta_link_serial_pct"] is None      # rule 10 off: no check


INSERT_STAGE = ["swa.swa_cache_*", "swa.swa_valid_bias"]


def issue_params(block_dispatch_cycles: float, dispatchers: int = 1) -> ScheduleParams:
    """A chip budget of 2 AIVs and one slow dispatcher, so issuing a grid's every block (rule 7 `grid`) costs far
    more than issuing one block per core (`cores`)."""
    return ScheduleParams(block_model="grid", dispatchers=dispatchers, block_dispatch_cycles=block_dispatch_cycles,
                          vector_cores=2, cube_cores=1, name="issue")


def insert_stage_trust(params: ScheduleParams):
    """The split of the fused insert (a 1-block task of 0.1 M cycles) into its wider writeback and bias tasks, over
    those tasks alone."""
    c = run(costs("pypto", insert_cycles=1e5), params)
    return trust(c.results["all-off"], c.results["+split-writeback-bias"], params, INSERT_STAGE)


def test_a_gain_whose_sign_flips_under_the_other_block_issue_rule_is_flagged_i():
    """Issuing one block per core, the split's grids cost little and the split wins; issuing every logical block
    of them through the slow dispatcher, it loses. Flagged I, with the other rule's Δ in the detail."""
    t = insert_stage_trust(issue_params(2e4))
    other = t.detail["delta_other_block_issue_pct"]
    assert set(other) == {"grid"} and t.delta > 5 and other["grid"] < -5 and "I" in t.flags
    quick = insert_stage_trust(issue_params(1e4))           # a faster dispatcher: the split wins under both rules
    assert quick.delta > 0 and quick.detail["delta_other_block_issue_pct"]["grid"] > 0 and "I" not in quick.flags
    from dataclasses import replace

    grid_first = insert_stage_trust(replace(issue_params(2e4), block_issue="grid"))     # checked the other way
    assert set(grid_first.detail["delta_other_block_issue_pct"]) == {"cores"} and "I" in grid_first.flags


def test_without_block_dispatch_the_issue_rule_is_not_checked():
    t = insert_stage_trust(issue_params(2e4, dispatchers=0))
    assert t.detail["delta_other_block_issue_pct"] == {} and "I" not in t.flags


SHARE_SCRIPT = """
from types import SimpleNamespace as NS
import perf.trust as trust
trust.in_scope = lambda r, globs: {row.id for row in r.estimate.rows}
def side(scale):
    rows = [NS(id=i, name=f"t{i:02d}.k", core="vector", source="pypto" if i % 3 else "roofline",
               alone_us=scale * (0.1 * i + 1e-3 * i * i + 1 / (i + 3))) for i in range(40)]
    return NS(estimate=NS(rows=rows))
print(repr(trust.roofline_share(side(1.0), side(1.7))))
"""


def test_roofline_share_is_the_same_float_in_every_process():
    """Task names are strings: a set's order, and so a float sum over it, changes with the hash seed unless the
    sum runs in a fixed order (two runs of `dspark ab` must write the same JSON)."""
    import os
    import subprocess
    import sys

    outs = {subprocess.run([sys.executable, "-c", SHARE_SCRIPT], capture_output=True, text=True, check=True,
                           env={**os.environ, "PYTHONHASHSEED": str(seed)}).stdout for seed in range(6)}
    assert len(outs) == 1, outs


def _result_file(tmp_path):
    """A planted fit record: two cases (one with the wrong sign), three swimlane rows."""
    import json

    def case(name, side, measured, predicted):
        return {"group": "cases", "fact": f"{name} {side}", "measured_us": measured, "predicted_us": predicted,
                "error_pct": 100 * (predicted - measured) / measured}
    residuals = [case("a-seed", "before", 100.0, 120.0), case("a-seed", "after", 80.0, 90.0),
                 case("b-seed", "before", 50.0, 50.0), case("b-seed", "after", 60.0, 45.0),
                 *({"group": "tasks", "fact": f"t{i}", "error_pct": e} for i, e in enumerate((-40.0, 10.0, 25.0))),
                 {"group": "probes", "fact": "p", "error_pct": 99.0}]
    path = tmp_path / "result.json"
    lanes = [{"model": "chip", "makespan_ratio": 0.9, "one_to_one": 3, "within": 2},
             {"model": "legacy", "makespan_ratio": 0.5, "one_to_one": 3, "within": 0}]
    path.write_text(json.dumps({"residuals": residuals, "swimlane": lanes}))
    return path


def test_validation_reads_the_fits_seed_deltas_and_task_rows(tmp_path):
    from perf.trust import validation

    v = validation(ScheduleParams.chip(), _result_file(tmp_path))
    a, b = v.deltas
    assert (a.name, a.chip_pct, a.predicted_pct) == ("a-seed", -20.0, -25.0) and a.sign_right
    assert a.error_pts == pytest.approx(-5.0)
    assert (b.chip_pct, b.predicted_pct, b.sign_right) == (20.0, -10.0, False) and b.error_pts == -30.0
    assert v.worst_miss_pts() == 30.0
    assert (v.tasks_within, v.tasks, v.task_errors_pct, v.makespan_ratio) == (2, 3, (-40.0, 25.0), 0.9)
    assert v.committed
    md = "\n".join(v.markdown())
    assert "| b-seed | +20.0 % | -10.0 % | -30.0 pts | **wrong** |" in md
    assert "2 of 3 within ±25 %" in md and "±30.0 points" in md and "bound it less well" not in md
    assert "up to 30.0 points, 1 of 2 signs wrong; 2 of 3 swimlane tasks" in v.summary()
    changed = validation(ScheduleParams.chip(dispatch_cycles=0), _result_file(tmp_path))
    assert not changed.committed and "bound it less well" in "\n".join(changed.markdown())
    assert validation(ScheduleParams(), _result_file(tmp_path)) is None          # legacy: nothing was fitted
    assert validation(ScheduleParams.chip(), tmp_path / "missing.json") is None


def test_ab_md_and_json_say_how_far_to_believe_a_delta():
    chip = run(costs("pypto"), ScheduleParams.chip())
    from perf.ab import ABReport

    report = ABReport([chip], "given", ScheduleParams.chip())
    assert "## How far to believe a Δ" in report.markdown()
    doc = report.to_json()["validation"]
    assert doc["committed"] and len(doc["deltas"]) >= 4 and doc["tasks"] >= 18
    legacy = ABReport([run(costs("pypto"))], "given", ScheduleParams())
    assert "How far to believe" not in legacy.markdown() and legacy.to_json()["validation"] is None

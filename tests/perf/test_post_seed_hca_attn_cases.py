"""perf/cases/post-seed-hca-attn.toml: one case or more per post-seed PR of issue 17's items 3, 5, 7 (#1155, #1187,
#1227), hardware figures held back, each after = the default pipeline plus exactly the PR's pass; the scoped cases'
globs match tasks of their graphs and every side predicts a latency (roofline costs: no pypto)."""
from __future__ import annotations

from pathlib import Path

from passes import DEFAULT_PIPELINE, parse_pipeline
from perf.cases import load_cases, run_cases
from perf.costs import RooflineCosts
from perf.schedule import ScheduleParams
from perf.sweep import pipeline_variant

FILE = Path(__file__).parents[2] / "perf" / "cases" / "post-seed-hca-attn.toml"
PASS_OF = {1155: "kv-score-token-groups", 1187: "hca-attn-dual-aiv", 1227: "hca-cmp-gather-pages"}


def test_one_pass_per_pr_and_no_hardware_figures():
    cases = load_cases(str(FILE))
    assert {c.pr for c in cases} == set(PASS_OF)
    for c in cases:
        assert c.hw.before_us is None and c.hw.after_us is None and c.hw.delta is None, c.name
        assert c.before.text == "default" and c.after.text == f"default with {PASS_OF[c.pr]}", c.name


def test_the_after_side_is_todays_default_plus_the_pass_at_its_place():
    default = [parse_pipeline(e.spec).names[0] for e in DEFAULT_PIPELINE]
    for c in load_cases(str(FILE)):
        after = c.after.variant.context().effective_pipeline().names
        on = [n for n in default if n in after]
        assert after == on and PASS_OF[c.pr] in after, c.name
        default_now = pipeline_variant("default").context().effective_pipeline().names
        assert [n for n in after if n != PASS_OF[c.pr]] == default_now, c.name


def test_every_case_predicts_both_sides_with_roofline_costs():
    cases = [c for c in load_cases(str(FILE)) if c.shape.tp == 4 and c.scope]
    rep = run_cases(cases, RooflineCosts(), ScheduleParams())
    assert len(rep.results) == len(cases)
    for r in rep.results:
        assert r.before_us > 0 and r.after_us > 0

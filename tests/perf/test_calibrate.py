"""The chip schedule model's terms (perf/schedule.py rules 6-8) on hand-built graphs, the calibration fit
(perf/calibrate.py) on a tiny fact set, and `dspark calibrate`'s error paths. No pypto."""
from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dspark_cli.main import main
from perf import calibrate as cal
from perf.costs import KernelCost
from perf.schedule import SchedTask, ScheduleError, ScheduleParams, alone_cycles, schedule

# 1 cycle = 1 µs; 4 AIC, 48 AIV so that per-block dispatch of a 48-block task is visible
CHIP = ScheduleParams(cube_cores=4, vector_cores=48, dispatch_cycles=0, clock_hz=1e6, block_model="span",
                      dispatchers=3, name="chip")


def vec(span, blocks=1):
    return KernelCost("given", float(span), 0.0, float(span * blocks))


def test_legacy_model_has_no_chip_terms_and_is_the_default():
    p = ScheduleParams()
    assert (p.hop_cycles, p.block_dispatch_cycles, p.dispatchers, p.launch_cycles) == (0, 0, 0, 0)
    assert ScheduleParams.named("legacy") == p and p.block_model == "work"
    with pytest.raises(ScheduleError, match="unknown schedule model"):
        ScheduleParams.named("fast")
    with pytest.raises(ScheduleError, match=">= 0"):
        ScheduleParams(hop_cycles=-1)


def test_chip_model_reads_the_committed_constants():
    chip = ScheduleParams.chip()
    assert chip.block_model == "grid" and chip.dispatchers == 3 and chip.name == "chip"
    assert chip.hop_cycles > 0 and chip.block_dispatch_cycles > 0 and chip.launch_cycles > 0


def test_wide_task_is_dispatch_bound():
    # 48 blocks of 10 cycles, issued 16 rounds × 100 cycles by 3 dispatchers: the last block starts at 1600
    p = replace(CHIP, block_dispatch_cycles=100)
    s = schedule([SchedTask(0, "wide", "vector", 48)], {0: vec(10, 48)}, p)
    assert s.runs[0].start == 100 and s.makespan == 1600 + 10
    assert alone_cycles(SchedTask(0, "wide", "vector", 48), vec(10, 48), p) == 1610
    # a 96-block grid runs as 48 cyclic workers: still 48 issues, two waves of 5 cycles each
    s96 = schedule([SchedTask(0, "wider", "vector", 96)], {0: vec(10, 96)}, p)
    assert s96.makespan == 1600 + 5
    # without dispatchers the same task takes its span
    assert schedule([SchedTask(0, "wide", "vector", 48)], {0: vec(10, 48)}, replace(p, dispatchers=0)).makespan == 10


def test_grid_issue_dispatches_every_logical_block():
    # rule 7 under block_issue = "grid": a 96-block grid is 96 issues (32 rounds of 100 cycles), not 48 workers'
    p = replace(CHIP, block_dispatch_cycles=100, block_issue="grid")
    wider = SchedTask(0, "wider", "vector", 96)
    s = schedule([wider], {0: vec(10, 96)}, p)
    assert s.runs[0].start == 100 and s.makespan == 3200 + 5
    assert alone_cycles(wider, vec(10, 96), p) == 3205
    # within the cores both rules issue the same blocks
    wide = SchedTask(0, "wide", "vector", 48)
    assert schedule([wide], {0: vec(10, 48)}, p).makespan == schedule([wide], {0: vec(10, 48)},
                                                                       replace(p, block_issue="cores")).makespan
    assert ScheduleParams.chip().block_issue == "cores"
    with pytest.raises(ScheduleError, match="block_issue must be one of cores, grid"):
        ScheduleParams(block_issue="all")


def test_dispatchers_are_shared_between_tasks():
    p = replace(CHIP, block_dispatch_cycles=1)
    tasks = [SchedTask(0, "a", "vector", 24), SchedTask(1, "b", "vector", 24)]
    s = schedule(tasks, {0: vec(100, 24), 1: vec(100, 24)}, p)
    # a's 24 issues take 8 rounds; b's blocks are issued after them (rounds 9-16)
    assert s.runs[0].start == 1 and s.runs[0].finish == 8 + 100
    assert s.runs[1].start == 9 and s.runs[1].finish == 16 + 100


def test_chain_pays_one_hop_per_edge():
    p = replace(CHIP, hop_cycles=7, dispatchers=0, dispatch_cycles=2)
    tasks = [SchedTask(i, f"t{i}", "vector", 1, (i - 1,) if i else ()) for i in range(4)]
    s = schedule(tasks, {i: vec(10) for i in range(4)}, p)
    # the first task: dispatch only; each later one: dispatch + hop after its producer
    assert s.runs[0].start == 2 and s.makespan == 2 + 10 + 3 * (2 + 7 + 10)
    assert s.critical == 4 * (2 + 10)                  # the critical path is the tasks alone, hops excluded


def test_launch_floor_is_paid_once_per_call():
    p = replace(CHIP, launch_cycles=80, dispatchers=0)
    tasks = [SchedTask(0, "a", "vector", 1), SchedTask(1, "b", "vector", 1, (0,))]
    s = schedule(tasks, {0: vec(5), 1: vec(5)}, p)
    assert s.makespan == 10 and s.call == 90 and s.call_us == 90


def early_case(aer: bool, early: bool = True, extra: tuple = ()) -> tuple:
    """A 200-cycle 1-block producer and its 48-block consumer (issued in 16 rounds of 10 by 3 dispatchers)."""
    p = replace(CHIP, block_dispatch_cycles=10, hop_cycles=5, early_dispatch=early)
    tasks = [SchedTask(0, "producer", "vector", 1, aer=aer), SchedTask(1, "consumer", "vector", 48, (0,)), *extra]
    costs = {0: vec(200), 1: vec(10, 48), **{t.id: vec(t.blocks and 300, t.blocks) for t in extra}}
    return schedule(tasks, costs, p)


def test_early_dispatch_stages_the_consumer_of_a_flagged_producer():
    # rule 9: the producer's one issue ends at 10 (published); the consumer's 48 issues run 10 -> 170 while the
    # producer runs 10 -> 210; ready at 215 (the hop is still paid), it runs at once: 215 + 10
    late = early_case(aer=True, early=False)
    assert late.runs[1].ready == 215 and late.runs[1].finish == 215 + 160 + 10     # last issue ends 375, + 10
    staged = early_case(aer=True)
    assert staged.runs[1].ready == 215 and staged.runs[1].start == 215 and staged.runs[1].finish == 225
    # an unflagged producer: nothing is staged
    assert early_case(aer=False).runs[1].finish == late.runs[1].finish


def test_early_dispatch_waits_for_unflagged_producers_and_yields_to_normal_work():
    # a second, unflagged producer: the consumer is staged only once it has finished (here at 20, before 210)
    short = SchedTask(2, "short", "cube", 1)
    p = replace(CHIP, block_dispatch_cycles=10, hop_cycles=5, early_dispatch=True)
    tasks = [SchedTask(0, "producer", "vector", 1, aer=True), short, SchedTask(1, "consumer", "vector", 48, (0, 2))]
    s = schedule(tasks, {0: vec(200), 1: vec(10, 48), 2: vec(10)}, p)
    assert s.runs[1].finish == 225
    s = schedule([*tasks[:2], replace(tasks[2], deps=(0,)), SchedTask(3, "late", "cube", 1, (2,))],
                 {0: vec(200), 1: vec(10, 48), 2: vec(500), 3: vec(1)}, p)
    assert s.runs[1].finish == 225                     # a producer it does not depend on changes nothing
    # normal work outranks early work: 48 vector blocks hold every AIV while the producer runs -> no staging
    busy = SchedTask(2, "busy", "vector", 48)
    assert early_case(True, extra=(busy,)).runs[1].finish == early_case(True, False, extra=(busy,)).runs[1].finish


def test_a_producer_wider_than_its_cores_publishes_with_its_last_wave():
    # 8 cube blocks on 4 AICs (span blocks of 50): waves at 10 and 60, so the consumer is staged from 60 (its 48
    # issues end at 220), not from the producer's last issue (20); it is ready at 110 + 5 and ends at 220 + 10
    p = replace(CHIP, block_dispatch_cycles=10, hop_cycles=5, early_dispatch=True)
    tasks = [SchedTask(0, "wide producer", "cube", 8, aer=True), SchedTask(1, "consumer", "vector", 48, (0,))]
    costs = {0: KernelCost("given", 100.0, 800.0, 0.0), 1: vec(10, 48)}
    s = schedule(tasks, costs, p)
    assert s.runs[0].finish == 110 and s.runs[1].ready == 115 and s.runs[1].finish == 230
    assert schedule(tasks, costs, replace(p, early_dispatch=False)).runs[1].finish == 115 + 160 + 10


@given(st.lists(st.tuples(st.sampled_from(["cube", "vector", "mix", "none"]), st.integers(1, 60),
                          st.integers(1, 50), st.booleans(), st.sets(st.integers(0, 30), max_size=3)),
                min_size=1, max_size=12))
@settings(max_examples=60, deadline=None)
def test_early_dispatch_never_starts_a_task_before_its_producers_finish(spec):
    tasks = [SchedTask(i, f"t{i}", core, 0 if core == "none" else blocks, tuple(d for d in deps if d < i), aer=aer)
             for i, (core, blocks, _, aer, deps) in enumerate(spec)]
    costs = {i: vec(span, max(t.blocks, 1)) for i, (t, (_, _, span, _, _)) in enumerate(zip(tasks, spec))}
    p = replace(CHIP, block_dispatch_cycles=3, hop_cycles=2, dispatch_cycles=1, early_dispatch=True)
    s = schedule(tasks, costs, p)
    for t in tasks:
        run = s.runs[t.id]
        assert run.ready >= max((s.runs[d].finish + 3 for d in t.deps), default=1)
        assert run.start >= run.ready and run.finish >= run.start
    assert s.makespan <= schedule(tasks, costs, replace(p, early_dispatch=False)).makespan + sum(
        c.span for c in costs.values()) + 3 * sum(t.blocks for t in tasks)     # sanity bound: finite and ordered


def test_span_blocks_keep_the_kernels_internal_parallelism():
    # a one-block kernel whose pypto run spread 100 busy cycles over 10 lanes (span 10): 10, not 100
    one = SchedTask(0, "k", "vector", 1)
    cost = KernelCost("given", 10.0, 0.0, 100.0)
    assert schedule([one], {0: cost}, replace(CHIP, dispatchers=0)).makespan == 10
    assert schedule([one], {0: cost}, ScheduleParams(vector_cores=48, dispatch_cycles=0, clock_hz=1e6)).makespan == 100


# ---- the fit -------------------------------------------------------------------------------------------
def tiny_facts(truth: ScheduleParams) -> dict:
    """Facts generated by the model itself at known constants (no swimlane graph): the fit must find them."""
    probes = [{"name": n, "tasks": t, "blocks": b, "serial": s, "us": 0.0}
              for n, t, b, s in (("1x1", 1, 1, True), ("8 serial", 8, 1, True), ("4x48", 4, 48, False))]
    for pr in probes:
        pr["us"] = cal.probe_us(pr, truth)
    gap = cal.gap_us(truth)
    return {"swimlane": {"makespan_us": 1.0}, "gaps": {"hop_gaps_us": [gap, gap]}, "probe": probes,
            "block_dispatch": [{"blocks": 48, "us_per_block": cal.block_dispatch_us(48, truth)}],
            "fit": {"swimlane_gaps": 1.0, "probes": 1.0, "block_dispatch": 1.0}}


def test_fit_is_deterministic_and_finds_known_constants():
    truth = ScheduleParams.of(cal.HARDWARE, block_model="span", dispatchers=3, hop_cycles=cal.HARDWARE.cycles(3e-6),
                              block_dispatch_cycles=cal.HARDWARE.cycles(0.5e-6),
                              launch_cycles=cal.HARDWARE.cycles(60e-6))
    facts = tiny_facts(truth)
    a, b = cal.calibrate(facts, [], {}, rounds=3), cal.calibrate(facts, [], {}, rounds=3)
    assert a.to_json() == b.to_json()
    assert a.params.us(a.params.hop_cycles) == pytest.approx(3.0, abs=0.01)
    assert a.params.us(a.params.block_dispatch_cycles) == pytest.approx(0.5, abs=0.01)
    assert a.params.us(a.params.launch_cycles) == pytest.approx(60.0, abs=0.1)
    assert a.loss < 1e-6 and all(abs(r.error) < 1e-3 for r in a.residuals)


def test_fit_finds_the_kernel_start_from_the_two_kinds_of_gaps():
    """Gaps before kernels and before signal tasks, generated at a known hop H and kernel start S: the fit
    separates them (the empty probe tasks pay H alone, as signal tasks do)."""
    truth = ScheduleParams.of(cal.HARDWARE, block_model="span", dispatchers=3, hop_cycles=cal.HARDWARE.cycles(2e-6),
                              kernel_start_cycles=cal.HARDWARE.cycles(3e-6),
                              block_dispatch_cycles=cal.HARDWARE.cycles(0.5e-6),
                              launch_cycles=cal.HARDWARE.cycles(60e-6))
    facts = tiny_facts(truth)
    facts["gaps"] = {"kernel_gaps_us": [cal.gap_us(truth, kernel=True)] * 3, "signal_gaps_us": [cal.gap_us(truth)]}
    fit = cal.calibrate(facts, [], {}, rounds=3)
    assert fit.params.us(fit.params.hop_cycles) == pytest.approx(2.0, abs=0.01)
    assert fit.params.us(fit.params.kernel_start_cycles) == pytest.approx(3.0, abs=0.01)
    assert {r.name for r in fit.residuals if r.group == "swimlane_gaps"} == {
        "mean of 3 gaps before a compute task", "mean of 1 gaps before a signal task"}
    assert fit.to_json()["constants"]["kernel_start_cycles"]["us"] == pytest.approx(3.0, abs=0.01)


def test_fit_reports_each_evaluation_to_its_progress_callback():
    truth = ScheduleParams.of(cal.HARDWARE, block_model="span", dispatchers=3, hop_cycles=cal.HARDWARE.cycles(3e-6),
                              block_dispatch_cycles=cal.HARDWARE.cycles(0.5e-6),
                              launch_cycles=cal.HARDWARE.cycles(60e-6))
    ticks = []
    fit = cal.calibrate(tiny_facts(truth), [], {}, rounds=1, progress=lambda: ticks.append(1))
    assert len(ticks) == fit.evaluations > 0
    assert fit.to_json() == cal.calibrate(tiny_facts(truth), [], {}, rounds=1).to_json()   # the answer is the same


def test_fit_records_the_issue_rule_it_was_fitted_under():
    truth = ScheduleParams.of(cal.HARDWARE, block_model="span", dispatchers=3, hop_cycles=cal.HARDWARE.cycles(3e-6),
                              block_dispatch_cycles=cal.HARDWARE.cycles(0.5e-6),
                              launch_cycles=cal.HARDWARE.cycles(60e-6))
    facts = tiny_facts(truth)
    fixed = {issue: cal.calibrate(facts, [], {}, rounds=1, base=replace(truth, block_issue=issue)).to_json()["fixed"]
             for issue in ("cores", "grid")}
    assert {issue: f["block_issue"]["value"] for issue, f in fixed.items()} == {"cores": "cores", "grid": "grid"}


def test_swimlane_mapping_must_name_our_tasks():
    facts = {"swimlane": {"task": [{"chip": "x", "span_us": 1.0, "ours": ["no.such.task"]}]}}
    with pytest.raises(cal.CalibrationError, match="no.such.task"):
        cal.task_rows(facts, [SchedTask(0, "a", "vector", 1)], {0: vec(1)}, CHIP)


def test_swimlane_table_counts_one_to_one_rows_within_25_percent():
    facts = {"swimlane": {"source": "test", "makespan_us": 20.0, "task": [
        {"chip": "A", "span_us": 10.0, "ours": ["a"]},
        {"chip": "B", "span_us": 5.0, "ours": ["b"]},
        {"chip": "C", "span_us": 5.0, "ours": [], "one_to_one": False}]}}
    tasks = [SchedTask(0, "a", "vector", 1), SchedTask(1, "b", "vector", 1, (0,))]
    text, summary = cal.swimlane_table(facts, tasks, {0: vec(11), 1: vec(10)}, replace(CHIP, dispatchers=0))
    assert summary["within"] == 1 and summary["one_to_one"] == 2 and summary["makespan_us"] == 21
    assert "(not 1:1)" in text and "1 of 2 one-to-one tasks" in text


def test_a_window_row_spans_from_the_first_start_to_the_last_finish():
    """`measure = "window"`: a chip window over several tasks (e.g. the O projection from the first tp_o_a to
    the last tp_o_b_dequant) is compared with our tasks' first start -> last finish, not their summed spans."""
    facts = {"swimlane": {"source": "test", "makespan_us": 30.0, "task": [
        {"chip": "W", "span_us": 25.0, "ours": ["a", "b", "c"], "measure": "window"},
        {"chip": "S", "span_us": 25.0, "ours": ["a", "b", "c"]}]}}
    tasks = [SchedTask(0, "a", "vector", 1), SchedTask(1, "b", "vector", 1), SchedTask(2, "c", "vector", 1, (0, 1))]
    params = replace(CHIP, dispatchers=0, hop_cycles=0.0)
    rows, _ = cal.task_rows(facts, tasks, {0: vec(10), 1: vec(10), 2: vec(10)}, params)
    sched = cal.schedule(tasks, {0: vec(10), 1: vec(10), 2: vec(10)}, params)
    first = min(sched.runs[i].start for i in (0, 1))
    assert rows[0].predicted_us == pytest.approx(params.us(sched.runs[2].finish - first))
    assert rows[1].predicted_us == pytest.approx(30.0)          # the summed spans count a and b's overlap twice
    assert rows[0].predicted_us < rows[1].predicted_us


# ---- the command's error paths --------------------------------------------------------------------------
def test_cli_missing_facts_file(tmp_path, capsys):
    assert main(["calibrate", "--facts", str(tmp_path / "none.toml")]) == 2
    err = capsys.readouterr().err
    assert "none.toml" in err and len(err.strip().splitlines()) == 1


def test_cli_facts_missing_a_section(tmp_path, capsys):
    f = tmp_path / "facts.toml"
    f.write_text("[swimlane]\nmakespan_us = 1.0\n")
    assert main(["calibrate", "--facts", str(f)]) == 2
    assert "missing [probe]" in capsys.readouterr().err


def test_cli_facts_not_toml(tmp_path, capsys):
    f = tmp_path / "facts.toml"
    f.write_text("[swimlane\n")
    assert main(["calibrate", "--facts", str(f)]) == 2
    assert "not TOML" in capsys.readouterr().err


def test_cli_check_needs_a_result_file(tmp_path, capsys):
    assert main(["calibrate", "--check", "-o", str(tmp_path / "r.json")]) == 2
    assert "no result file" in capsys.readouterr().err


def test_cli_check_and_swimlane_exclude_each_other(capsys):
    assert main(["calibrate", "--check", "--swimlane"]) == 2
    assert "exclude each other" in capsys.readouterr().err


def test_ab_runs_the_chosen_schedule_model(tmp_path):
    import json

    base = ["ab", "decode-hca", "--config", "tiny", "--tp", "2", "--batch", "4", "--seq", "4", "--source", "roofline",
            "--no-loo", "--no-aoi", "--no-steps", "--no-plots", "--no-traces", "--no-progress"]
    out = {}
    for model in ("chip", "legacy"):
        assert main([*base, "--model", model, "-o", str(tmp_path / model)]) == 0
        out[model] = json.loads((tmp_path / model / "ab.json").read_text())
    assert out["chip"]["schedule"]["model"] == "chip" and out["legacy"]["schedule"]["model"] == "legacy"
    assert out["chip"]["schedule"]["hop_cycles"] > 0 and out["legacy"]["schedule"]["hop_cycles"] == 0
    lat = {m: out[m]["cases"][0]["variants"][0]["latency_us"] for m in out}
    assert lat["chip"] != lat["legacy"]


class FakeSide(cal.CaseSide):
    def predicted_us(self, params):
        return 100.0 + params.us(params.hop_cycles)

    def digest(self):
        return "fake"


def test_corpus_sides_are_facts_of_their_own_group():
    truth = ScheduleParams.of(cal.HARDWARE, block_model="span", dispatchers=3, hop_cycles=cal.HARDWARE.cycles(3e-6))
    facts = tiny_facts(truth)
    facts["fit"]["cases"] = 100.0                  # heavy enough to move the fit
    side = FakeSide("case-a", "before", 110.0, None, ())
    res = cal.residuals(facts, [], {}, truth, [side])
    mine = [r for r in res if r.group == "cases"]
    assert [(r.name, r.measured, r.predicted) for r in mine] == [("case-a before", 110.0, pytest.approx(103.0))]
    # the cases group pulls the hop towards 10 µs: the fit moves H off the probes' 3 µs
    assert cal.calibrate(facts, [], {}, rounds=2, cases=[side]).params.hop_cycles > truth.hop_cycles


def test_cli_a_new_output_file_fits_under_the_committed_rules_unless_told(tmp_path, monkeypatch, capsys):
    """`-o FILE` (a scratch fit to compare) starts from the committed result's rules; a rule flag overrides one."""
    from perf.schedule import fitted_rules

    bases = []

    def stop(facts, tasks, costs, base=None, **_):
        bases.append(base)
        raise cal.CalibrationError("stopped by the test")

    monkeypatch.setattr(cal, "calibrate", stop)
    monkeypatch.setattr(cal, "corpus_sides", lambda *a, **k: [])
    monkeypatch.setattr(cal, "swimlane_graph", lambda facts, source: ([], {}))
    committed = fitted_rules(cal.RESULT)
    assert main(["calibrate", "-o", str(tmp_path / "scratch.json")]) == 2
    assert main(["calibrate", "-o", str(tmp_path / "scratch.json"), "--cross-rank", "off",
                 "--early-dispatch", "off"]) == 2
    assert "stopped by the test" in capsys.readouterr().err
    assert {k: getattr(bases[0], k) for k in committed} == committed
    assert (bases[1].cross_rank, bases[1].early_dispatch) == (False, False)
    assert bases[1].block_issue == committed["block_issue"]

"""The A/B matrix (perf/ab.py, `dspark ab`) on the tiny config with a stub cost source (no pypto)."""
from __future__ import annotations

import json

import pytest

from dspark_cli.main import main
from perf.ab import Case, Shape, optimisation_passes, pipeline_names, run_ab, variants
from perf.costs import FunctionCosts, KernelCost, RooflineCosts
from perf.schedule import ScheduleParams


def stub(task):
    """10 µs per block-wave of work, whatever the op: enough to exercise every column."""
    return KernelCost("given", 18_000.0, *((18_000.0 * task.blocks, 0.0) if task.core == "cube"
                                            else (0.0, 18_000.0 * task.blocks)))


@pytest.fixture(scope="module")
def report():
    cases = [Case("decode-swa", Shape("tiny")), Case("decode-csa", Shape("tiny", params=(("max_context", 64),)))]
    vl = variants(["split-writeback-bias", "topk-bypass"], steps=True)
    return run_ab(cases, FunctionCosts(stub), ScheduleParams(), variant_list=vl)


def test_variants_cover_on_off_loo_aoi_and_steps():
    names = [v.name for v in variants()]
    assert names[:4] == ["all-off", "default", "cleanup", "seed-only"]
    for p in optimisation_passes():
        assert f"-{p}" in names and f"+{p}" in names
    assert [n for n in names if n.startswith("step:")] == [f"step:{k}" for k in range(1, len(pipeline_names()))]
    assert "tile-choice" in optimisation_passes()


def test_report_json_structure(report):
    doc = report.to_json()
    assert doc["schema"] == "dspark-ab/1" and doc["source"] == "given"
    assert doc["schedule"]["dispatch_cycles"] == 930
    case = doc["cases"][0]
    assert case["layer"] == "decode-swa" and case["shape"] == "tiny"
    rows = {r["variant"]: r for r in case["variants"]}
    assert set(rows) >= {"all-off", "default", "cleanup", "-split-writeback-bias", "+split-writeback-bias",
                         "-topk-bypass", "+topk-bypass", "step:1"}
    for r in rows.values():
        assert r["latency_us"] > 0 and r["tasks"] > 0 and r["kernels"] > 0 and r["roofline_us"] > 0
        assert set(r) >= {"delta_vs_off_pct", "delta_vs_default_pct", "roofline_ratio", "fired", "passes", "sources"}
    assert rows["all-off"]["fired"] == [] and rows["all-off"]["delta_vs_off_pct"] == 0
    assert "split-writeback-bias" in rows["default"]["fired"]
    assert "split-writeback-bias" not in rows["-split-writeback-bias"]["fired"]
    assert rows["+split-writeback-bias"]["fired"] == ["split-writeback-bias"]
    assert rows["default"]["kernel_rows"] and rows["-topk-bypass"]["kernel_rows"] is None
    assert set(case["dispatch_sensitivity"]) == {"all-off", "default"}
    csa = {r["variant"]: r for r in doc["cases"][1]["variants"]}
    assert "topk-bypass" in csa["default"]["fired"] and csa["default"]["tasks"] < csa["all-off"]["tasks"]
    json.dumps(doc)                                          # serialisable as is


def test_markdown_table(report):
    md = report.markdown()
    assert md.startswith("# dspark ab")
    assert "| variant | latency µs | serial µs | Δ vs all-off | Δ vs default | roofline µs | ratio |" in md
    assert "## decode-swa [tiny]" in md and "## decode-csa [tiny max_context=64]" in md
    assert "**default vs all-off:" in md and "| -split-writeback-bias |" in md


def test_plots(report, tmp_path):
    written = report.plots(tmp_path)
    assert {p.split("/")[-1] for p in written} == {"onoff.png", "waterfall_decode-swa.png", "waterfall_decode-csa.png"}
    for p in written:
        assert open(p, "rb").read(8) == b"\x89PNG\r\n\x1a\n"


def test_cli_writes_tables_json_plots_and_traces(tmp_path, capsys):
    out = tmp_path / "ab"
    rc = main(["ab", "decode-hca", "--config", "tiny", "--tp", "2", "--batch", "4", "--seq", "4", "--source",
               "roofline", "--passes", "fuse-merge-rope-pack", "--no-steps", "--no-progress", "-o", str(out)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "| +fuse-merge-rope-pack |" in printed and "default vs all-off" in printed
    doc = json.loads((out / "ab.json").read_text())
    assert [r["variant"] for r in doc["cases"][0]["variants"]] == [
        "all-off", "default", "cleanup", "seed-only", "-fuse-merge-rope-pack", "+fuse-merge-rope-pack"]
    assert all(r["sources"] == {"roofline": r["kernels"]} for r in doc["cases"][0]["variants"])
    for name in ("ab.md", "onoff.png", "traces/decode-hca.default.trace.json", "traces/decode-hca.all-off.trace.json"):
        assert (out / name).is_file(), name
    assert "Reproduce: `dspark ab decode-hca --config tiny" in (out / "ab.md").read_text()


def test_cli_rejects_an_unknown_pass(tmp_path, capsys):
    rc = main(["ab", "decode-swa", "--config", "tiny", "--passes", "no-such-pass", "-o", str(tmp_path / "x")])
    assert rc == 2 and "not an optimisation pass" in capsys.readouterr().err


def test_roofline_source_flags_every_kernel():
    from dspark_ir import layers
    from lowering import build_task_graph
    from perf.estimate import estimate

    tg = build_task_graph(layers.build("decode-swa", config="tiny"))
    est = estimate(tg, RooflineCosts())
    assert est.sources() == {"roofline": est.kernels} and est.roofline_share() == 1.0
    assert est.makespan_us <= est.serial_us and est.makespan_us >= est.bound_us


def test_stage_is_its_tasks_scheduled_alone(report):
    """The stage latency is the schedule of exactly its tasks with outside deps met at 0: no longer than the
    layer, at least its longest task, and equal to scheduling that subset by hand."""
    from dataclasses import replace
    from fnmatch import fnmatchcase

    from perf.ab import STAGES, stage_latency
    from perf.schedule import sched_tasks, schedule

    case = report.cases[0]
    assert case.stage_name == STAGES["decode-swa"][0] and set(case.stage) == {"all-off", "default"}
    for name in ("all-off", "default"):
        r = case.results[name]
        us, n = case.stage[name]
        picked = [t for t in sched_tasks(r.tg) if any(fnmatchcase(t.name, g) for g in case.stage_globs)]
        assert n == len(picked) == 4
        assert max(row.alone_us for row in r.estimate.rows if row.id in {t.id for t in picked}) <= us
        assert us < r.latency_us
        ids = {t.id for t in picked}
        alone = [replace(t, deps=tuple(d for d in t.deps if d in ids)) for t in picked]
        assert us == schedule(alone, r.estimate.schedule.costs, ScheduleParams()).makespan_us
    assert stage_latency(case.results["default"], ["no.such.*"], ScheduleParams()) == (0.0, 0)
    md = report.markdown()
    assert "- stage `sparse attention` alone (tasks swa.swa_gather_kv" in md
    assert report.to_json()["cases"][0]["stage"]["task_count"] == {"all-off": 4, "default": 4}


def test_cli_stage_option(tmp_path, capsys):
    out = tmp_path / "ab"
    rc = main(["ab", "decode-hca", "--config", "tiny", "--tp", "2", "--batch", "4", "--seq", "4", "--source",
               "roofline", "--passes", "fuse-merge-rope-pack", "--no-loo", "--no-aoi", "--no-steps", "--no-plots",
               "--no-traces", "--no-progress", "--stage", "hca.hca_stream_*", "-o", str(out)])
    assert rc == 0
    stage = json.loads((out / "ab.json").read_text())["cases"][0]["stage"]
    assert stage["tasks"] == ["hca.hca_stream_*"]
    assert stage["task_count"] == {"all-off": 2, "default": 1}        # merge + pack, fused into one by the pass
    assert "--stage 'hca.hca_stream_*'" in (out / "ab.md").read_text()
    capsys.readouterr()
    assert main(["ab", "decode-hca", "--config", "tiny", "--stage", " , ", "-o", str(tmp_path / "x")]) == 2
    assert "--stage: give at least one task-name glob" in capsys.readouterr().err

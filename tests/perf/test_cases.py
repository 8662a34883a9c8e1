"""The case corpus (perf/cases.py, `dspark ab --cases`): loader, scoping, JSON schema, verdict arithmetic. No pypto:
stub or roofline costs on the tiny config."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from dspark_cli.main import main
from perf.ab import stage_latency, stage_tasks
from perf.cases import CaseError, Measured, load_cases, load_file, run_cases, verdict
from perf.costs import FunctionCosts, KernelCost, RooflineCosts
from perf.schedule import ScheduleParams
from perf.trust import scope_latency

TINY = """
[[case]]
name = "tiny-swa-split"
pr = 982
layer = "decode-swa"
shape = { config = "tiny", tp = 2, batch = 2, seq = 4, rows = 8 }
before = "cleanup"
after = { passes = ["canonicalize", "cse", "split-writeback-bias", "dce"] }
hw = { before_us = 100.0, after_us = 80.0 }
source = "a test"

[[case]]
name = "tiny-hc-pre"
layer = "decode-swa"
shape = { config = "tiny", tp = 2, batch = 2, seq = 4 }
scope = { name = "hc_pre", tasks = ["hc.hc_pre_*", "hc.split_pre_post", "hc.comb_sinkhorn", "hc.mix_x"] }
before = "all-off"
after = { pipeline = "canonicalize,cse,deterministic-split-k,dce" }
hw = { delta_pct = 0.0 }
source = "a test"

[[case]]
name = "tiny-held-back"
layer = "decode-swa"
shape = { config = "tiny", tp = 2, batch = 2, seq = 4 }
before = "all-off"
after = { default_without = ["tile-choice"] }
source = "a test"

[[case]]
name = "tiny-prefill-hc-pre"
layer = "prefill-swa"
shape = { config = "tiny", tp = 1, rows = 7, contexts = { chunk = 7 } }
scope = { name = "hc_pre", tasks = ["hc.hc_pre_*", "hc.split_pre_post", "hc.comb_sinkhorn", "hc.mix_x"] }
before = "cleanup"
after = { passes = ["canonicalize", "cse", "deterministic-split-k", "dce"] }
source = "a test"

[[case]]
name = "tiny-unsupported"
layer = "decode-swa"
before = "all-off"
after = "default"
source = "a test"
unsupported = "no such layer form yet"
"""


def stub(task):
    """1 µs per block of work on its core kind: deterministic, every task different."""
    n = max(task.blocks, 1)
    return KernelCost("given", 1800.0, *((1800.0 * n, 0.0) if task.core == "cube" else (0.0, 1800.0 * n)))


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = tmp_path_factory.mktemp("cases") / "tiny.toml"
    path.write_text(TINY)
    return load_cases(str(path))


@pytest.fixture(scope="module")
def report(corpus):
    return run_cases(corpus, FunctionCosts(stub), ScheduleParams())


def test_the_seed_corpus_loads():
    cases = {c.name: c for c in load_cases("all")}
    assert {"csa-topk-bypass-typed-gather", "swa-parallelisation", "hca-merge-rope-pack",
            "hc-pre-split-k-prefill-512", "hc-pre-split-k-decode-128"} <= set(cases)
    pre = cases["hc-pre-split-k-prefill-512"]
    assert pre.pr == 982 and pre.layer == "prefill-swa" and pre.rows == 512 and pre.scope
    assert dict(pre.shape.params) == {"chunk": 512} and pre.shape_json()["batch"] * pre.shape_json()["seq"] == 512
    assert (pre.hw.before_us, pre.hw.after_us) == (167.0, 199.5) and pre.hw.delta == pytest.approx(19.46, abs=0.01)
    assert cases["hc-pre-split-k-decode-128"].hw.delta == 0 and cases["hc-pre-split-k-decode-128"].hw.to_json() is None
    csa = cases["csa-topk-bypass-typed-gather"]
    assert dict(csa.shape.params) == {"max_context": 256} and not csa.scope and csa.pr is None
    assert "topk-bypass" in csa.after.text and "topk-bypass" not in csa.before.text


def test_pipelines_map_to_variants(corpus):
    c = {x.name: x for x in corpus}
    assert c["tiny-swa-split"].before.variant.name == "cleanup"
    assert dict(c["tiny-swa-split"].after.variant.ctx)["only"] == ("canonicalize", "cse", "split-writeback-bias", "dce")
    assert dict(c["tiny-hc-pre"].after.variant.ctx)["pipeline"] == "canonicalize,cse,deterministic-split-k,dce"
    assert dict(c["tiny-held-back"].after.variant.ctx)["disabled"] == ("tile-choice",)
    assert c["tiny-hc-pre"].rows == 8


def test_a_prefill_case_has_its_chunk_as_rows(corpus, report):
    case = next(c for c in corpus if c.name == "tiny-prefill-hc-pre")
    assert case.rows == 7 and (case.shape.batch, case.shape.seq) == (None, None)
    assert case.shape_json() == {"config": "tiny", "tp": 1, "batch": 7, "seq": 1, "contexts": {"chunk": 7}, "rows": 7}
    assert case.shape.label() == "tiny TP=1 chunk=7"
    r = next(x for x in report.results if x.case.name == "tiny-prefill-hc-pre")
    assert "hc.hc_pre_linear_reduce" in {t.name for t in stage_tasks(r.after.tg, case.scope)}
    assert "hc.hc_pre_linear_seed" in {t.name for t in stage_tasks(r.before.tg, case.scope)}
    assert r.before_us > 0 and r.after_us > 0


def test_default_with_turns_entries_on_at_their_place_and_sets_options():
    from passes import DEFAULT_PIPELINE, parse_pipeline
    from perf.cases import default_with

    names = [parse_pipeline(e.spec).names[0] for e in DEFAULT_PIPELINE]
    plain = [n for n, e in zip(names, DEFAULT_PIPELINE) if e.enabled]
    assert default_with([]).split(",") == plain
    text = default_with(["kv-score-token-groups{token_tiles=4}", "fuse-merge-rope-pack{heads_on_chip=false}"])
    got = parse_pipeline(text)
    assert [n for n in got.names if n != "kv-score-token-groups"] == plain
    assert got.names.index("kv-score-token-groups") == got.names.index("dequant-workers") + 1
    assert "kv-score-token-groups{token_tiles=4}" in text and "fuse-merge-rope-pack{heads_on_chip=false}" in text


@pytest.mark.parametrize("body, where", [
    ('[[case]]\nname = "x"\nlayer = = 3\nsource = "y"\n', ":3:9: "),          # TOML syntax: line and column
    ('[[case]]\nname = "x"\nlayer = [\n', ":4: "),                              # at the end: the last line
    ('[case]\nname = "x"\n', ": no [[case]] tables"),
    ('[[cases]]\nname = "x"\n', ":1: unknown top-level key 'cases'"),
])
def test_syntax_errors_name_the_line(tmp_path, body, where):
    path = tmp_path / "bad.toml"
    path.write_text(body)
    with pytest.raises(CaseError) as e:
        load_file(path)
    assert str(e.value).startswith(f"{path}{where}") and "\n" not in str(e.value), str(e.value)


@pytest.mark.parametrize("old, new, message", [
    ('"split-writeback-bias"', '"split-writeback-biass"', "case 'tiny-swa-split': after.passes: unknown pass"),
    ("rows = 8 }", "rows = 9 }", "case 'tiny-swa-split': shape.rows = 9 but batch × seq = 2 × 4 = 8"),
    ('layer = "decode-swa"\nshape = { config = "tiny", tp = 2, batch = 2, seq = 4, rows = 8 }',
     'layer = "decode-swaa"', "case 'tiny-swa-split': unknown layer 'decode-swaa'"),
    ('pr = 982', 'pr = "982"', "case 'tiny-swa-split': 'pr' must be a pypto-lib PR number"),
    ('hw = { before_us = 100.0, after_us = 80.0 }', 'hw = { before_us = 100.0 }', "hw needs both"),
    ('before = "cleanup"', 'before = "clean"', "case 'tiny-swa-split': before: 'clean' is not one of"),
    ('before = "cleanup"', 'before = { pipeline = "cse,,dce" }', "case 'tiny-swa-split': before.pipeline:"),
    ('pr = 982', 'pr = 982\nsauce = "x"', "case 'tiny-swa-split': unknown key 'sauce'"),
    ("rows = 7, contexts = { chunk = 7 }", "rows = 8, contexts = { chunk = 7 }",
     "case 'tiny-prefill-hc-pre': shape.rows = 8 but contexts.chunk = 7"),
    ("rows = 7, contexts = { chunk = 7 }", "rows = 7", "case 'tiny-prefill-hc-pre': shape.rows = 7 but contexts."
     "chunk = 512"),                                                            # the layer's default chunk
    ("tp = 1, rows = 7,", "tp = 1, batch = 7, seq = 1, rows = 7,",
     "case 'tiny-prefill-hc-pre': shape.batch: prefill-swa takes its rows from contexts.chunk"),
    ("contexts = { chunk = 7 }", 'contexts = { chunk = "7" }',
     "case 'tiny-prefill-hc-pre': shape.contexts.chunk must be a positive integer"),
    ('name = "tiny-held-back"', 'name = "tiny-hc-pre"', "case 'tiny-hc-pre': the name is also used"),
    ('{ default_without = ["tile-choice"] }', '{ default_with = ["mlir-sccp"] }',
     "case 'tiny-held-back': after.default_with: pipeline:1:1: unknown pass 'mlir-sccp'"),
    ('{ default_without = ["tile-choice"] }', '{ default_with = ["topk-merge-stage{sort_stage=3}"] }',
     "case 'tiny-held-back': after.default_with: "),
])
def test_bad_cases_are_one_line_with_the_case_name(tmp_path, old, new, message):
    assert old in TINY
    path = tmp_path / "bad.toml"
    path.write_text(TINY.replace(old, new, 1))
    with pytest.raises(CaseError) as e:
        load_cases(str(path))
    text = str(e.value)
    assert text.startswith(str(path)) and message in text and "\n" not in text, text


def test_a_missing_file_and_an_empty_file(tmp_path):
    with pytest.raises(CaseError, match="no such case file"):
        load_cases(str(tmp_path / "none.toml"))
    (tmp_path / "empty.toml").write_text("# nothing\n")
    with pytest.raises(CaseError, match="no \\[\\[case\\]\\] tables"):
        load_cases(str(tmp_path / "empty.toml"))


def test_verdict_arithmetic():
    hw = Measured(100.0, 80.0)                                   # −20 %
    assert verdict(hw, 90.0, 75.0) == {"sign": True, "delta": True, "absolute": True}        # −16.7 %: 3.3 pts
    assert verdict(hw, 90.0, 81.0) == {"sign": True, "delta": False, "absolute": True}       # −10 %: 10 pts
    assert verdict(hw, 50.0, 60.0) == {"sign": False, "delta": False, "absolute": False}     # +20 %, 50 % low
    assert verdict(hw, 126.0, 100.0)["absolute"] is False and verdict(hw, 124.0, 99.0)["absolute"] is True
    assert verdict(hw, 100.0, 100.2)["sign"] is False                                        # flat is no sign
    flat = Measured(delta_pct=0.0)                               # published as unchanged
    assert verdict(flat, 100.0, 104.0) == {"sign": True, "delta": True, "absolute": None}
    assert verdict(flat, 100.0, 106.0) == {"sign": False, "delta": False, "absolute": None}
    assert verdict(Measured(), 100.0, 90.0) == {"sign": None, "delta": None, "absolute": None}


def test_errors_are_points_and_percent(report):
    r = next(x for x in report.results if x.case.name == "tiny-swa-split")
    e = r.errors()
    assert e["delta_points"] == pytest.approx(r.predicted_delta - (-20.0))
    assert e["before_pct"] == pytest.approx(100 * (r.before_us - 100.0) / 100.0)
    assert e["after_pct"] == pytest.approx(100 * (r.after_us - 80.0) / 80.0)
    assert r.predicted_delta == pytest.approx(100 * (r.after_us - r.before_us) / r.before_us)


def test_a_scoped_case_costs_and_schedules_only_its_stage(corpus):
    case = next(c for c in corpus if c.name == "tiny-hc-pre")
    costed = []

    def counting(task):
        costed.append(task.name)
        return stub(task)

    rep = run_cases([case], FunctionCosts(counting), ScheduleParams())
    r = rep.results[0]
    for side, us in ((r.before, r.before_us), (r.after, r.after_us)):
        names = {t.name for t in stage_tasks(side.tg, case.scope)}
        assert names and all(n.startswith("hc.") and n != "hc.hc_post" for n in names)
        assert us == stage_latency(side, case.scope, ScheduleParams())[0]
    assert set(costed) <= {t.name for s in (r.before, r.after) for t in stage_tasks(s.tg, case.scope)}
    assert "hc.hc_pre_linear_reduce" in {t.name for t in stage_tasks(r.after.tg, case.scope)}
    assert "hc.hc_pre_linear_seed" in {t.name for t in stage_tasks(r.before.tg, case.scope)}


def test_json_schema(report):
    doc = report.to_json()
    assert [d["name"] for d in doc] == ["tiny-swa-split", "tiny-hc-pre", "tiny-held-back", "tiny-prefill-hc-pre",
                                        "tiny-unsupported"]
    for d in doc:
        assert {"name", "pr", "layer", "shape", "scope", "hw", "predicted", "errors", "verdict", "trust",
                "source"} <= set(d)
        assert set(d["shape"]) == {"config", "tp", "batch", "seq", "contexts", "rows"}
    split, pre, held, prefill, unsupported = doc
    assert split["pr"] == 982 and split["hw"] == {"before_us": 100.0, "after_us": 80.0}
    assert set(split["predicted"]) == {"before_us", "after_us"} and split["scope"]["tasks"] is None
    assert pre["hw"] is None and pre["hw_delta_pct"] == 0.0 and pre["scope"]["tasks"][0] == "hc.hc_pre_*"
    assert held["hw"] is None and held["verdict"] == {"sign": None, "delta": None, "absolute": None}
    assert prefill["shape"]["rows"] == prefill["shape"]["batch"] * prefill["shape"]["seq"] == 7
    assert unsupported["predicted"] is None and "no such layer form yet" in unsupported["error"]
    assert set(split["trust"]["flags"]) <= {"F", "R", "B"}
    json.dumps(doc)


def test_markdown_and_table(report):
    md = report.markdown()
    assert "| tiny-swa-split | #982 |" in md and "100.0 → 80.0 µs (-20.0 %)" in md
    assert "held back" in md and "not predicted: unsupported: no such layer form yet" in md
    assert "**R**:" in md and report.summary().startswith("")


def test_cli_runs_a_case_file(tmp_path, capsys):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    out = tmp_path / "out"
    assert main(["ab", "--cases", str(path), "--source", "roofline", "--no-progress", "-o", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "| tiny-swa-split | #982 |" in printed and "trust flags:" in printed
    doc = json.loads((out / "cases.json").read_text())
    assert len(doc) == 5 and (out / "cases.md").is_file()
    assert doc[0]["predicted"]["before_us"] > 0
    assert doc[0]["model"] == {"cost_source": "roofline", "schedule": "chip", "block_model": "grid",
                               "block_issue": "cores", "early_dispatch": ScheduleParams.chip().early_dispatch,
                               "cross_rank": ScheduleParams.chip().cross_rank}


def test_cli_block_model_selects_a_sensitivity_variant(tmp_path, capsys):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    docs = {}
    for model in ("work", "span", "grid"):
        out = tmp_path / model
        assert main(["ab", "--cases", str(path), "--source", "roofline", "--no-progress", "--block-model", model,
                     "-o", str(out)]) == 0
        docs[model] = json.loads((out / "cases.json").read_text())
        assert docs[model][0]["model"]["block_model"] == model
        assert f"--block-model {model}" in (out / "cases.md").read_text()
    capsys.readouterr()
    others = docs["grid"][0]["trust"]["delta_other_block_models_pct"]
    assert set(others) == {"work", "span"}


def test_cli_block_issue_selects_the_issue_rule(tmp_path, capsys):
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    docs = {}
    for rule in ("cores", "grid"):
        out = tmp_path / rule
        assert main(["ab", "--cases", str(path), "--source", "roofline", "--no-progress", "--block-issue", rule,
                     "-o", str(out)]) == 0
        docs[rule] = json.loads((out / "cases.json").read_text())
        assert docs[rule][0]["model"]["block_issue"] == rule
        assert f"--block-issue {rule}" in (out / "cases.md").read_text()
    capsys.readouterr()
    for cores, grid in zip(docs["cores"], docs["grid"]):    # issuing every block never makes a side faster
        if cores["predicted"] is not None:
            assert grid["predicted"]["before_us"] >= cores["predicted"]["before_us"]
            assert grid["predicted"]["after_us"] >= cores["predicted"]["after_us"]


@pytest.fixture(scope="module")
def chip_report(corpus):
    """The tiny corpus under the chip model, on a small budget (2 AIVs, 1 AIC, 2 core groups) so that the
    block-issue rule changes the figures."""
    return run_cases(corpus, FunctionCosts(stub), replace(ScheduleParams.chip(), vector_cores=2, cube_cores=1))


def test_the_rule_matrix_reschedules_every_case_under_each_rule_combination(chip_report):
    runs = chip_report.rules
    assert len(runs) == 8 and len({run.label() for run in runs}) == 8
    committed = [run for run in runs if run.committed]
    assert len(committed) == 1
    base = chip_report.params
    assert committed[0].label() == (base.block_issue, "on" if base.early_dispatch else "off",
                                    "on" if base.cross_rank else "off")
    for i, r in enumerate(chip_report.results):       # the committed row is the report's own figures, which
        assert committed[0].sides[i] == ((r.before_us, r.after_us) if r.before_us is not None else (None, None))
        if r.before is not None:                      # rescheduling under the committed rules reproduces
            assert scope_latency(r.before, base, r.case.scope) == r.before_us
            assert scope_latency(r.after, base, r.case.scope) == r.after_us
    for run in runs:
        for r, (b, a), v in zip(chip_report.results, run.sides, run.verdicts):
            assert v == verdict(r.case.hw, b, a)
            assert (b is None) == (r.before_us is None)
    by_rules = {run.label(): run for run in runs}
    split = 0                                          # tiny-swa-split, a whole-layer case
    for early in ("on", "off"):                        # the issue rule moves the figures (either way: issuing
        for cross in ("on", "off"):                    # more blocks can reorder a list schedule)
            cores, grid = by_rules[("cores", early, cross)], by_rules[("grid", early, cross)]
            assert grid.sides[split] != cores.sides[split]


def test_the_rule_matrix_is_in_the_json_markdown_and_cli(chip_report, report, tmp_path, capsys):
    doc = chip_report.to_json()
    rules = doc[0]["rules"]
    assert len(rules) == 8 and {"block_issue", "early_dispatch", "cross_rank", "before_us", "after_us",
                                "verdict"} <= set(rules[0])
    assert doc[4]["rules"][0]["before_us"] is None                  # the unsupported case
    md = chip_report.markdown()
    assert "## The model's rules" in md and "| block issue (rule 7) |" in md
    header = next(line for line in chip_report.rule_table() if line.startswith("| block issue"))
    assert "tiny-swa-split" in header and "tiny-hc-pre" in header and "tiny-held-back" not in header
    assert report.rules == [] and "## The model's rules" not in report.markdown()   # legacy model: no dispatch
    path = tmp_path / "tiny.toml"
    path.write_text(TINY)
    assert main(["ab", "--cases", str(path), "--source", "roofline", "--no-progress", "-o",
                 str(tmp_path / "out")]) == 0
    printed = capsys.readouterr().out
    assert "The model's rules" in printed and "| **cores** |" in printed


def test_cli_errors_are_one_line(tmp_path, capsys):
    path = tmp_path / "bad.toml"
    path.write_text(TINY.replace("rows = 8 }", "rows = 9 }"))
    assert main(["ab", "--cases", str(path), "--source", "roofline", "-o", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "shape.rows = 9" in err and not (tmp_path / "o").exists()
    assert main(["ab", "decode-swa", "--cases", "all", "-o", str(tmp_path / "o")]) == 2
    assert "give layers or --cases" in capsys.readouterr().err


def test_roofline_source_runs_every_seed_case_shape():
    """The corpus's graphs build and its scopes match tasks (roofline costs: no pypto)."""
    cases = [c for c in load_cases("all") if c.name.startswith("hc-pre")]
    rep = run_cases(cases, RooflineCosts(), ScheduleParams())
    for r in rep.results:
        assert r.before_us > 0 and r.after_us > 0

"""`dspark ab` takes what `dspark opt` takes (pipelines with options, toggles, plugins, .dsir files) and the
config's shape; `dspark estimate` prints one graph's latency. Roofline costs only (no pypto)."""
from __future__ import annotations

import json

import pytest

from dspark_cli.main import main
from perf.ab import Toggles, Variant, variants
from perf.sweep import pipeline_variant

FAST = ["--source", "roofline", "--no-progress", "--no-plots", "--no-traces"]


def ab(tmp_path, *argv):
    out = tmp_path / "ab"
    assert main(["ab", *argv, *FAST, "-o", str(out)]) == 0
    return json.loads((out / "ab.json").read_text()), (out / "ab.md").read_text()


def test_config_tiny_runs_at_tiny_shape(tmp_path):
    doc, md = ab(tmp_path, "decode-swa", "--config", "tiny", "-p", "none")
    assert doc["cases"][0]["shape"] == "tiny TP=2 B=4 S=4"
    assert "dspark ab decode-swa --config tiny --tp 2 --batch 4 --seq 4 " in md      # the reproduce line
    doc, _ = ab(tmp_path, "decode-swa", "--config", "tiny", "--batch", "2", "-p", "none")
    assert doc["cases"][0]["shape"] == "tiny TP=2 B=2 S=4"


def test_pipelines_with_options_plugins_and_enable(tmp_path, capsys):
    doc, md = ab(tmp_path, "decode-swa", "--config", "tiny", "-p", "none", "-p", "split-m-fanout{ways=8}",
                 "-p", "default", "--enable", "retiled-cse", "--plugin", "tests.passes.planted")
    rows = {r["variant"]: r for r in doc["cases"][0]["variants"]}
    assert list(rows) == ["none", "split-m-fanout{ways=8}", "default"]
    assert rows["none"]["fired"] == []                               # none stays none
    assert "retiled-cse" in rows["default"]["fired"] and "retiled-cse" in rows["split-m-fanout{ways=8}"]["fired"]
    assert doc["compare"] == ["none", "split-m-fanout{ways=8}", "default"]
    assert "**A/B against `none`**" in md and "`default`" in md
    assert "-p=none '-p=split-m-fanout{ways=8}' -p=default --plugin tests.passes.planted --enable retiled-cse" in md
    assert "A/B against `none`" in capsys.readouterr().out


def test_two_files(tmp_path, capsys):
    before, after = tmp_path / "before.dsir", tmp_path / "after.dsir"
    assert main(["show", "decode-hca", "--config", "tiny", "-o", str(before)]) == 0
    assert main(["opt", str(before), "-o", str(after)]) == 0
    doc, md = ab(tmp_path, str(before), str(after), "-p", "none")
    assert [c["label"] for c in doc["cases"]] == ["before.dsir", "after.dsir"]
    assert "A/B of the files under `none`: before.dsir" in md and "% vs before.dsir" in md


@pytest.mark.parametrize("argv, message", [
    (["-p", "split-m-fanout{ways=0}"], "option 'ways' must be >= 1, got 0"),
    (["--pass-option", "quant-workers{workers=0}"], "option 'workers' must be >= 1, got 0"),
    (["--enable", "no-such-pass"], "unknown pass 'no-such-pass'"),
    (["--plugin", "no.such.module"], "cannot import pass plugin"),
])
def test_bad_pipeline_input_is_one_line_before_any_work(tmp_path, capsys, argv, message):
    assert main(["ab", "decode-swa", "--config", "tiny", *argv, *FAST, "-o", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and not (tmp_path / "x").exists()


def test_toggles_apply_to_every_variant_but_all_off():
    t = Toggles(enabled=("retiled-cse",), disabled=("cse",))
    named = {v.name: v.toggled(t) for v in variants(["widen-tile"], steps=False)}
    assert named["all-off"] == Variant("all-off", "off", ctx=named["all-off"].ctx)
    assert "retiled-cse" not in str(named["all-off"].context().effective_pipeline())
    untoggled = {v.name: v for v in variants(["widen-tile"], steps=False)}["default"]
    plain = untoggled.context().effective_pipeline().names
    assert plain[:2] == ["canonicalize", "cse"] and "retiled-cse" not in plain
    # retiled-cse is the off-by-default entry right after cse: the toggles swap the one for the other, nothing else
    assert named["default"].context().effective_pipeline().names == ["canonicalize", "retiled-cse", *plain[2:]]
    assert "widen-tile" not in named["-widen-tile"].context().effective_pipeline().names
    assert pipeline_variant("none").toggled(t).context().effective_pipeline().names == []


def test_estimate_layer_file_and_json(tmp_path, capsys):
    out = tmp_path / "e.json"
    assert main(["estimate", "decode-swa", "--source", "roofline", "--kernels", "2", "--json", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("decode_swa: makespan ") and "pipeline: canonicalize,cse," in text
    assert "Reproduce: dspark estimate decode-swa --config tiny -p default --source roofline" in text
    doc = json.loads(out.read_text())
    assert doc["schema"] == "dspark-estimate/1" and doc["makespan_us"] > 0 and len(doc["kernels_detail"]) > 2
    src = tmp_path / "g.dsir"
    assert main(["opt", "decode-swa", "-o", str(src)]) == 0
    assert main(["estimate", str(src), "-p", "none", "--source", "roofline", "--kernels", "0"]) == 0
    again = capsys.readouterr().out
    assert "pipeline: none" in again
    # the as-written optimised graph costs what the layer through the default pipeline costs
    assert again.split(",")[0] == text.split(",")[0]


def test_estimate_uses_the_schedule_model_of_ab(tmp_path, capsys):
    """estimate and ab default to the same (chip) schedule model, and --model legacy is the model without the chip's
    hop, block-dispatch and launch terms, so its makespan is shorter on the same kernels."""
    def makespan(*extra) -> tuple[float, str]:
        out = tmp_path / "e.json"
        assert main(["estimate", "decode-swa", "--source", "roofline", "--kernels", "0", "--json", str(out),
                     *extra]) == 0
        text = capsys.readouterr().out
        return json.loads(out.read_text())["makespan_us"], text

    chip, text = makespan()
    assert "schedule model: chip" in text and "--model" not in text.split("Reproduce:")[1]
    legacy, text = makespan("--model", "legacy")
    assert "schedule model: legacy" in text and "--model legacy" in text.split("Reproduce:")[1]
    assert legacy < chip


def test_estimate_pipeline_options_and_plugins(capsys):
    assert main(["estimate", "decode-swa", "-p", "canonicalize,split-m-fanout{ways=2},dce", "--source", "roofline",
                 "--kernels", "0", "--plugin", "tests.passes.planted", "--enable", "planted-options{ways=3}"]) == 0
    assert "pipeline: canonicalize,split-m-fanout{ways=2},dce,planted-options{ways=3}" in capsys.readouterr().out
    assert main(["estimate", "decode-swa", "-p", "split-m-fanout{ways=-2}"]) == 2
    assert "option 'ways' must be >= 1, got -2" in capsys.readouterr().err


def test_a_b_flags_are_the_first_two_pipelines(tmp_path, capsys):
    doc, md = ab(tmp_path, "decode-swa", "--config", "tiny", "--a", "none", "--b", "split-m-fanout{ways=8}")
    assert doc["compare"] == ["none", "split-m-fanout{ways=8}"]
    assert "-p=none '-p=split-m-fanout{ways=8}'" in md                 # reproduced as -p
    assert main(["ab", "decode-swa", "--a", "none", *FAST, "-o", str(tmp_path / "x")]) == 2
    assert "give both --a and --b" in capsys.readouterr().err

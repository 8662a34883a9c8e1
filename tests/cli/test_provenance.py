"""One provenance record (command, pipeline, toggles from flags and the environment, versions) in every output,
and one rule for defaults: opt, compile, ab, estimate run the default pipeline; lower, run, simulate run none
unless -p, and say so."""
from __future__ import annotations

import json

import pytest

from dspark_cli.common import NO_PASSES, CommandLine
from dspark_cli.main import main


@pytest.fixture
def env_off(monkeypatch):
    monkeypatch.setenv("DSPARK_DISABLE_PASSES", "widen-tile")


def test_lower_without_p_runs_no_pass_and_says_so(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("DSPARK_DISABLE_PASSES", raising=False)
    assert main(["lower", "decode-swa", "-o", str(tmp_path / "l")]) == 0
    assert f"pipeline: {NO_PASSES}" in capsys.readouterr().out
    record = json.loads((tmp_path / "l" / "tasks.json").read_text())["provenance"]
    assert record["pipeline"] == NO_PASSES
    assert record["command"] == f"dspark lower decode-swa --config tiny -o {tmp_path / 'l'}"
    assert set(record["versions"]) == {"dspark", "pypto", "python"}


def test_environment_is_recorded_in_lower_outputs(tmp_path, capsys, env_off):
    out = tmp_path / "l"
    assert main(["lower", "decode-swa", "-p", "default", "-o", str(out)]) == 0
    record = json.loads((out / "tasks.json").read_text())["provenance"]
    assert record["environment"] == {"DSPARK_DISABLE_PASSES": "widen-tile"}
    assert "widen-tile" not in record["pipeline"] and "split-m-fanout" in record["pipeline"]
    assert record["command"].startswith("DSPARK_DISABLE_PASSES=widen-tile dspark lower decode-swa")
    assert "# Reproduce: DSPARK_DISABLE_PASSES=widen-tile dspark lower" in (out / "orchestrate.py").read_text()


def test_environment_is_recorded_in_compile_outputs(tmp_path, env_off):
    out = tmp_path / "c"
    assert main(["compile", "decode-swa", "--no-check-numerics", "-o", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["provenance"]["environment"] == {"DSPARK_DISABLE_PASSES": "widen-tile"}
    assert report["provenance"]["command"].startswith("DSPARK_DISABLE_PASSES=widen-tile dspark compile")
    assert json.loads((out / "lowered" / "tasks.json").read_text())["provenance"] == report["provenance"]
    assert "# environment: DSPARK_DISABLE_PASSES=widen-tile" in (out / "opt.dsir").read_text()
    assert "# environment: DSPARK_DISABLE_PASSES=widen-tile" in (out / "dumps" / "00_input.dsir").read_text()


def test_opt_header_and_no_env(capsys, env_off):
    assert main(["opt", "decode-swa"]) == 0
    head = capsys.readouterr().out.splitlines()[:2]
    assert "widen-tile" not in head[0] and head[1].startswith("# environment: DSPARK_DISABLE_PASSES=widen-tile")
    assert main(["opt", "decode-swa", "--no-env"]) == 0
    head = capsys.readouterr().out.splitlines()[:2]
    assert "widen-tile" in head[0] and "environment" not in head[1]


def test_ab_and_estimate_record_provenance(tmp_path, capsys, env_off):
    out = tmp_path / "ab"
    assert main(["ab", "decode-swa", "--config", "tiny", "-p", "none", "-p", "default", "--disable", "cse",
                 "--source", "roofline", "--no-progress", "--no-plots", "--no-traces", "-o", str(out)]) == 0
    record = json.loads((out / "ab.json").read_text())["provenance"]
    assert record["disabled"] == ["cse"] and record["environment"] == {} and "ignore" in record["environment_note"]
    assert record["variants"]["none"] == "" and "widen-tile" in record["variants"]["default"]
    assert not record["command"].startswith("DSPARK")                # ab does not apply the environment
    est = tmp_path / "e.json"
    assert main(["estimate", "decode-swa", "--source", "roofline", "--kernels", "0", "--json", str(est)]) == 0
    record = json.loads(est.read_text())["provenance"]
    assert record["environment"] == {"DSPARK_DISABLE_PASSES": "widen-tile"} and "widen-tile" not in record["pipeline"]


def test_command_line_quotes_the_environment_as_an_assignment(monkeypatch):
    monkeypatch.setenv("DSPARK_DISABLE_PASSES", "cse, dce")
    assert str(CommandLine("lower", "x.dsir").environment()) == "DSPARK_DISABLE_PASSES='cse, dce' dspark lower x.dsir"
    assert str(CommandLine("lower", "x.dsir").environment(False)) == "dspark lower x.dsir"
    monkeypatch.delenv("DSPARK_DISABLE_PASSES")
    assert str(CommandLine("lower", "x.dsir").environment()) == "dspark lower x.dsir"


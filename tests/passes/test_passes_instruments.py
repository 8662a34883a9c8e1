"""Instruments: --verify-each, --check-numerics, reproducers, --bisect-limit, --time-passes, printing."""
from __future__ import annotations

import os
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from dspark_cli.main import main
from dspark_ir import interp, parse_file, print_graph
from dspark_ir.sample import sample_inputs
from passes import Pass, PassContext, PassError, bisect_pipeline, register_pass, run_pipeline

from .support import CORE_GRAPH, checked, mini

ROOT = Path(__file__).parents[2]

pytestmark = pytest.mark.usefixtures("std_pipeline")


@pytest.fixture
def src(tmp_path) -> Path:
    path = tmp_path / "mini.dsir"
    path.write_text(print_graph(mini()))
    return path


def run_cli(*argv: str) -> int:
    return main(["opt", *argv])


def rerun(command: str, cwd: Path, monkeypatch) -> int:
    """Run a printed `dspark opt ...` command in-process, from `cwd`."""
    words = shlex.split(command)
    assert words[:2] == ["dspark", "opt"]
    monkeypatch.chdir(cwd)
    return main(words[1:])


# ---- planted bugs are caught, named, and reproduced ---------------------------------------------
def test_check_numerics_names_the_wrong_pass(src, capsys):
    assert run_cli(str(src), "-p", "canonicalize,planted-add-to-mul,dce", "--check-numerics") == 4   # contract
    err = capsys.readouterr().err.splitlines()
    assert err[-1].startswith("dspark: pass 'planted-add-to-mul' (#2) broke its numeric contract bitwise: "
                              "output #0 %a.out, worst element [")
    assert "before " in err[-1] and "after " in err[-1] and "(inputs seed 0)" in err[-1]


def test_bounded_reassoc_reports_ulps():
    # on `mini` the f32 product is cast to bf16 right away, so rounding it through bf16 first is harmless
    assert run_pipeline(mini(), "planted-rounding", check_numerics=True).changed
    g = checked("""graph @f32_out<T = 4>(%x: bf16[T,8], %m: bf16[8,8]) {
      %p.mm = matmul(%x, %m) : f32[T,8]
      return %p.mm
    }""")
    with pytest.raises(PassError) as e:
        run_pipeline(g, "planted-rounding", check_numerics=True)
    assert e.value.kind == "contract"
    assert str(e.value).startswith("pass 'planted-rounding' (#1) broke its numeric contract bounded-reassoc(4): "
                                   "output #0 %p.mm.rf (was %p.mm), worst element [")
    assert " ulp > 4 ulp) (inputs seed 0)" in str(e.value)


def test_numerics_off_lets_the_wrong_pass_through():
    result = run_pipeline(mini(), "planted-add-to-mul", check_numerics=False)
    assert [r.status for r in result.runs] == ["changed"]
    assert result.runs[0].added == ["a.sum.mul"] and result.runs[0].removed == ["a.sum"]


@pytest.mark.parametrize("pipeline, code, message", [
    ("canonicalize,planted-add-to-mul,dce", 4, "broke its numeric contract bitwise"),
    ("canonicalize,planted-crash,dce", 3, "crashed: ZeroDivisionError: integer division or modulo by zero"),
    ("planted-invalid,dce", 4, "produced an invalid graph: result %a.flat has type bf16[32]"),
])
def test_failures_write_a_reproducer_that_fails_the_same_way(src, tmp_path, capsys, monkeypatch,
                                                              pipeline, code, message):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    (work / "repro.dsir").write_text("mine\n")
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))     # where the new temp directories go
    assert run_cli(str(src), "-p", pipeline, "-o", "out.dsir") == code
    err = capsys.readouterr().err.splitlines()
    assert not (work / "out.dsir").exists()
    assert (work / "repro.dsir").read_text() == "mine\n", "a reproducer never goes over ./repro.dsir"
    hint = next(line for line in err if line.startswith("dspark: reproducer written to "))
    path, command = hint.removeprefix("dspark: reproducer written to ").split("; rerun: ", 1)
    path = Path(path)
    assert path.name == "repro.dsir" and path.parent.parent == tmp_path and path.parent.name.startswith("dspark-repro-")
    first = err[-1]
    assert message in first
    failing = pipeline.split(",")[1] if pipeline.startswith("canonicalize") else pipeline.split(",")[0]
    assert f"pass '{failing}' (#" in first
    # the reproducer holds the snapshot the failing pass received and the remaining pipeline
    repro = path.read_text()
    assert repro.startswith("# dspark reproducer: ") and f"-p {failing}," in repro
    parse_file(path)
    # rerun exactly as printed: the same pass fails the same way (now as pass #1)
    assert rerun(command, work, monkeypatch) == code
    again = capsys.readouterr().err.splitlines()[-1]
    assert _what(again) == _what(first)


def _what(error_line: str) -> str:
    """The error without its file location and pass number (the reproducer is another file, the failing
    pass is #1 there)."""
    text = error_line[error_line.index("pass '"):]
    return text[:text.index("(#")] + text[text.index(")") + 1:]


def test_reproducer_rerun_in_a_fresh_process(src, tmp_path):
    """The printed command works from a shell: a planted pass comes back through --plugin."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DSPARK_CHECK_NUMERICS": "0"}
    cmd = [sys.executable, "-m", "dspark_cli.main", "opt", str(src), "-p", "canonicalize,planted-crash",
           "--plugin", "tests.passes.planted", "--repro", str(tmp_path / "r.dsir")]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, env=env)
    assert done.returncode == 3 and "Traceback" not in done.stderr          # a crashing pass: internal error
    command = done.stderr.split("; rerun: ", 1)[1].splitlines()[0]
    assert "--plugin tests.passes.planted" in command
    again = subprocess.run([sys.executable, "-m", "dspark_cli.main", *shlex.split(command)[1:]],
                           capture_output=True, text=True, cwd=tmp_path, env=env)
    assert again.returncode == 3
    assert again.stderr.splitlines()[-1] == \
        "dspark: pass 'planted-crash' (#1) crashed: ZeroDivisionError: integer division or modulo by zero " \
        "(--debug for the traceback)"
    debug = subprocess.run([sys.executable, "-m", "dspark_cli.main", *shlex.split(command)[1:], "--debug"],
                           capture_output=True, text=True, cwd=tmp_path, env=env)
    assert debug.returncode == 3 and "Traceback (most recent call last)" in debug.stderr
    assert "ZeroDivisionError" in debug.stderr and "planted.py" in debug.stderr     # the pass's own frame


def test_python_api_failure_carries_the_reproducer():
    with pytest.raises(PassError) as e:
        run_pipeline(mini(), "canonicalize,planted-crash,dce")
    assert e.value.kind == "crash" and e.value.pass_name == "planted-crash" and e.value.index == 2
    assert "# rerun: dspark opt repro.dsir -p planted-crash,dce " in e.value.reproducer and e.value.rerun == ""


def test_requirements_and_applicability():
    with pytest.raises(PassError) as e:
        run_pipeline(mini(), "planted-needs-canonical")
    assert str(e.value) == ("pass 'planted-needs-canonical' (#1) requires 'canonical': 'canonicalize' would still "
                            "rewrite %a.back (run 'canonicalize' before it)")
    assert run_pipeline(mini(), "canonicalize,planted-needs-canonical").runs[1].status == "no-op"
    result = run_pipeline(mini(), "planted-swa-only")
    assert result.runs[0].status == "not-applicable"
    assert result.runs[0].note == "needs layer decode-swa, graph is not a layer"


@register_pass
@dataclass(frozen=True)
class PlantedRenameParam(Pass):
    """(test only) Renames a graph parameter: passes must not change the graph's signature."""

    name = "planted-rename-param"

    def run(self, g):
        g.rename(g.params[1], "w2")
        return []


def test_signature_changes_are_rejected():
    with pytest.raises(PassError) as e:
        run_pipeline(mini(), "planted-rename-param")
    assert e.value.kind == "signature" and "changed the graph's parameters" in str(e.value)


@register_pass
@dataclass(frozen=True)
class PlantedAttrsInPlace(Pass):
    """(test only) Edits a node's attributes in place and says so with `touch()`: the change record cannot tell
    which node changed."""

    name = "planted-attrs-in-place"

    def run(self, g):
        node = next(iter(g.nodes.values()))
        node.attrs = {**node.attrs, "probe": 1}
        g.touch()
        return []


def test_edits_in_place_are_rejected_and_the_reproducer_starts_from_the_input():
    with pytest.raises(PassError) as e:
        run_pipeline(mini(), "canonicalize,planted-attrs-in-place")
    assert e.value.kind == "crash" and "edited the graph in place" in str(e.value)
    assert "canonicalize,planted-attrs-in-place" in e.value.reproducer.splitlines()[1]   # the whole pipeline again


# ---- bisection --------------------------------------------------------------------------------
def _outputs(g):
    out = interp.run(g, sample_inputs(g, 0))
    return [out[v.name] for v in g.returns]


def test_bisect_limit_finds_the_planted_bug(src, tmp_path, capsys):
    """Binary search over --bisect-limit N with a numeric oracle finds the first bad pass application."""
    pipeline = "canonicalize,cse,planted-add-to-mul,dce"
    reference = _outputs(parse_file(src).entry)

    def bad(n: int) -> bool:
        out = tmp_path / f"out{n}.dsir"
        assert run_cli(str(src), "-p", pipeline, "--no-check-numerics", "--bisect-limit", str(n), "-o", str(out)) == 0
        got = _outputs(parse_file(out).entry)
        return any((a.view("u2") != b.view("u2")).any() for a, b in zip(reference, got))

    lo, hi = 0, 4
    assert not bad(lo) and bad(hi)
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if bad(mid) else (mid, hi)
    assert hi == 3 and pipeline.split(",")[hi - 1] == "planted-add-to-mul"
    err = capsys.readouterr().err
    assert "bisect: running #3 planted-add-to-mul" in err and "bisect: NOT running #4 dce" in err


def test_bisect_pipeline_finds_the_pass_and_the_rewrite():
    g = mini()
    reference = _outputs(g)

    def bad(out) -> bool:
        return any((a.view("u2") != b.view("u2")).any() for a, b in zip(reference, _outputs(out)))

    found = bisect_pipeline(g, bad, "canonicalize,cse,planted-add-to-mul,dce", ctx=PassContext(check_numerics=False))
    assert (found.index, found.pass_name) == (3, "planted-add-to-mul")
    assert str(found.record) == "add-to-mul at %a.sum: -> %a.sum.mul"
    assert bisect_pipeline(g, bad, "canonicalize,cse,dce") is None


def test_bisect_rewrites_applies_exactly_n_rewrites(src, capsys):
    assert run_cli(str(src), "-p", "canonicalize,cse,dce", "--bisect-limit", "1", "--bisect-rewrites") == 0
    captured = capsys.readouterr()
    assert captured.err == "bisect: rewrite 1 (canonicalize: fold-reshape-chain at %a.back: reads %x instead of " \
                           "%a.flat (erased))\n"
    assert "%a.flat" not in captured.out and "%a.back = reshape(%x)" in captured.out and "%a.dead" in captured.out
    result = run_pipeline(mini(), "canonicalize,cse,dce", bisect_limit=3, bisect_rewrites=True)
    assert [len(r.rewrites) for r in result.runs] == [2, 1, 0]
    assert [r.status for r in result.runs] == ["changed", "changed", "skipped"]
    result = run_pipeline(mini(), "canonicalize,cse,dce", bisect_limit=1, bisect_rewrites=True)
    assert result.runs[0].partial and [r.status for r in result.runs] == ["changed", "skipped", "skipped"]


# ---- reports ------------------------------------------------------------------------------------
def test_time_passes_table(src, capsys):
    assert run_cli(str(src), "--time-passes", "-o", os.devnull) == 0
    lines = capsys.readouterr().err.splitlines()
    assert lines[0] == "===- pass execution timing report -==="
    assert lines[1].split() == ["#", "pass", "status", "wall", "ms", "checks", "ms", "rewrites", "nodes",
                                "+add", "-rm", "~mod"]
    assert lines[2].split()[:3] == ["1", "canonicalize", "changed"] and lines[2].split()[5] == "2"
    assert lines[3].split()[:3] == ["2", "cse", "changed"] and lines[3].split()[5] == "1"
    assert lines[4].split()[:3] == ["3", "dce", "changed"] and lines[4].split()[-3:] == ["+0", "-1", "~0"]
    assert lines[5].split()[0] == "total" and lines[5].split()[-1] == "4"


def test_print_ir_after(src, capsys):
    assert run_cli(str(src), "--print-ir-after", "cse", "-o", os.devnull) == 0
    out = capsys.readouterr().out
    assert out.startswith("# -----// IR after #2 cse (changed) //----- #\ngraph @mini")
    assert out.count("IR after") == 1
    assert run_cli(str(src), "--print-ir-after-all", "-o", os.devnull) == 0
    out = capsys.readouterr().out
    assert [line.split()[5] for line in out.splitlines() if "IR after" in line] == ["canonicalize", "cse", "dce"]


def test_explain(src, capsys):
    assert run_cli(str(src), "--explain", "canonicalize", "--explain", "dce", "-o", os.devnull) == 0
    assert capsys.readouterr().err.splitlines() == [
        "explain: #1 canonicalize: changed, 2 rewrites",
        "  rewrote  fold-reshape-chain at %a.back: reads %x instead of %a.flat (erased)",
        "  rewrote  identity-reshape at %a.back: identity reshape -> %x",
        "explain: #3 dce: changed, 1 rewrites",
        "  rewrote  erase at %a.dead: unused mul",
    ]


def test_verify_each_off_still_rejects_an_invalid_result(src, capsys):
    assert run_cli(str(src), "-p", "planted-invalid", "--no-verify-each", "--no-check-numerics",
                   "--no-roundtrip-each", "--repro", os.devnull) == 4
    assert "the pipeline produced an invalid graph (rerun with --verify-each to find the pass)" in \
        capsys.readouterr().err


def test_input_graph_is_verified_first(tmp_path, capsys):
    bad = tmp_path / "bad.dsir"
    bad.write_text(CORE_GRAPH.replace("%a.out = cast(%a.proj) {to = bf16} : bf16[T,8]",
                                      "%a.out = cast(%a.proj) {to = bf16} : bf16[T,9]"))
    assert run_cli(str(bad)) == 2
    assert "result %a.out has type bf16[T,9] but cast gives bf16[T,8]" in capsys.readouterr().err


def test_print_ir_before_and_after_change(src, capsys):
    assert run_cli(str(src), "--print-ir-before", "cse", "-o", os.devnull) == 0
    out = capsys.readouterr().out
    assert out.startswith("# -----// IR before #2 cse //----- #\ngraph @mini") and out.count("// IR") == 1
    assert "%a.back" not in out                     # canonicalize (#1) already folded it: the graph cse receives
    assert run_cli(str(src), "-p", "canonicalize,cse,cse,dce", "--print-ir-after-change", "-o", os.devnull) == 0
    out = capsys.readouterr().out
    assert [line.split()[4] for line in out.splitlines() if "IR after" in line] == ["#1", "#2", "#4"]  # not #3
    assert run_cli(str(src), "-p", "canonicalize,cse,cse,dce", "--print-ir-after", "cse",
                   "--print-ir-after-change", "-o", os.devnull) == 0
    out = capsys.readouterr().out
    assert [line.split()[4] for line in out.splitlines() if "IR after" in line] == ["#2"]
    assert run_cli(str(src), "--print-ir-before", "csee", "-o", os.devnull) == 2
    assert "unknown pass 'csee'" in capsys.readouterr().err


def test_pass_stats(src, capsys):
    assert run_cli(str(src), "-p", "canonicalize,cse,dce,split-m-fanout", "--pass-stats", "-o", os.devnull) == 0
    err = capsys.readouterr().err.splitlines()
    assert err[0] == "===- pass statistics -==="
    assert err[1] == "  #1 canonicalize: 2 matched, 2 rewritten, 0 declined, 0 skipped"
    assert err[3] == "  #3 dce: 1 matched, 1 rewritten, 0 declined, 0 skipped"
    assert err[4].startswith("  #4 split-m-fanout: 0 matched, 0 rewritten, 0 declined, 1 skipped")
    assert err[5].startswith("         1 skipped: ")


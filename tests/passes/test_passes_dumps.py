"""--dump-dir: numbered snapshots + index.html, deterministic, self-reproducing, never outside the folder."""
from __future__ import annotations

import re
import shlex
import shutil
import subprocess
from pathlib import Path

import pytest

from dspark_cli.main import main
from dspark_ir import parse_file, print_graph

from .support import HERE

CASE = HERE / "canonicalize" / "default_pipeline.before.dsir"

pytestmark = pytest.mark.usefixtures("std_pipeline")


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def dump(src: Path, out: Path, *flags: str) -> int:
    return main(["opt", str(src), "--dump-dir", str(out), *flags])


def test_two_runs_give_identical_trees(tmp_path, monkeypatch):
    src = tmp_path / "in.dsir"
    shutil.copy(CASE, src)
    assert dump(src, tmp_path / "a", "--dump-dot") == 0
    monkeypatch.chdir(tmp_path)
    assert dump(Path("in.dsir"), Path("b"), "--dump-dot") == 0   # relative paths this time
    a, b = tree(tmp_path / "a"), tree(tmp_path / "b")
    assert list(a) == [".dspark-dump", "00_input.dot", "00_input.dsir", "01_canonicalize.dot", "01_canonicalize.dsir",
                       "02_cse.dot", "02_cse.dsir", "03_dce.dot", "03_dce.dsir", "index.html"]
    assert a == b
    assert dump(src, tmp_path / "a", "--dump-dot") == 0           # a rerun into the same folder
    assert tree(tmp_path / "a") == b
    for name, data in a.items():
        assert str(tmp_path).encode() not in data, f"{name} contains an absolute path"
        assert not re.search(rb"20[0-9]{2}-[0-9]{2}-[0-9]{2}", data), f"{name} contains a date"


def test_dump_changed_skips_no_op_passes(tmp_path, capsys):
    src = HERE / "dce" / "dead_chain.before.dsir"
    assert dump(src, tmp_path / "d", "--dump", "changed", "-o", str(tmp_path / "out.dsir")) == 0
    files = sorted(p.name for p in (tmp_path / "d").iterdir())
    assert files == [".dspark-dump", "00_input.dsir", "03_dce.dsir", "index.html"]
    page = (tmp_path / "d" / "index.html").read_text()
    assert '<tr class="row no-op"><td>1</td><td><a href="#p1">canonicalize</a>' in page
    assert '<tr class="row no-op"><td>2</td><td><a href="#p2">cse</a>' in page
    # a folder that had every snapshot loses the stale ones
    assert dump(src, tmp_path / "e") == 0
    assert len(list((tmp_path / "e").glob("*.dsir"))) == 4
    assert dump(src, tmp_path / "e", "--dump", "changed") == 0
    assert sorted(p.name for p in (tmp_path / "e").glob("*.dsir")) == ["00_input.dsir", "03_dce.dsir"]


def test_each_header_reproduces_its_snapshot(tmp_path, monkeypatch, capsys):
    d = tmp_path / "d"
    assert dump(CASE, d) == 0
    capsys.readouterr()
    monkeypatch.chdir(d)
    for snap in sorted(d.glob("0[1-9]_*.dsir")):
        text = snap.read_text()
        assert "# pipeline: canonicalize,cse,dce" in text and "# cache key: " in text
        command = re.search(r"^# reproduce \(in this folder\): (.*)$", text, re.M).group(1)
        assert main(shlex.split(command)[1:] + ["-o", "again.dsir"]) == 0
        assert print_graph(parse_file("again.dsir").entry) == print_graph(parse_file(snap).entry), snap.name


def test_refuses_to_write_outside_or_over_foreign_files(tmp_path, capsys):
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep")
    assert dump(CASE, foreign) == 2
    assert "not empty and not a dump folder" in capsys.readouterr().err
    assert sorted(p.name for p in foreign.iterdir()) == ["notes.txt"]
    d = tmp_path / "d"
    assert dump(CASE, d) == 0
    outside = tmp_path / "outside.dsir"
    outside.write_text("untouched")
    (d / "01_canonicalize.dsir").unlink()
    (d / "01_canonicalize.dsir").symlink_to(outside)
    assert dump(CASE, d) == 2
    assert "refusing to write outside the output directory (symlink)" in capsys.readouterr().err
    assert outside.read_text() == "untouched"


def test_failed_run_marks_the_index_failed_and_keeps_a_reproducer(tmp_path, capsys):
    d = tmp_path / "d"
    assert dump(CASE, d, "-p", "canonicalize,planted-crash,dce") == 3
    err = capsys.readouterr().err
    assert f"reproducer written to {d / 'repro.dsir'}" in err
    page = (d / "index.html").read_text()
    assert '<body data-status="failed">' in page and "pipeline finished" not in page
    assert "crashed: ZeroDivisionError" in page
    assert sorted(p.name for p in d.glob("*.dsir")) == ["00_input.dsir", "01_canonicalize.dsir",
                                                       "02_planted-crash.failed.dsir", "repro.dsir"]
    assert "# rerun: dspark opt repro.dsir -p planted-crash,dce" in (d / "repro.dsir").read_text()
    assert dump(CASE, d) == 0                                   # the next good run clears the failure
    assert not (d / "repro.dsir").exists() and '<body data-status="ok">' in (d / "index.html").read_text()


def test_invalid_graph_failure_dumps_the_bad_snapshot(tmp_path, capsys):
    d = tmp_path / "d"
    assert dump(HERE / "canonicalize" / "reshape_chain.before.dsir", d, "-p", "planted-invalid") == 4
    bad = (d / "01_planted-invalid.failed.dsir").read_text()
    assert "# FAILED: reshape_chain.before.dsir:8:3: node 'a.flat': pass 'planted-invalid' (#1) produced an " \
           "invalid graph" in bad
    assert "dspark: " + str(HERE) in capsys.readouterr().err                # stderr keeps the full path
    for name, data in tree(d).items():
        assert str(HERE).encode() not in data, f"{name} contains an absolute path"


@pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz `dot` not installed (apt-get install graphviz)")
def test_svg_snapshots(tmp_path):
    assert dump(CASE, tmp_path / "d", "--dump-svg", "--dump", "changed") == 0
    svg = (tmp_path / "d" / "02_cse.svg").read_text()
    assert "<svg" in svg and "p.n1" in svg


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(_chromium() is None, reason="headless Chromium not installed (CI: apt-get install chromium)")
def test_index_html_renders_in_headless_chromium(tmp_path):
    d = tmp_path / "d"
    assert dump(CASE, d) == 0
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
             f"--user-data-dir={tmp_path / 'profile'}", "--dump-dom"]
    done = subprocess.run([_chromium(), *flags, (d / "index.html").as_uri()], capture_output=True, text=True,
                          timeout=120)
    dom = done.stdout
    assert done.returncode == 0, done.stderr[-2000:]
    assert 'data-ready="yes"' in dom and "4 sections shown" in dom        # the page's script ran
    cse = dom[dom.index('<details id="p2"'):dom.index('<details id="p3"')]
    assert "merge at %p.n2: same as %p.n1" in cse
    # the side-by-side diff of cse: %p.n2 removed on the left, %p.out reads %p.n1 twice on the right
    removed = '<td class="del">  %p.n2 = rmsnorm(%x, %w) : bf16[4,8]</td><td class="ln"></td><td class="empty"></td>'
    assert removed in cse
    assert '<td class="ins">  %p.out = add(%p.n1, %p.n<mark>1</mark>) : bf16[4,8]</td>' in cse

"""`dspark dot` / `--dump-svg`: every layer graph renders to a non-empty SVG, clustered by block, changes marked;
a graphviz failure is one line and writes nothing."""
import os
import re
import shutil
import stat

import pytest

from dspark_cli.main import main
from dspark_ir import layers
from dspark_ir.dot import Changes, to_dot

needs_graphviz = pytest.mark.skipif(shutil.which("dot") is None, reason="graphviz `dot` not installed")
MATRIX = [(layer, config, tp) for layer in layers.LAYER_NAMES
          for config, tps in (("tiny", (1, 2, 4)), ("flash", (1, 4))) for tp in tps]


def render(tmp_path, *argv):
    out = tmp_path / "g.svg"
    assert main(["dot", *argv, "-o", str(out)]) == 0
    svg = out.read_text()
    assert "</svg>" in svg
    return svg


@needs_graphviz
def test_decode_swa_at_tp4_renders_clustered(tmp_path):
    """graphviz 2.43 used to abort on this one ("trouble in init_rank")."""
    svg = render(tmp_path, "decode-swa", "--tp", "4")
    assert "<title>cluster_" in svg and ">qkv</text>" in svg
    width = int(re.search(r'<svg width="(\d+)pt"', svg).group(1))
    assert width < 3000, width


@needs_graphviz
@pytest.mark.slow
@pytest.mark.parametrize("mode", ["all-off", "default"])
@pytest.mark.parametrize("layer,config,tp", MATRIX)
def test_every_layer_renders(tmp_path, layer, config, tp, mode):
    src = tmp_path / "in.dsir"
    pipeline = ["-p", ""] if mode == "all-off" else []
    assert main(["opt", layer, "--config", config, "--tp", str(tp), "--no-env", *pipeline, "-o", str(src)]) == 0
    render(tmp_path, str(src))


def test_changes_are_highlighted_and_removed_nodes_ghosted():
    g = layers.build("decode-swa", config="tiny", tp=1)
    before = g.clone()
    some = [n.name for n in g.topo_order()][:3]
    text = to_dot(g, Changes.of(before, added=[some[0]], removed=[some[1]], modified=[some[2]]))
    assert "added: " in text and "changed: " in text and "removed: " in text and "style=\"dashed,rounded\"" in text
    assert "1 added (green), 1 changed (pink), 1 removed (dashed)" in text
    assert "added: " not in to_dot(g)


def test_a_graphviz_failure_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys):
    fake = tmp_path / "bin" / "dot"
    fake.parent.mkdir()
    fake.write_text("#!/bin/sh\nif [ \"$1\" = -V ]; then echo 'dot - graphviz version 9.9.9 (0)' >&2; exit 0; fi\n"
                    "cat >/dev/null; echo '<svg>' ; echo 'Error: trouble in init_rank' >&2; exit 1\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    out = tmp_path / "g.svg"
    assert main(["dot", "decode-swa", "--tp", "4", "-o", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "graphviz 9.9.9 failed" in err and "trouble in init_rank" in err
    assert not out.exists()
    d = tmp_path / "d"
    assert main(["opt", "decode-swa", "--tp", "4", "-p", "cse", "--dump-dir", str(d), "--dump-svg", "-o",
                 str(tmp_path / "o.dsir")]) == 0
    assert not list(d.glob("*.svg")) and "not written" in capsys.readouterr().err
    assert ".svg" not in (d / "index.html").read_text()


@needs_graphviz
@pytest.mark.slow
def test_readme_dump_command_writes_no_empty_file(tmp_path):
    d = tmp_path / "d"
    assert main(["opt", "decode-csa", "--config", "flash", "--tp", "4", "--dump-dir", str(d), "--dump-svg",
                 "-o", str(tmp_path / "out.dsir")]) == 0
    files = sorted(d.iterdir())
    assert len([f for f in files if f.suffix == ".svg"]) == len([f for f in files if f.suffix == ".dsir"])
    assert all(f.stat().st_size > 0 for f in files)
    index = (d / "index.html").read_text()
    assert all(f.name in index for f in files if f.suffix == ".svg")


@needs_graphviz
def test_the_widest_layer_fits_a_screen_shape(tmp_path):
    """decode-csa at flash TP1 (71 nodes) was 6,400 pt wide: parameters are named in labels, blocks clustered."""
    svg = render(tmp_path, "decode-csa", "--config", "flash", "--tp", "1")
    width, height = map(int, re.search(r'<svg width="(\d+)pt" height="(\d+)pt"', svg).groups())
    assert width < 3200 and width < 2 * height, (width, height)
    assert "reads %" in svg

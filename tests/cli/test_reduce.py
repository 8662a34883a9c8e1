"""`dspark reduce`: a planted contract break shrinks to a few nodes; the written file reproduces the failure."""
import subprocess
import sys
from pathlib import Path

import pytest

from dspark_ir import layers, parse_file
from dspark_ir.reduce import NotFailing, reduce_graph, subgraph

ROOT = Path(__file__).parents[2]
PLUGIN = ROOT / "tests" / "cli" / "data" / "break_rmsnorm_plugin.py"


def dspark(*argv, cwd):
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "dspark_cli.main", *argv], capture_output=True, text=True, cwd=cwd,
                          env=env, timeout=3600)


def test_subgraph_cuts_values_into_parameters_and_verifies():
    g = layers.build("decode-swa", config="tiny", tp=1)
    node = g.nodes["attn.rms_norm"]
    h = subgraph(g, [node.name])
    assert h is None                                   # rms_norm's result is not returned: nothing left
    h = subgraph(g, [node.name], [node.result.name])
    assert [n.name for n in h.topo_order()] == ["attn.rms_norm"]
    assert {p.name for p in h.params} == {v.name for v in node.operands}
    assert "layer" not in h.attributes


def test_reduce_graph_keeps_what_the_predicate_needs():
    g = layers.build("decode-hca", config="tiny", tp=1)
    needs = {"attn.rms_norm", "hc.mix_x"}
    small = reduce_graph(g, lambda h: needs <= set(h.nodes))
    assert set(small.nodes) == needs
    with pytest.raises(NotFailing):
        reduce_graph(g, lambda h: False)


def test_reduce_a_planted_contract_break_tiny(tmp_path):
    done = dspark("reduce", "decode-csa", "--check", "contract", "-p", "test-break-rmsnorm", "--plugin", str(PLUGIN),
                  "-o", "small.dsir", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    small = parse_file(str(tmp_path / "small.dsir")).entry
    assert len(small) <= 10 and "attn.rms_norm" in small.nodes
    text = (tmp_path / "small.dsir").read_text()
    assert "# reproduce: dspark opt small.dsir" in text and "--check-numerics" in text
    again = dspark("opt", "small.dsir", "--no-env", "-p", "test-break-rmsnorm", "--plugin", str(PLUGIN),
                   "--check-numerics", "-o", "out.dsir", cwd=tmp_path)
    assert again.returncode != 0 and "broke its numeric contract" in again.stderr


@pytest.mark.slow
def test_reduce_a_planted_contract_break_in_decode_csa_flash_to_ten_nodes(tmp_path):
    done = dspark("reduce", "decode-csa", "--config", "flash", "--check", "contract", "-p", "test-break-rmsnorm",
                  "--plugin", str(PLUGIN), "-o", "small.dsir", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert len(parse_file(str(tmp_path / "small.dsir")).entry) <= 10


def test_reduce_says_when_nothing_fails(tmp_path):
    done = dspark("reduce", "decode-swa", "--check", "crash", "-p", "cse", "-o", "small.dsir", cwd=tmp_path)
    assert done.returncode == 2 and "nothing to reduce" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "small.dsir").exists()


def test_reduce_a_roofline_regression(tmp_path, capsys):
    from dspark_cli.main import main
    from passes import default_pipeline

    out = tmp_path / "small.dsir"
    assert main(["reduce", "decode-swa", "--check", "regression", "--against", str(default_pipeline()), "-p", "",
                 "--threshold", "1", "-o", str(out)]) == 0
    text = out.read_text()
    assert "still fails: regression" in text and "% slower" in text and "--check regression" in text
    assert len(parse_file(str(out)).entry) <= 3

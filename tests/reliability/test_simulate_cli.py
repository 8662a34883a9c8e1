"""`dspark simulate LAYER|FILE`: makespan or the deadlock report, exit 0 / 1, one-line errors with exit 2."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from dspark_cli.main import main
from dspark_ir import print_graph
from dspark_ir.layers import build

HERE = Path(__file__).parent
EXCHANGE = HERE / "graphs" / "tp_o_exchange.dsir"
ONE_GROUP = ["--cores-cube", "1", "--cores-vector", "2"]


def dspark(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_before_form_moe_deadlocks_with_the_report_and_exit_1(capsys):
    code, out, err = dspark(capsys, "simulate", "moe", *ONE_GROUP)
    assert code == 1 and err == ""
    lines = out.splitlines()
    assert lines[0] == ("dspark simulate moe · config tiny · ep 2 · 1 cube + 2 vector cores per rank · seed 0 · "
                        "pipeline none (the graph as given; -p default runs the default pipeline)")
    assert lines[1].startswith("deadlock at step ") and "wait-for cycle" in lines[2]
    assert "'moe.combine_wait' holds aic0 aiv0 aiv1, spinning since step 0" in out
    assert "held cores:" in out


def test_a_tp4_layer_completes_with_values_equal_to_the_interpreter(capsys):
    code, out, _ = dspark(capsys, "simulate", "decode-swa", "--tp", "4", *ONE_GROUP, "--seed", "3")
    assert code == 0, out
    assert "completed in " in out and " steps on 4 rank(s) (1 cube + 2 vector cores per rank, seed 3)" in out
    assert "values: outputs equal the interpreter's on 4 rank(s) (bitwise)" in out


def test_after_form_file_completes(tmp_path, capsys):
    from tests.reliability.test_simulate_moe import after_form

    path = tmp_path / "moe_after.dsir"
    path.write_text(print_graph(after_form(build("moe", "tiny", layer_id=1, ep=4))))
    code, out, _ = dspark(capsys, "simulate", str(path), *ONE_GROUP)
    assert code == 0, out
    assert "ep 4" in out.splitlines()[0] and "values: outputs equal the interpreter's on 4 rank(s)" in out


def test_a_graph_file_without_golden_inputs_is_timed_only(tmp_path, capsys):
    code, out, _ = dspark(capsys, "simulate", str(EXCHANGE), *ONE_GROUP)
    assert code == 0 and "completed in 16 steps on 4 rank(s)" in out and "values: not computed" in out
    bad = tmp_path / "unanchored.dsir"
    bad.write_text(EXCHANGE.read_text().replace(" deps(%o.a2a_notify)", ""))
    code, out, _ = dspark(capsys, "simulate", str(bad), *ONE_GROUP)
    assert code == 1 and "'o.a2a_wait' holds aic0 aiv0 aiv1, spinning" in out


def test_pipeline_and_signal_edges(capsys):
    from tests.reliability.test_simulate_moe import AFTER_FORMS

    code, out, _ = dspark(capsys, "simulate", "moe", *ONE_GROUP, "--no-values")
    assert code == 1 and "deadlock at step" in out
    if "pass" in AFTER_FORMS:       # the default pipeline has moe-handshake-deps
        code, out, _ = dspark(capsys, "simulate", "moe", "-p", "default", *ONE_GROUP)
        assert code == 0 and "pipeline default" in out.splitlines()[0], out
        assert "values: outputs equal the interpreter's on 2 rank(s)" in out
    # with the lowering's notifier → waiter edges on the signal windows every wait is anchored
    code, out, _ = dspark(capsys, "simulate", "moe", *ONE_GROUP, "--signal-edges")
    assert code == 0, out


@pytest.mark.parametrize("argv, message", [
    (["decode-swa", "--tp", "3"], "dspark: tp: 3 is not supported for config 'tiny' (choose 1, 2 or 4)"),
    (["decode-swa", "--ep", "2"], "dspark: ep: not a parameter of layer 'decode-swa' (parameters: token_capacity)"),
    (["moe", "--ep", "3"], "dspark: ep: 3 does not divide n_experts=8"),
    (["moe", "--cores-vector", "1"], "needs a core group (1 cube + 2 vector) but each rank has 24 cube and 1 "
                                     "vector cores"),
    (["decode-swa", "--cores-cube", "-1"], "dspark: --cores-cube/--cores-vector: core counts must be >= 0"),
    (["nope.dsir"], "dspark: "),
    (["moee"], "unknown layer 'moee' (did you mean 'moe'?)"),
])
def test_errors_are_one_line_exit_2(argv, message, capsys):
    code, out, err = dspark(capsys, "simulate", *argv)
    assert code == 2 and out == "" and len(err.splitlines()) == 1, err
    assert message in err


def test_console_script():
    done = subprocess.run([sys.executable, "-m", "dspark_cli.main", "simulate", "moe", "--ep", "2", *ONE_GROUP,
                           "--no-values"], capture_output=True, text=True)
    assert done.returncode == 1 and "wait-for cycle" in done.stdout and done.stderr == ""

"""Exit codes: 2 bad input, 3 internal error (an uncaught exception, a crashing pass), 4 a broken contract;
`--debug` (anywhere on the line) or DSPARK_DEBUG=1 adds the traceback, without it the error is one line."""
from __future__ import annotations

import pytest

from dspark_cli import main as cli
from dspark_cli.main import main

from .test_cli_basic import EXAMPLE


def test_bad_input_is_2(capsys):
    assert main(["opt", "no-such-layer"]) == 2
    assert main(["opt", str(EXAMPLE), "-p", "split-m-fanout{ways=0}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 2 and "Traceback" not in err


@pytest.fixture
def planted():
    import tests.passes.planted  # noqa: F401  (registers the planted passes)


def test_crashing_pass_is_3_and_debug_shows_the_traceback(planted, capsys):
    argv = ["opt", str(EXAMPLE), "-p", "planted-crash", "--repro", "/dev/null"]
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert "crashed: ZeroDivisionError" in err and "(--debug for the traceback)" in err and "Traceback" not in err
    assert main([*argv, "--debug"]) == 3
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "ZeroDivisionError" in err
    assert main(["--debug", *argv]) == 3                      # before the command too
    assert "Traceback (most recent call last)" in capsys.readouterr().err


def test_broken_contract_is_4(planted, tmp_path, capsys):
    from dspark_ir.text.printer import print_graph
    from tests.passes.support import mini

    src = tmp_path / "mini.dsir"
    src.write_text(print_graph(mini()))
    assert main(["opt", str(src), "-p", "planted-add-to-mul", "--check-numerics", "--repro", "/dev/null"]) == 4
    assert "broke its numeric contract" in capsys.readouterr().err
    assert main(["opt", str(src), "-p", "planted-invalid", "--repro", "/dev/null"]) == 4
    assert "produced an invalid graph" in capsys.readouterr().err


def test_internal_error_is_3_with_traceback_on_debug(monkeypatch, capsys):
    from dspark_cli.commands import verify

    def boom(args):
        raise KeyError("planted")

    monkeypatch.setattr(verify, "run", boom)
    assert main(["verify", str(EXAMPLE)]) == 3
    err = capsys.readouterr().err
    assert err == "dspark: internal error: KeyError: 'planted' (--debug for the traceback)\n"
    monkeypatch.setenv("DSPARK_DEBUG", "1")
    assert main(["verify", str(EXAMPLE)]) == 3
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and "in boom" in err


def test_exit_code_constants_are_distinct():
    codes = [cli.EXIT_CHECK_FAILED, cli.EXIT_BAD_INPUT, cli.EXIT_INTERNAL, cli.EXIT_CONTRACT]
    assert codes == [1, 2, 3, 4]

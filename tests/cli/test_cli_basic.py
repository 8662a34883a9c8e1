"""The `dspark` command: help everywhere, one-line errors with exit 2, atomic outputs."""
import subprocess
import sys
from pathlib import Path

import pytest

from dspark_cli.main import build_parser, main

ROOT = Path(__file__).parents[2]
EXAMPLE = ROOT / "examples" / "rmsnorm_matmul_rope.dsir"


def subcommands():
    parser = build_parser()
    action = next(a for a in parser._actions if a.dest == "command")
    return sorted(action.choices)


def test_console_script_help_and_version():
    done = subprocess.run([sys.executable, "-m", "dspark_cli.main", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.startswith("dspark ")
    done = subprocess.run([sys.executable, "-m", "dspark_cli.main", "--help"], capture_output=True, text=True)
    assert done.returncode == 0 and "COMMAND" in done.stdout


@pytest.mark.parametrize("command", subcommands())
def test_every_subcommand_has_help(command, capsys):
    with pytest.raises(SystemExit) as e:
        main([command, "--help"])
    assert e.value.code == 0
    assert "usage: dspark " + command in capsys.readouterr().out


def test_verify_ok(capsys):
    assert main(["verify", str(EXAMPLE)]) == 0
    assert "ok (@kv_side: 4 nodes)" in capsys.readouterr().out


def test_verify_bad_file_is_one_line_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.dsir"
    bad.write_text(EXAMPLE.read_text().replace("%qkv.kv_rope = rope(", "%qkv.kv_rope = rop("))
    assert main(["verify", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"dspark: {bad}:15:18: unknown op 'rop'")


def test_unknown_subcommand_and_bad_option_exit_2(capsys):
    with pytest.raises(SystemExit) as e:
        main(["frobnicate"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main(["verify", "--no-such-flag", str(EXAMPLE)])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err


def test_dot_writes_file_atomically(tmp_path):
    out = tmp_path / "g.dot"
    assert main(["dot", str(EXAMPLE), "-o", str(out)]) == 0
    text = out.read_text()
    assert 'digraph "kv_side"' in text and "qkv.kv_proj_matmul" in text
    assert "subgraph cluster_" in text and 'label="qkv"' in text
    assert [p.name for p in tmp_path.iterdir()] == ["g.dot"]


def test_dot_to_missing_directory_fails_cleanly(tmp_path, capsys):
    assert main(["dot", str(EXAMPLE), "-o", str(tmp_path / "nope" / "g.dot")]) == 2
    assert "directory does not exist" in capsys.readouterr().err


def test_show_file_is_deterministic(capsys):
    assert main(["show", str(EXAMPLE)]) == 0
    first = capsys.readouterr().out
    assert main(["show", str(EXAMPLE)]) == 0
    assert capsys.readouterr().out == first

"""Output safety: dumps, reports and lowered code are written atomically inside the chosen directory; paths with
`..`, absolute paths and symlinks that escape it are refused with a one-line located error; nothing is written
outside, no temp file is left behind, and a refused run leaves no partial output. Tested on
dspark_ir.fsutil.OutputDir directly and through `dspark lower -o DIR` and `dspark opt --dump-dir DIR`."""
from __future__ import annotations

import os
import shutil
import stat
from pathlib import Path

import pytest

from dspark_cli.main import main
from dspark_ir.fsutil import OutputDir, OutputError, write_atomic, write_file_atomic


def listing(root: Path) -> list[str]:
    """Every entry under root (symlinks not followed), relative."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture
def dirs(tmp_path):
    root, outside = tmp_path / "out", tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("keep me\n")
    return root, outside


def untouched(outside: Path) -> bool:
    return listing(outside) == ["secret"] and (outside / "secret").read_text() == "keep me\n"


# ---- OutputDir directly --------------------------------------------------------------------------------------------
def test_writes_inside_the_root_atomically(dirs):
    root, _ = dirs
    out = OutputDir(root)
    target = out.write_text("a/b/c.txt", "one\n")
    assert target == root / "a/b/c.txt" and target.read_text() == "one\n"
    out.write_bytes("a/b/c.txt", b"two\n")
    assert target.read_text() == "two\n"
    assert listing(root) == ["a", "a/b", "a/b/c.txt"]          # no temp files left


@pytest.mark.parametrize("bad", ["../x", "a/../../x", "a/../..", "..", "/tmp/dspark-abs-path-test"])
def test_dotdot_and_absolute_paths_are_refused(dirs, bad):
    root, outside = dirs
    out = OutputDir(root)
    with pytest.raises(OutputError, match="refusing to write outside the output directory"):
        out.write_text(bad, "x")
    assert listing(root) == [] and untouched(outside) and not Path("/tmp/dspark-abs-path-test").exists()


def test_a_symlinked_directory_escaping_the_root_is_refused(dirs):
    root, outside = dirs
    root.mkdir()
    (root / "kernels").symlink_to(outside, target_is_directory=True)
    with pytest.raises(OutputError) as e:
        OutputDir(root).write_text("kernels/k.py", "x")
    assert str(e.value) == f"{root / 'kernels/k.py'}: refusing to write outside the output directory (symlink)"
    assert untouched(outside)


@pytest.mark.parametrize("dangling", [False, True])
def test_a_symlinked_file_escaping_the_root_is_refused(dirs, dangling):
    root, outside = dirs
    root.mkdir()
    (root / "tasks.json").symlink_to(outside / ("nothing" if dangling else "secret"))
    with pytest.raises(OutputError, match="symlink"):
        OutputDir(root).write_text("tasks.json", "x")
    assert untouched(outside) and (root / "tasks.json").is_symlink()


def test_a_symlink_that_stays_inside_is_fine(dirs):
    root, outside = dirs
    (root / "real").mkdir(parents=True)
    (root / "alias").symlink_to(root / "real", target_is_directory=True)
    OutputDir(root).write_text("alias/f.txt", "x")
    assert (root / "real/f.txt").read_text() == "x" and untouched(outside)


def test_the_root_may_itself_be_a_symlink(dirs):
    root, outside = dirs
    root.symlink_to(outside, target_is_directory=True)
    OutputDir(root).write_text("new.txt", "x")
    assert (outside / "new.txt").read_text() == "x" and (outside / "secret").read_text() == "keep me\n"


@pytest.mark.parametrize("name", ["", ".", "nul\x00byte"])
def test_names_that_are_not_files_are_refused(dirs, name):
    root, _ = dirs
    out = OutputDir(root)
    with pytest.raises(OutputError):
        out.write_text(name, "x")
    assert listing(root) == []


def test_writing_over_a_directory_is_a_clear_error(dirs):
    root, _ = dirs
    (root / "sub").mkdir(parents=True)
    with pytest.raises(OutputError, match="sub"):
        OutputDir(root).write_text("sub", "x")
    assert listing(root) == ["sub"]


def test_root_errors_are_output_errors(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(OutputError, match="exists and is not a directory"):
        OutputDir(tmp_path / "file")
    with pytest.raises(OutputError, match="cannot create directory"):
        OutputDir(tmp_path / "file" / "below")


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp(dirs, monkeypatch):
    root, _ = dirs
    out = OutputDir(root)
    out.write_text("f.txt", "old\n")

    def broken(src, dst):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", broken)
    with pytest.raises(OutputError, match="No space left on device"):
        out.write_text("f.txt", "new\n")
    assert (root / "f.txt").read_text() == "old\n" and listing(root) == ["f.txt"]


def test_new_files_get_the_usual_permissions(dirs):
    """mkstemp creates 0600 files; the atomic write gives the final file the mode a plain open() would."""
    root, _ = dirs
    mask = os.umask(0o022)
    try:
        path = OutputDir(root).write_text("f.txt", "x")
        write_file_atomic(root / "g.txt", "y")
        write_atomic(root / "h.txt", b"z")
    finally:
        os.umask(mask)
    for name in ("f.txt", "g.txt", "h.txt"):
        assert stat.S_IMODE((root / name).stat().st_mode) == 0o644, name
    assert path.read_text() == "x"


# ---- through the CLI -------------------------------------------------------------------------------------------
def dspark(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_lower_writes_only_inside_dir(tmp_path, capsys):
    out = tmp_path / "lowered"
    code, stdout, err = dspark(capsys, "lower", "decode-swa", "-o", str(out))
    assert code == 0, err
    files = listing(out)
    assert {"orchestrate.py", "tasks.json", "tasks.dot", "kernels"} <= set(files)
    assert all(not Path(f).name.startswith(".") or f == ".dspark-output" for f in files)   # no temp files left
    assert all((out / f).resolve().is_relative_to(out.resolve()) for f in files)
    assert listing(tmp_path) == ["lowered"] + [f"lowered/{f}" for f in files]        # no sibling left either


@pytest.mark.parametrize("plant", ["kernels", "tasks.json", "orchestrate.py"])
def test_lower_refuses_a_directory_it_did_not_write_and_writes_nothing(tmp_path, capsys, plant):
    out, outside = tmp_path / "lowered", tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("keep me\n")
    out.mkdir()
    target = outside if plant == "kernels" else outside / "secret"
    (out / plant).symlink_to(target, target_is_directory=plant == "kernels")
    code, stdout, err = dspark(capsys, "lower", "decode-swa", "-o", str(out))
    assert code == 2 and stdout == "" and len(err.splitlines()) == 1
    assert "not empty and not a dspark output directory" in err
    assert untouched(outside)
    assert listing(out) == [plant], "a refused run leaves no partial output"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["lowered", "outside"]


@pytest.mark.parametrize("plant", ["kernels", "tasks.json", "orchestrate.py"])
def test_a_symlink_planted_in_an_earlier_output_is_replaced_never_followed(tmp_path, capsys, plant):
    out, outside = tmp_path / "lowered", tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("keep me\n")
    assert dspark(capsys, "lower", "decode-swa", "-o", str(out))[0] == 0
    victim = out / plant
    shutil.rmtree(victim) if victim.is_dir() else victim.unlink()
    target = outside if plant == "kernels" else outside / "secret"
    victim.symlink_to(target, target_is_directory=plant == "kernels")
    code, stdout, err = dspark(capsys, "lower", "decode-swa", "-o", str(out))
    assert code == 0, err
    assert untouched(outside) and not victim.is_symlink()


def test_lower_into_a_file_is_a_one_line_error(tmp_path, capsys):
    (tmp_path / "f").write_text("x")
    code, stdout, err = dspark(capsys, "lower", "decode-swa", "-o", str(tmp_path / "f"))
    assert code == 2 and err.strip() == f"dspark: {tmp_path / 'f'}: exists and is not a directory"


def test_opt_dumps_only_inside_dump_dir(tmp_path, capsys):
    dump = tmp_path / "dumps"
    code, stdout, err = dspark(capsys, "opt", "decode-swa", "-p", "canonicalize,cse", "--dump-dir", str(dump),
                               "-o", str(tmp_path / "opt.dsir"))
    assert code == 0, err
    files = listing(dump)
    assert "00_input.dsir" in files and "index.html" in files
    assert all(not Path(f).name.startswith(".") or f == ".dspark-dump" for f in files)
    assert (tmp_path / "opt.dsir").read_text().startswith("# dspark opt")


def test_opt_refuses_a_planted_symlink_in_the_dump_dir(tmp_path, capsys):
    dump, outside = tmp_path / "dumps", tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("keep me\n")
    dump.mkdir()
    (dump / ".dspark-dump").write_text("marker\n")
    (dump / "00_input.dsir").symlink_to(outside / "secret")
    code, stdout, err = dspark(capsys, "opt", "decode-swa", "-p", "cse", "--dump-dir", str(dump))
    assert code == 2 and len(err.splitlines()) == 1 and "refusing to write outside the output directory" in err
    assert untouched(outside)


def test_opt_dump_dir_that_is_not_a_dump_folder_is_refused(tmp_path, capsys):
    dump = tmp_path / "busy"
    dump.mkdir()
    (dump / "mine.txt").write_text("x")
    code, _, err = dspark(capsys, "opt", "decode-swa", "-p", "cse", "--dump-dir", str(dump))
    assert code == 2 and "not empty and not a dump folder" in err and listing(dump) == ["mine.txt"]

"""Outputs that are never half-written and never replace what is not a regular file.

`-o FILE` onto a FIFO, a character device or a symlink: written through (the FIFO and the device stay what
they are), followed (the link stays a link); a socket is refused. `lower` and `compile` produce DIR as a whole:
killed with SIGKILL at 10 points (the fsutil test hook $DSPARK_TEST_KILL_AFTER=N kills at the Nth output step,
a file written or the swap), DIR is the previous output or the new one, never a mix, and the next run leaves no
temp sibling behind. A refused path or a full disk leaves nothing."""
from __future__ import annotations

import errno
import hashlib
import os
import shutil
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import dspark_ir.fsutil as fsutil
from dspark_cli.main import main
from dspark_ir.fsutil import AtomicOutputDir, OutputError, write_file_atomic

ROOT = Path(__file__).resolve().parents[2]


def dspark(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# ---- -o FILE onto special files -------------------------------------------------------------------------------
def test_a_fifo_is_written_through_and_stays_a_fifo(tmp_path, capsys):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    received = []
    reader = threading.Thread(target=lambda: received.append(fifo.read_text()))
    reader.start()
    code, stdout, err = dspark(capsys, "show", "decode-swa", "-o", str(fifo))
    reader.join(timeout=30)
    assert code == 0, err
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert received and received[0].startswith("#") and "graph @" in received[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["pipe"]          # no temp file beside it


def test_a_symlink_is_followed_and_stays_a_link(tmp_path, capsys):
    target, link = tmp_path / "real.dsir", tmp_path / "link.dsir"
    target.write_text("old\n")
    link.symlink_to(target)
    code, _, err = dspark(capsys, "show", "decode-swa", "-o", str(link))
    assert code == 0, err
    assert link.is_symlink() and os.readlink(link) == str(target)
    assert "graph @" in target.read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.dsir", "real.dsir"]


def test_a_dangling_symlink_creates_its_target(tmp_path):
    link = tmp_path / "link.dsir"
    link.symlink_to(tmp_path / "new.dsir")
    write_file_atomic(link, "x\n")
    assert link.is_symlink() and (tmp_path / "new.dsir").read_text() == "x\n"


@pytest.mark.skipif(os.geteuid() != 0, reason="os.mknod of a character device needs root")
def test_a_character_device_is_written_through_and_stays_a_device(tmp_path, capsys):
    null = tmp_path / "null"
    os.mknod(null, 0o666 | stat.S_IFCHR, os.makedev(1, 3))        # a /dev/null of our own
    code, stdout, err = dspark(capsys, "show", "decode-swa", "-o", str(null))
    assert code == 0, err
    st = os.lstat(null)
    assert stat.S_ISCHR(st.st_mode) and st.st_rdev == os.makedev(1, 3)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["null"]


@pytest.mark.skipif(not stat.S_ISCHR(os.lstat(os.devnull).st_mode), reason="this machine's /dev/null is not a device")
def test_dev_null_stays_a_device():
    write_file_atomic(os.devnull, "discarded\n")
    assert stat.S_ISCHR(os.lstat(os.devnull).st_mode)


def test_a_socket_is_refused_with_one_line(tmp_path, capsys):
    path = tmp_path / "sock"
    server = socket.socket(socket.AF_UNIX)
    try:
        server.bind(str(path))
        code, stdout, err = dspark(capsys, "show", "decode-swa", "-o", str(path))
    finally:
        server.close()
    assert code == 2 and stdout == ""
    assert err == f"dspark: {path}: is a socket; refusing to replace it\n"
    assert stat.S_ISSOCK(os.lstat(path).st_mode)


# ---- directories produced whole -----------------------------------------------------------------------------------
def snapshot(root: Path) -> dict[str, str]:
    """Every file under root with its content hash (symlinks not followed)."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def consistent_lowering(root: Path) -> bool:
    """tasks.json names exactly the kernels present."""
    import json

    doc = json.loads((root / "tasks.json").read_text())
    wanted = {t["kernel"] for t in doc["tasks"] if t["kernel"]}
    return wanted == {p.relative_to(root).as_posix() for p in (root / "kernels").iterdir()}


def cli(cwd: Path, *argv: str, kill_after: int | str | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "DSPARK_CHECK_NUMERICS": "0"}
    env.pop(fsutil.KILL_AFTER, None)
    if kill_after is not None:
        env[fsutil.KILL_AFTER] = str(kill_after)
    return subprocess.run([sys.executable, "-m", "dspark_cli.main", *argv], cwd=cwd, env=env,
                          capture_output=True, text=True)


def kill_points(steps: int) -> list[int]:
    """10 kill points: 8 spread from the first output step on, then the swap and the step after it."""
    return sorted({round(1 + i * (steps - 3) / 7) for i in range(8)} | {steps - 1, steps})


@pytest.mark.parametrize("command, previous, new", [
    ("lower", ["decode-swa"], ["decode-hca"]),
    pytest.param("compile", ["decode-swa"], ["decode-hca"], marks=pytest.mark.slow),
])
def test_kill_9_leaves_the_previous_output_or_the_new_one(tmp_path, command, previous, new):
    out = tmp_path / "out"
    ref = tmp_path / "ref"
    ref.mkdir()
    assert cli(ref, command, *new, "-o", "out").returncode == 0
    new_files = snapshot(ref / "out")
    assert cli(tmp_path, command, *previous, "-o", "out").returncode == 0
    old_files = snapshot(out)
    pristine = tmp_path / "pristine"
    shutil.copytree(out, pristine, symlinks=True)
    # the output steps of a run over an earlier output: every file written, the swap(s), after the swap
    counted = cli(tmp_path, command, *new, "-o", "out", kill_after="count")
    steps = counted.stderr.count(f"{fsutil.KILL_AFTER}: step ")
    assert counted.returncode == 0 and steps >= len(new_files) + 2
    shutil.rmtree(out)
    shutil.copytree(pristine, out, symlinks=True)
    points = kill_points(steps)
    assert len(points) == 10
    outcomes = []
    for n in points:
        done = cli(tmp_path, command, *new, "-o", "out", kill_after=n)
        assert done.returncode == -9, (n, done.stderr)
        now = snapshot(out)
        assert now in (old_files, new_files), f"kill at step {n}: a mix of the previous and the new output"
        if command == "lower":
            assert consistent_lowering(out)
        elif now == new_files or now == old_files:
            assert consistent_lowering(out / "lowered")
        outcomes.append("new" if now == new_files else "previous")
        if now == new_files:          # back to the previous output for the next kill point
            shutil.rmtree(out)
            shutil.copytree(pristine, out, symlinks=True)
    print(f"{command}: kill points {points} (of {steps} steps): {outcomes}")
    assert "previous" in outcomes and outcomes[-1] == "new", outcomes   # the last point is after the swap
    # the next run cleans up whatever the killed runs left beside DIR
    assert cli(tmp_path, command, *new, "-o", "out").returncode == 0
    assert snapshot(out) == new_files
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out", "pristine", "ref"]


def test_a_full_disk_leaves_the_previous_output_and_nothing_else(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    assert dspark(capsys, "lower", "decode-swa", "-o", str(out))[0] == 0
    before = snapshot(out)
    calls = []
    real_replace = os.replace

    def full_after_three(src, dst):
        calls.append(dst)
        if len(calls) > 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", full_after_three)
    code, stdout, err = dspark(capsys, "lower", "decode-hca", "-o", str(out))
    assert code == 2 and len(err.splitlines()) == 1 and "No space left on device" in err
    assert f"{out}/" in err and ".dspark-tmp" not in err                # named by the final path
    assert snapshot(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_failed_compile_leaves_nothing(tmp_path, capsys, monkeypatch):
    """A compile that fails (here: the disk fills on its 5th file) leaves no directory, no sibling, no parent."""
    calls = []
    real_replace = os.replace

    def full_after_four(src, dst):
        calls.append(dst)
        if len(calls) > 4:
            raise OSError(errno.ENOSPC, "No space left on device")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", full_after_four)
    code, _, err = dspark(capsys, "compile", "decode-swa", "--no-check-numerics", "-o", str(tmp_path / "a/b/out"))
    assert code == 2 and "No space left on device" in err
    assert list(tmp_path.iterdir()) == []


def test_a_refused_directory_is_left_as_it_was(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "notes.txt").write_text("keep\n")
    code, _, err = dspark(capsys, "compile", "decode-swa", "--no-check-numerics", "-o", str(out))
    assert code == 2 and "not empty and not a dspark output directory" in err
    assert snapshot(out) == {"notes.txt": hashlib.sha256(b"keep\n").hexdigest()}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine"]


def test_stale_siblings_of_dead_runs_are_removed_live_ones_kept(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f".out{fsutil.TEMP}{dead.stdout.strip()}.abc"
    live = tmp_path / f".out{fsutil.TEMP}{os.getpid()}.xyz"
    for d in (stale, live):
        d.mkdir()
        (d / "half.py").write_text("x")
    with AtomicOutputDir(tmp_path / "out") as out:
        out.write_text("f.txt", "new\n")
    assert not stale.exists() and live.exists()
    assert (tmp_path / "out/f.txt").read_text() == "new\n"


def test_the_current_directory_is_never_swapped_away(tmp_path, monkeypatch):
    (tmp_path / fsutil.MARKER).write_text("x")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(OutputError, match="current directory"):
        AtomicOutputDir(".")

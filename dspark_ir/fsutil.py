"""Safe output: every artefact is written atomically inside a chosen root directory.

Files: a write goes to a temp file beside the target and is renamed over it, so readers never see a partial
file. What is not a regular file is never replaced (`check_replaceable`): a symlink is followed to its target,
a character device or a FIFO (`-o /dev/null`, a pipe) is written through, anything else is refused.

Directories (`AtomicOutputDir`): a command that writes a whole directory (`lower`, `compile`, `ab`) builds it
in a hidden sibling `.NAME.dspark-tmp.PID.*` and swaps it in whole when done (one rename(2), or an atomic
exchange with the previous output), so a kill at any point leaves the previous directory or the new one, never
a mix. A failure discards the sibling; siblings left by a killed run are removed by the next run.
"""
from __future__ import annotations

import ctypes
import errno
import os
import shutil
import signal
import stat
import sys
import tempfile
from pathlib import Path

from .errors import DsparkError

MARKER = ".dspark-output"   # inside every AtomicOutputDir: the next run may replace this directory
TEMP = ".dspark-tmp."       # hidden siblings: .NAME.dspark-tmp.PID.XXXX
KILL_AFTER = "DSPARK_TEST_KILL_AFTER"   # test hook: SIGKILL ourselves at the Nth output step (file write, swap)


class OutputError(DsparkError):
    """An output path is unsafe or cannot be written."""


class OutputDir:
    """A directory we may write into; paths that escape it (`..`, symlinks) are refused.

    `shown`: the directory named in error messages (an AtomicOutputDir writes into a hidden sibling)."""

    def __init__(self, root: str | os.PathLike, *, shown: str | os.PathLike | None = None):
        self.root = Path(root)
        self.shown = Path(shown) if shown is not None else self.root
        if self.root.exists() and not self.root.is_dir():
            raise OutputError("exists and is not a directory", str(self.shown))
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OutputError(f"cannot create directory: {e.strerror}", str(self.shown)) from None
        self.real_root = self.root.resolve()

    def path(self, relative: str) -> Path:
        if "\x00" in str(relative):
            raise OutputError("a file name cannot contain a NUL byte", repr(str(relative)))
        rel = Path(relative)
        if rel.is_absolute() or ".." in rel.parts:
            raise OutputError("refusing to write outside the output directory", relative)
        if not rel.parts:
            raise OutputError("not a file name", repr(str(relative)))
        target = self.root / rel
        resolved = target.resolve()
        if resolved != self.real_root and self.real_root not in resolved.parents:
            raise OutputError("refusing to write outside the output directory (symlink)", str(self.shown / rel))
        return target

    def write_text(self, relative: str, text: str) -> Path:
        return self.write_bytes(relative, text.encode())

    def write_bytes(self, relative: str, data: bytes) -> Path:
        target = self.path(relative)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(target, data, shown=self.shown / relative)
        except OSError as e:
            raise OutputError(f"cannot write: {e.strerror or e}", str(self.shown / relative)) from None
        _test_step()
        return target


class AtomicOutputDir(OutputDir):
    """A directory produced as a whole: written into a hidden sibling, swapped in by `commit()`.

        with AtomicOutputDir(path) as out:     # out.write_text(...) writes into the sibling
            ...                                # leaving the block normally swaps it in; an error discards it

    The target must be new, empty or a previous output (it holds MARKER): a directory holding other files is
    refused, not replaced."""

    def __init__(self, root: str | os.PathLike):
        self.final = Path(root)
        real = Path(os.path.abspath(self.final))
        real = real.resolve() if real.is_symlink() else real       # a symlinked root: swap its target
        if real.exists() and not real.is_dir():
            raise OutputError("exists and is not a directory", str(self.final))
        if real.parent == real:
            raise OutputError("cannot replace a file-system root", str(self.final))
        cwd = Path.cwd().resolve()
        if real.exists() and (cwd == real.resolve() or real.resolve() in cwd.parents):
            raise OutputError("is (or contains) the current directory; choose a new directory", str(self.final))
        if real.is_dir() and any(real.iterdir()) and not (real / MARKER).is_file():
            raise OutputError(f"not empty and not a dspark output directory (no {MARKER}); "
                              "choose a new or empty directory", str(self.final))
        self.real = real
        self.created: list[Path] = []        # parent directories this run made (removed again on failure)
        for parent in reversed(real.parents):
            if not parent.exists():
                try:
                    parent.mkdir()
                except OSError as e:
                    self._remove_created()
                    raise OutputError(f"cannot create directory: {e.strerror}", str(parent)) from None
                self.created.append(parent)
        remove_stale_siblings(real)
        try:
            stage = tempfile.mkdtemp(prefix=f".{real.name}{TEMP}{os.getpid()}.", dir=real.parent)
            os.chmod(stage, 0o777 & ~_umask())
        except OSError as e:
            self._remove_created()
            raise OutputError(f"cannot create a directory beside it: {e.strerror}", str(self.final)) from None
        self.stage = Path(stage)
        super().__init__(self.stage, shown=self.final)
        try:
            self.write_text(MARKER, "written by dspark: the next run replaces this whole directory\n")
        except BaseException:
            self.discard()
            raise

    def __enter__(self) -> "AtomicOutputDir":
        return self

    def __exit__(self, kind, value, tb) -> None:
        if kind is None:
            self.commit()
        else:
            self.discard()

    def commit(self) -> None:
        """Swap the finished directory in; the previous output (if any) is then removed."""
        _test_step()
        try:
            if self.real.exists():
                _exchange(self.stage, self.real)        # stage now holds the previous output
                _test_step()
                shutil.rmtree(self.stage, ignore_errors=True)
            else:
                os.rename(self.stage, self.real)
        except OSError as e:
            self.discard()
            raise OutputError(f"cannot replace the directory: {e.strerror or e}", str(self.final)) from None

    def discard(self) -> None:
        shutil.rmtree(self.stage, ignore_errors=True)
        self._remove_created()

    def _remove_created(self) -> None:
        for parent in reversed(self.created):
            try:
                parent.rmdir()
            except OSError:
                break


def write_tree(out_dir: str | os.PathLike | OutputDir, files: list[tuple[str, str]]) -> list[Path]:
    """Write (relative name, text) pairs: into `out_dir` if it is an OutputDir, else as one new directory that
    replaces `out_dir` whole (AtomicOutputDir). Every name is checked before anything is written."""
    if isinstance(out_dir, OutputDir):
        for relative, _ in files:
            out_dir.path(relative)
        return [out_dir.write_text(relative, text) for relative, text in files]
    with AtomicOutputDir(out_dir) as out:
        for relative, _ in files:
            out.path(relative)
        for relative, text in files:
            out.write_text(relative, text)
    return [out.final / relative for relative, _ in files]


def remove_stale_siblings(directory: Path) -> None:
    """Remove the temp siblings of `directory` that a killed run left (their process is gone)."""
    prefix = f".{directory.name}{TEMP}"
    missing = not directory.exists()
    try:
        entries = list(directory.parent.iterdir())
    except OSError:
        return
    for entry in entries:
        if not entry.name.startswith(prefix) or entry.is_symlink() or not entry.is_dir():
            continue
        pid = entry.name[len(prefix):].split(".", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            if missing and (entry / "old" / MARKER).is_file():   # killed inside _exchange's fallback
                os.rename(entry / "old", directory)
                missing = False
            shutil.rmtree(entry, ignore_errors=True)


def check_replaceable(target: Path, shown: str | os.PathLike | None = None) -> str:
    """How `target` (symlinks already followed) may be written: 'replace' (missing or a regular file) or
    'through' (a character device or a FIFO: opened and written, never replaced); refused otherwise."""
    try:
        mode = os.stat(target).st_mode
    except FileNotFoundError:
        return "replace"
    except OSError as e:
        raise OutputError(f"cannot write: {e.strerror}", str(shown or target)) from None
    if stat.S_ISREG(mode):
        return "replace"
    if stat.S_ISCHR(mode) or stat.S_ISFIFO(mode):
        return "through"
    kind = "a directory" if stat.S_ISDIR(mode) else "a block device" if stat.S_ISBLK(mode) else \
        "a socket" if stat.S_ISSOCK(mode) else "not a regular file"
    raise OutputError(f"is {kind}; refusing to replace it", str(shown or target))


def write_atomic(target: Path, data: bytes, *, shown: str | os.PathLike | None = None) -> None:
    """Write to a temp file beside `target`, then rename: readers never see a partial file. A symlink is
    followed (the link stays); a character device or a FIFO is written through; other special files are
    refused (check_replaceable)."""
    target = Path(os.path.realpath(target))
    if check_replaceable(target, shown) == "through":
        with open(target, "wb") as f:
            f.write(data)
        return
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    try:
        os.fchmod(fd, 0o666 & ~_umask())  # mkstemp makes 0600; outputs get the usual permissions
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, target)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_file_atomic(path: str | os.PathLike, text: str) -> None:
    """Atomic write of one file (for `-o FILE` outputs); special files as in write_atomic."""
    target = Path(path)
    if target.is_dir():
        raise OutputError("is a directory", str(target))
    if not Path(os.path.realpath(target)).parent.exists():
        raise OutputError("directory does not exist", str(target.parent))
    try:
        write_atomic(target, text.encode(), shown=target)
    except OSError as e:
        raise OutputError(f"cannot write: {e.strerror}", str(target)) from None


def _exchange(a: Path, b: Path) -> None:
    """Atomically swap two directories (renameat2 RENAME_EXCHANGE); without it, rename b aside, a in."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is not None:
        if renameat2(-100, os.fsencode(a), -100, os.fsencode(b), 2) == 0:   # AT_FDCWD, RENAME_EXCHANGE
            return
        err = ctypes.get_errno()
        if err not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
            raise OSError(err, os.strerror(err))
    aside = Path(tempfile.mkdtemp(prefix=f".{b.name}{TEMP}{os.getpid()}.", dir=b.parent))
    os.rename(b, aside / "old")
    os.rename(a, b)
    os.rename(aside, a)      # `a` (the caller removes it) now holds the previous output, one level down


def _test_step() -> None:
    """Test hook: with $DSPARK_TEST_KILL_AFTER=N, the Nth output step (a file written, the swap) kills us;
    with =count, each step is counted on stderr."""
    limit = os.environ.get(KILL_AFTER)
    if not limit:
        return
    global _steps
    _steps += 1
    if limit == "count":
        print(f"{KILL_AFTER}: step {_steps}", file=sys.stderr)
    elif _steps >= int(limit):
        os.kill(os.getpid(), signal.SIGKILL)


_steps = 0


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return pid != 0


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current

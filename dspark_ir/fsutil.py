"""Safe output: every artefact is written atomically inside a chosen root directory."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .errors import DsparkError


class OutputError(DsparkError):
    """An output path is unsafe or cannot be written."""


class OutputDir:
    """A directory we may write into; paths that escape it (`..`, symlinks) are refused."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)
        if self.root.exists() and not self.root.is_dir():
            raise OutputError("exists and is not a directory", str(self.root))
        try:
            self.root.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise OutputError(f"cannot create directory: {e.strerror}", str(self.root)) from None
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
            raise OutputError("refusing to write outside the output directory (symlink)", str(target))
        return target

    def write_text(self, relative: str, text: str) -> Path:
        return self.write_bytes(relative, text.encode())

    def write_bytes(self, relative: str, data: bytes) -> Path:
        target = self.path(relative)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(target, data)
        except OSError as e:
            raise OutputError(f"cannot write: {e.strerror or e}", str(target)) from None
        return target


def write_atomic(target: Path, data: bytes) -> None:
    """Write to a temp file beside `target`, then rename: readers never see a partial file."""
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
    """Atomic write of one file (for `-o FILE` outputs)."""
    target = Path(path)
    if target.is_dir():
        raise OutputError("is a directory", str(target))
    if not target.parent.exists():
        raise OutputError("directory does not exist", str(target.parent))
    try:
        write_atomic(target, text.encode())
    except OSError as e:
        raise OutputError(f"cannot write: {e.strerror}", str(target)) from None


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current

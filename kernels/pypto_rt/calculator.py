"""Build pypto's host "calculator" once, cache it, and load it into this process.

pypto 0.2.0 interprets a compiled graph on the host with a small C++ library
(``libtile_fwk_calculator.so``, a torch/ATen interpreter of the tile ops) that it ships
as CMake sources under ``pypto/lib/calculator``. Left alone, pypto rebuilds it into a
throw-away directory in every process that turns pass-verify on (25-31 s). Here it is
built once per (pypto, torch, C++ ABI) and kept in a cache directory:

    $DSPARK_CACHE_DIR/pypto-calculator/<key>/libtile_fwk_calculator.so
    (DSPARK_CACHE_DIR defaults to ~/.cache/dspark)

Publishing is atomic: the library is built in a temporary directory beside the cache
entry and renamed into place, under an exclusive ``flock`` on ``<key>.lock``. A
process that finds the entry complete never takes the lock. If two builders race
anyway (a file system without working locks), the loser's rename fails and it uses
the winner's entry.

The installed library has no RPATH: its dependencies (libtorch_cpu, libc10, pypto's
libc_sec) are found by soname among the libraries that ``import torch`` and
``import pypto`` already loaded, so an entry is not tied to one venv's location.

Only :func:`ensure_loaded` imports torch and pypto, so this module imports fast.
Command line (to pre-build, e.g. in CI before the tests): ``python -m kernels.pypto_rt.calculator``.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from kernels.pypto_rt.errors import PyptoError

LIB_NAME = "libtile_fwk_calculator.so"
META_NAME = "build.json"

_loaded_path: Path | None = None


@dataclass(frozen=True)
class BuildInfo:
    """Where the calculator lives and how long getting it took."""

    path: Path
    key: str
    built: bool  # True if this call compiled it, False if it came from the cache
    seconds: float


def cache_root() -> Path:
    """The cache directory for calculator builds (honours ``DSPARK_CACHE_DIR``)."""
    base = os.environ.get("DSPARK_CACHE_DIR")
    root = Path(base).expanduser() if base else Path.home() / ".cache" / "dspark"
    return root / "pypto-calculator"


def _pypto_dir() -> Path:
    return Path(str(metadata.distribution("pypto").locate_file("pypto"))).resolve()


def _source_digest(src_dir: Path) -> str:
    """A short digest of the calculator sources, so a patched wheel gets its own entry."""
    digest = hashlib.sha256()
    for path in sorted(p for p in src_dir.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(src_dir)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()[:10]


def cache_key(torch_version: str, cxx11_abi: int, pypto_version: str, src_digest: str) -> str:
    """The cache entry name: torch version and C++ ABI first, then what pins the sources."""
    return f"torch-{torch_version}-cxx11abi{cxx11_abi}-pypto-{pypto_version}-{src_digest}"


def _torch_facts() -> tuple[str, int, Path]:
    import torch  # noqa: PLC0415  (heavy; only the worker gets here)

    return str(torch.__version__), int(torch._C._GLIBCXX_USE_CXX11_ABI), Path(torch.__file__).parent


def _run(cmd: list[str], log: list[str]) -> None:
    log.append("$ " + " ".join(cmd))
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    log.append(proc.stdout)
    log.append(proc.stderr)
    if proc.returncode != 0:
        tail = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise PyptoError(f"calculator build failed ({Path(cmd[0]).name} exit {proc.returncode}): {tail[0]}",
                         log="\n".join(log))


def _compile(src_dir: Path, work: Path, torch_version: str, abi: int, torch_root: Path) -> Path:
    """Configure, build and install the calculator under ``work``; return the built library."""
    cmake = shutil.which("cmake")
    if cmake is None:
        raise PyptoError("calculator build needs cmake (>= 3.16), g++ (>= 9.4) and make on PATH")
    build, install = work / "build", work / "install"
    log: list[str] = []
    _run([cmake, "-S", str(src_dir), "-B", str(build), "-DCMAKE_BUILD_TYPE=Release",
          f"-DCMAKE_INSTALL_PREFIX={install}",
          f"-DPY3_MOD_TORCH_VERSION={torch_version}",
          f"-DPY3_MOD_TORCH_ROOT_PATH={torch_root}",
          f"-DPY3_MOD_TORCH_C_GLIBCXX_USE_CXX11_ABI={abi}"], log)
    _run([cmake, "--build", str(build), "-j", str(os.cpu_count() or 2)], log)
    _run([cmake, "--install", str(build), "--prefix", str(install)], log)
    lib = install / "lib" / LIB_NAME
    if not lib.is_file():
        raise PyptoError(f"calculator build produced no {LIB_NAME}", log="\n".join(log))
    return lib


@contextlib.contextmanager
def _exclusive(lock_path: Path):
    with open(lock_path, "a+") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _publish(lib: Path, root: Path, key: str, meta: dict) -> None:
    """Move a built library into ``root/key`` atomically; losing a race is fine."""
    stage = Path(tempfile.mkdtemp(prefix=f".{key}.stage-", dir=root))
    try:
        stage.chmod(0o755)  # mkdtemp makes it 0700; the cache may be shared
        shutil.copy2(lib, stage / LIB_NAME)
        (stage / META_NAME).write_text(json.dumps(meta, indent=1) + "\n")
        os.rename(stage, root / key)
    except OSError:
        if not (root / key / LIB_NAME).is_file():
            raise
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def build(force: bool = False) -> BuildInfo:
    """Return the cached calculator library, building and publishing it if needed."""
    start = time.perf_counter()
    torch_version, abi, torch_root = _torch_facts()
    src_dir = _pypto_dir() / "lib" / "calculator"
    key = cache_key(torch_version, abi, metadata.version("pypto"), _source_digest(src_dir))
    root = cache_root()
    entry = root / key
    if (entry / LIB_NAME).is_file() and not force:
        return BuildInfo(entry / LIB_NAME, key, False, time.perf_counter() - start)

    root.mkdir(parents=True, exist_ok=True)
    with _exclusive(root / f"{key}.lock"):
        if (entry / LIB_NAME).is_file() and not force:  # another process built it meanwhile
            return BuildInfo(entry / LIB_NAME, key, False, time.perf_counter() - start)
        if force:
            shutil.rmtree(entry, ignore_errors=True)
        with tempfile.TemporaryDirectory(prefix=f".{key}.build-", dir=root) as work:
            lib = _compile(src_dir, Path(work), torch_version, abi, torch_root)
            meta = {"key": key, "torch": torch_version, "cxx11_abi": abi,
                    "pypto": metadata.version("pypto"), "python": sys.version.split()[0],
                    "built_at": time.strftime("%Y-%m-%dT%H:%M:%S")}
            _publish(lib, root, key, meta)
    return BuildInfo(entry / LIB_NAME, key, True, time.perf_counter() - start)


def ensure_loaded() -> BuildInfo:
    """Build or fetch the calculator, ``dlopen`` it RTLD_GLOBAL and tell pypto it is loaded.

    Must run after ``import pypto`` (its libraries provide symbols the calculator needs).
    Idempotent within a process.
    """
    global _loaded_path
    from pypto._utils import BuildOnlineManager  # noqa: PLC0415

    info = build()
    if _loaded_path is None:
        try:
            ctypes.CDLL(str(info.path), mode=ctypes.RTLD_GLOBAL)
        except OSError as exc:
            raise PyptoError(f"cannot load the cached calculator {info.path}: {exc}; "
                             "delete that directory to rebuild it") from exc
        _loaded_path = info.path
    BuildOnlineManager().calculator_loaded = True  # pypto must not build its own copy
    return info


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    import pypto  # noqa: F401, PLC0415  (loads the libraries the calculator links against)

    try:
        info = build(force="--force" in args)
    except PyptoError as err:
        print(f"pypto-calculator: {err}", file=sys.stderr)
        return 1
    state = "built" if info.built else "cached"
    print(f"pypto-calculator: {state} {info.path} ({info.seconds:.1f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""`dspark opt` command lines that reproduce a dump or a failure (shell-quoted, no absolute paths added)."""
from __future__ import annotations

import re
import shlex
from typing import Sequence

from .pipeline import Pipeline
from .registry import is_builtin


def opt_command(target: str, pipeline: Pipeline, *, rewrite_limit: int | None = None, check_numerics: bool = False,
                seed: int = 0, roundtrip: bool = False, verify_each: bool = True,
                plugins: Sequence[str] = ()) -> str:
    words = ["dspark", "opt", target, "-p", str(pipeline)]
    for module in plugin_modules(pipeline, plugins):
        words += ["--plugin", module]
    if rewrite_limit is not None:
        words += ["--bisect-limit", str(rewrite_limit), "--bisect-rewrites"]
    if not verify_each:
        words.append("--no-verify-each")
    if roundtrip:
        words.append("--roundtrip-each")
    if check_numerics:
        words += ["--check-numerics", "--seed", str(seed)]
    return " ".join(shlex.quote(w) for w in words)


def plugin_modules(pipeline: Pipeline, extra: Sequence[str] = ()) -> list[str]:
    """Modules to import so that every pass of `pipeline` is registered (passes outside this package)."""
    modules = list(extra)
    for p in pipeline:
        module = type(p).__module__
        if not is_builtin(type(p)) and module != "__main__" and module not in modules:
            modules.append(module)
    return modules


_PATH = re.compile(r"(?:[A-Za-z]:)?[\\/](?:[^\s:'\"\\/]+[\\/])+([^\s:'\"\\/]+)")


def scrub_paths(text: str) -> str:
    """Absolute paths reduced to their file names (for text written into dumps and reproducers)."""
    return _PATH.sub(r"\1", text)

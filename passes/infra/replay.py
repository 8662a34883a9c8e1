"""`dspark opt` command lines that reproduce a dump or a failure (shell-quoted, no absolute paths added)."""
from __future__ import annotations

import re
from typing import Sequence

from dspark_ir.commandline import CommandLine

from .pipeline import Pipeline
from .registry import is_builtin


def opt_command(target: str, pipeline: Pipeline, *, rewrite_limit: int | None = None, check_numerics: bool = False,
                seed: int = 0, roundtrip: bool = False, verify_each: bool = True,
                plugins: Sequence[str] = ()) -> str:
    line = CommandLine("opt", target).option("-p", str(pipeline))
    line.repeated("--plugin", plugin_modules(pipeline, plugins))
    if rewrite_limit is not None:
        line.option("--bisect-limit", rewrite_limit).add("--bisect-rewrites")
    line.flag("--no-verify-each", not verify_each).flag("--roundtrip-each", roundtrip)
    if check_numerics:
        line.add("--check-numerics").option("--seed", seed)
    return str(line)


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

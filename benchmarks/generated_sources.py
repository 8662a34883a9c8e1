"""Hash every generated artefact of the lowering: kernel sources and orchestrate.py of every layer.

A refactor of the compiler must leave what it generates byte-identical. This script lowers every layer
(tiny and flash configs, each TP the config supports, the default pipeline and no pass) through the
`dspark lower` command line (the interface that survives a refactor) and writes one line per generated
file: `sha256  <case>/<path>`. `--check FILE` compares with a manifest written earlier and names every
file that differs, appeared or disappeared.

    python benchmarks/generated_sources.py --write tests/lowering/generated_sources.sha256
    python benchmarks/generated_sources.py --check tests/lowering/generated_sources.sha256
"""
from __future__ import annotations

import argparse
import hashlib
import os
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

LAYERS = ("decode-swa", "decode-csa", "decode-hca", "moe")
TPS = {"tiny": (1, 2, 4), "flash": (1, 4)}
PIPELINES = {"default": "default", "all-off": ""}
HASHED = ("orchestrate.py", "kernels")
REPO = Path(__file__).resolve().parent.parent


def cases() -> list[tuple[str, str, int, str]]:
    return [(layer, config, tp, pipe) for config, tps in TPS.items() for tp in tps
            for layer in LAYERS for pipe in PIPELINES]


def case_name(layer: str, config: str, tp: int, pipe: str) -> str:
    return f"{layer}.{config}.tp{tp}.{pipe}"


def lower(case: tuple[str, str, int, str], root: Path) -> dict[str, str]:
    layer, config, tp, pipe = case
    out = root / case_name(*case)
    # a relative output directory: the files' "Reproduce:" headers then name the same path in every run
    argv = [sys.executable, "-m", "dspark_cli.main", "lower", layer, "--config", config, "--tp", str(tp),
            "-o", out.name]
    if PIPELINES[pipe]:
        argv += ["-p", PIPELINES[pipe]]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=root, env=_env())
    if done.returncode != 0:
        raise SystemExit(f"generated_sources: {' '.join(argv[2:])} failed: {done.stderr.strip()}")
    hashes = {}
    for path in sorted(out.rglob("*")):
        rel = path.relative_to(out)
        if path.is_file() and rel.parts[0] in HASHED:
            hashes[f"{out.name}/{rel.as_posix()}"] = hashlib.sha256(path.read_bytes()).hexdigest()
    return hashes


def _env() -> dict[str, str]:
    """The environment, with the repository importable from the temporary working directory."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH", "")]))
    env.pop("DSPARK_DISABLE_PASSES", None)
    return env


def manifest(keep: Path | None = None) -> dict[str, str]:
    """Lower every case and hash its files; `keep`: lower into that directory and leave the files there."""
    with tempfile.TemporaryDirectory(prefix="dspark-sources-") as tmp:
        root = keep or Path(tmp)
        root.mkdir(parents=True, exist_ok=True)
        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            parts = list(pool.map(lambda c: lower(c, root), cases()))
    merged: dict[str, str] = {}
    for part in parts:
        merged.update(part)
    return dict(sorted(merged.items()))


def read(path: Path) -> dict[str, str]:
    entries = {}
    for line in path.read_text().splitlines():
        digest, _, name = line.partition("  ")
        entries[name] = digest
    return entries


def compare(expected: dict[str, str], actual: dict[str, str]) -> list[str]:
    problems = [f"changed: {n}" for n in expected if n in actual and actual[n] != expected[n]]
    problems += [f"missing: {n}" for n in expected if n not in actual]
    problems += [f"new: {n}" for n in actual if n not in expected]
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", type=Path, metavar="FILE")
    mode.add_argument("--check", type=Path, metavar="FILE")
    parser.add_argument("--keep", type=Path, metavar="DIR", help="lower into DIR and keep the files (to diff)")
    args = parser.parse_args(argv)
    actual = manifest(args.keep)
    if args.write:
        args.write.write_text("".join(f"{d}  {n}\n" for n, d in actual.items()))
        print(f"generated_sources: {len(actual)} files from {len(cases())} lowerings -> {args.write}")
        return 0
    problems = compare(read(args.check), actual)
    for line in problems:
        print(line)
    print(f"generated_sources: {len(actual)} files from {len(cases())} lowerings, "
          f"{len(problems)} differences")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

"""Helpers shared by subcommands: load a graph from a file or a layer name, write outputs."""
from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from dspark_ir.errors import DsparkError

if TYPE_CHECKING:
    from dspark_ir import Graph


def add_target_arguments(p: argparse.ArgumentParser, what: str = "FILE|LAYER") -> None:
    p.add_argument("target", metavar=what, help="a .dsir file, or a layer name (see `dspark list`)")
    add_layer_arguments(p)


def add_layer_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="tiny", help="model config for a layer name (default: tiny)")
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel size (1 or 4; default: the config's)")
    p.add_argument("--batch", type=int, default=None, help="decode requests per rank (default: the config's)")
    p.add_argument("--seq", type=int, default=None, help="tokens per request S (default: the config's)")


def add_executor_arguments(p: argparse.ArgumentParser) -> None:
    """Where pypto's cost model runs (perf/executors.py) and where its answers are cached (perf/costs.py)."""
    g = p.add_argument_group("kernel simulations")
    g.add_argument("--executor", choices=("local", "dask"), default=None,
                   help="local: pypto worker processes on this machine; dask: a Dask cluster (default: dask when "
                        "--scheduler or DSPARK_SCHEDULER is given, else local)")
    g.add_argument("--scheduler", default=None, metavar="tcp://HOST:PORT",
                   help="the Dask scheduler (default: $DSPARK_SCHEDULER)")
    g.add_argument("--workers", type=int, default=2, help="local pypto worker processes (default 2)")
    g.add_argument("--timeout", type=float, default=1800.0, help="seconds per kernel simulation (default 1800)")
    g.add_argument("--cost-cache", default=None, metavar="DIR",
                   help="cost-model cache directory, may be shared by several machines "
                        "(default: $DSPARK_CACHE_DIR/perf-costs, DSPARK_CACHE_DIR defaulting to ~/.cache/dspark)")


def add_progress_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-progress", action="store_true",
                   help="no progress bar (it goes to stderr, and only when stderr is a terminal)")


def progress_bars(args: argparse.Namespace, unit: str):
    """A factory `total -> tqdm bar` on stderr, or None with --no-progress, when stderr is not a terminal or
    without tqdm (an optional dependency)."""
    if getattr(args, "no_progress", False) or not sys.stderr.isatty():
        return None
    try:
        from tqdm import tqdm
    except ImportError:
        return None
    return lambda total: tqdm(total=total, unit=unit, file=sys.stderr, dynamic_ncols=True)


def executor_from_args(args: argparse.Namespace):
    """The executor the flags of add_executor_arguments name (connects to a Dask scheduler)."""
    from perf.executors import make_executor

    if args.workers < 1:
        raise UsageError(f"--workers: must be at least 1, got {args.workers}")
    if args.timeout <= 0:
        raise UsageError(f"--timeout: must be positive, got {args.timeout:g}")
    return make_executor(args.executor, scheduler=args.scheduler, workers=args.workers, timeout=args.timeout)


def load_graph(args: argparse.Namespace) -> Graph:
    """A graph from a .dsir path (the entry graph) or a layer name built with --config/--tp."""
    from dspark_ir import parse_file

    target = args.target
    if target.endswith(".dsir") or Path(target).exists() or "/" in target:
        if getattr(args, "ep", None) is not None:
            raise UsageError("applies to a layer name, not a file", "--ep")
        return parse_file(target).entry
    from dspark_ir import layers

    ep = getattr(args, "ep", None)
    return layers.build(target, config=args.config, tp=args.tp, batch=getattr(args, "batch", None),
                        seq=getattr(args, "seq", None), **({} if ep is None else {"ep": ep}))


class CommandLine:
    """Options turned back into the command line that reproduces a run: the one place that writes the
    `Reproduce:` commands of generated files and reports. Each command adds the options that decide its
    output, in its own order; `str()` is the shell-quoted line.

        str(CommandLine("lower", "decode-swa").layer(args).option("-o", "out"))
        # 'dspark lower decode-swa --config tiny --tp 1 -o out'
    """

    def __init__(self, command: str, *words: str):
        self.words = ["dspark", command, *words]

    def add(self, *words: str) -> "CommandLine":
        self.words += words
        return self

    def option(self, flag: str, value: object) -> "CommandLine":
        """`flag value`, unless value is None."""
        return self if value is None else self.add(flag, str(value))

    def repeated(self, flag: str, values: Sequence[object]) -> "CommandLine":
        for value in values:
            self.option(flag, value)
        return self

    def flag(self, flag: str, on: bool) -> "CommandLine":
        return self.add(flag) if on else self

    def layer(self, args: argparse.Namespace, options: Sequence[str] = ("tp", "batch", "seq")) -> "CommandLine":
        """The layer options (add_layer_arguments) of a layer-name target: --config always, the others when given;
        nothing for a .dsir file."""
        if args.target.endswith(".dsir"):
            return self
        self.option("--config", args.config)
        for name in options:
            self.option(f"--{name}", getattr(args, name, None))
        return self

    def __str__(self) -> str:
        return " ".join(shlex.quote(w) for w in self.words)


def emit(text: str, out: str | None) -> None:
    """Print to stdout, or write atomically to `out`."""
    from dspark_ir.fsutil import write_file_atomic

    if out is None or out == "-":
        sys.stdout.write(text)
        return
    write_file_atomic(out, text)


class UsageError(DsparkError):
    """Bad combination of command-line options."""

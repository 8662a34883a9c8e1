"""Helpers shared by subcommands: load a graph from a file or a layer name, write outputs."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from dspark_ir import Graph, parse_file
from dspark_ir.errors import DsparkError
from dspark_ir.fsutil import write_file_atomic


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
    target = args.target
    if target.endswith(".dsir") or Path(target).exists() or "/" in target:
        if getattr(args, "ep", None) is not None:
            raise UsageError("applies to a layer name, not a file", "--ep")
        return parse_file(target).entry
    from dspark_ir import layers

    ep = getattr(args, "ep", None)
    return layers.build(target, config=args.config, tp=args.tp, batch=getattr(args, "batch", None),
                        seq=getattr(args, "seq", None), **({} if ep is None else {"ep": ep}))


def emit(text: str, out: str | None) -> None:
    """Print to stdout, or write atomically to `out`."""
    if out is None or out == "-":
        sys.stdout.write(text)
        return
    write_file_atomic(out, text)


class UsageError(DsparkError):
    """Bad combination of command-line options."""

"""Helpers shared by subcommands: load a graph from a file or a layer name, write outputs."""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

from dspark_ir.commandline import CommandLine  # noqa: F401  (the commands build their lines here)
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
    p.add_argument("--chunk", type=int, default=None, metavar="T",
                   help="prefill layers: tokens per rank of the prompt chunk (1 … 8192; default 512); at TP > 1 the "
                        "request's chunk is tp·T tokens, context-parallel")
    p.add_argument("--start", type=int, default=None,
                   help="prefill layers: the chunk's first position (earlier chunks in the caches; default 0)")
    p.add_argument("--context", default=None, metavar="N",
                   help="decode-csa / decode-hca: max_context, the bound on kv_seq_len (K = 1024: 8K, 128K); beyond "
                        "the cache capacity (flash 8K, tiny 256) the layer's caches grow to hold it")


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
    g.add_argument("--kernels-per-task", type=int, default=None, metavar="N",
                   help="dask: at most N short kernels run back to back in one Dask task (default 8; 1: a task "
                        "per kernel)")
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


def add_toggle_arguments(g) -> None:
    """The pass toggles every command that runs passes takes (opt, ab, estimate): the same names and meaning
    as PassContext's fields."""
    g.add_argument("--disable", action="append", default=[], metavar="NAME", help="remove a pass (repeatable, or a,b)")
    g.add_argument("--enable", action="append", default=[], metavar="NAME[{opts}]",
                   help="turn on a default-off pass, or append it (repeatable)")
    g.add_argument("--only", action="append", default=[], metavar="NAME", help="run only these passes (repeatable)")
    g.add_argument("--pass-option", action="append", default=[], metavar="NAME{k=v}",
                   help="set options of a pass wherever it runs, e.g. 'split-m-fanout{ways=8}' (repeatable)")
    g.add_argument("--plugin", action="append", default=[], metavar="MODULE|FILE.py",
                   help="import a Python module (or file) that registers extra passes (repeatable)")


def pass_options(args: argparse.Namespace) -> dict[str, dict]:
    """{pass: {option: raw value}} from the --pass-option flags."""
    from passes import parse_entries

    options: dict[str, dict] = {}
    for text in args.pass_option:
        for e in parse_entries(text, "--pass-option"):
            options.setdefault(e.name, {}).update(dict(e.options))
    return options


def toggle_words(args: argparse.Namespace) -> list[str]:
    """The toggle flags of add_toggle_arguments, as command-line words (for the Reproduce lines)."""
    words: list[str] = []
    for flag in ("plugin", "enable", "disable", "only", "pass_option"):
        for value in getattr(args, flag, ()):
            words += [f"--{flag.replace('_', '-')}", value]
    return words


def load_plugins(specs: Sequence[str]) -> None:
    for spec in specs:
        load_plugin(spec)


def load_plugin(spec: str) -> None:
    """Import a module that registers passes: a dotted name (looked up on sys.path, then in the current
    directory, like `python -m`) or a path to a .py file."""
    import importlib.util
    import sys

    try:
        if spec.endswith(".py") or os.sep in spec:
            loader = importlib.util.spec_from_file_location(os.path.basename(spec)[:-3], spec)
            if loader is None or not os.path.isfile(spec):
                raise ImportError(f"no such file: {spec}")
            module = importlib.util.module_from_spec(loader)
            sys.modules[loader.name] = module
            loader.loader.exec_module(module)
            return
        try:
            importlib.import_module(spec)
        except ImportError:
            if os.getcwd() in sys.path:
                raise
            sys.path.insert(0, os.getcwd())
            importlib.import_module(spec)
    except ImportError as e:
        raise UsageError(f"cannot import pass plugin '{spec}': {e}", "--plugin") from None


def executor_from_args(args: argparse.Namespace):
    """The executor the flags of add_executor_arguments name (connects to a Dask scheduler)."""
    from perf.executors import make_executor

    if args.workers < 1:
        raise UsageError(f"--workers: must be at least 1, got {args.workers}")
    if args.timeout <= 0:
        raise UsageError(f"--timeout: must be positive, got {args.timeout:g}")
    if args.kernels_per_task is not None and args.kernels_per_task < 1:
        raise UsageError(f"--kernels-per-task: must be at least 1, got {args.kernels_per_task}")
    extra = {} if args.kernels_per_task is None else {"kernels_per_task": args.kernels_per_task}
    return make_executor(args.executor, scheduler=args.scheduler, workers=args.workers, timeout=args.timeout,
                         **extra)


def is_graph_file(target: str) -> bool:
    """A target that names a .dsir file rather than a layer."""
    return target.endswith(".dsir") or Path(target).exists() or "/" in target


def load_graph(args: argparse.Namespace) -> Graph:
    """A graph from a .dsir path (the entry graph) or a layer name built with --config/--tp."""
    from dspark_ir import parse_file

    target = args.target
    if is_graph_file(target):
        for flag in ("ep", "context"):
            if getattr(args, flag, None) is not None:
                raise UsageError("applies to a layer name, not a file", f"--{flag}")
        return parse_file(target).entry
    from dspark_ir import layers

    ep = getattr(args, "ep", None)
    params = {} if ep is None else {"ep": ep}
    for name in ("chunk", "start"):
        value = getattr(args, name, None)
        if value is not None:
            if name not in layers.layer_params(target):
                raise UsageError(f"applies to the prefill layers only, not '{target}'", f"--{name}")
            params[name] = value
    if getattr(args, "context", None) is not None:
        from perf.sweep import parse_values

        if "max_context" not in layers.layer_params(target):
            raise UsageError(f"applies to decode-csa and decode-hca only, not '{target}'", "--context")
        values = parse_values(args.context, "--context")
        if len(values) != 1:
            raise UsageError(f"one value, got '{args.context}' (dspark sweep --context takes a list)", "--context")
        params["max_context"] = values[0]
    return layers.build(target, config=args.config, tp=args.tp, batch=getattr(args, "batch", None),
                        seq=getattr(args, "seq", None), **params)


NO_PASSES = "none (the graph as given; -p default runs the default pipeline)"


def versions() -> dict[str, str | None]:
    """The versions an output depends on (without importing pypto)."""
    import platform
    from importlib import metadata

    from dspark_ir import __version__

    def version(dist: str) -> str | None:
        try:
            return metadata.version(dist)
        except metadata.PackageNotFoundError:
            return None

    return {"dspark": __version__, "pypto": version("pypto"), "python": platform.python_version()}


def provenance(command: str, ctx=None, pipeline=None) -> dict:
    """The one provenance record every output carries (dump headers, tasks.json, report.json, ab.json, estimate
    JSON): the command that reproduces it, the pipeline that ran and the toggles that made it (flags and
    environment), and versions. `ctx` is the PassContext of the passes that ran, or None when no pass ran
    (`run`, `lower`, `simulate` without -p)."""
    record = {"command": command}
    if ctx is None:
        record.update({"pipeline": NO_PASSES, "pipeline_key": None, "environment": {}})
    else:
        record.update(ctx.provenance(pipeline))
    record["versions"] = versions()
    return record


def pipeline_provenance(command: str, pipeline: str | None) -> dict:
    """provenance() of a command whose -p (lower, run, simulate) runs `pipeline` ('default', a pipeline string,
    or None/''/'none' for no passes) under the current PassContext, as lowering.compile does."""
    if not pipeline or pipeline.strip() == "none":
        return provenance(command)
    from passes import PassContext

    return provenance(command, PassContext.current(), None if pipeline.strip() == "default" else pipeline)


def emit(text: str, out: str | None) -> None:
    """Print to stdout, or write atomically to `out`."""
    from dspark_ir.fsutil import write_file_atomic

    if out is None or out == "-":
        sys.stdout.write(text)
        return
    write_file_atomic(out, text)


class UsageError(DsparkError):
    """Bad combination of command-line options."""

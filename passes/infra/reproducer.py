"""The failure reproducer: when a pass fails, write the graph it received and the remaining pipeline.

    # dspark reproducer: pass 'x' (#2) crashed: ZeroDivisionError: division by zero
    # rerun: dspark opt repro.dsir -p 'x,dce' --check-numerics --seed 0
    graph @... (the input snapshot of the failing pass)

The file goes to `PassContext.repro` (CLI default: `repro.dsir` in the dump folder, else in a new temporary
directory; never over a file of the working directory). The rerun command is printed to stderr and stored on the error
(`error.rerun`).
"""
from __future__ import annotations

import os
import tempfile

from dspark_ir.errors import DsparkError
from dspark_ir.fsutil import OutputDir, OutputError, write_file_atomic
from dspark_ir.text.printer import print_graph

from .context import REPRO_TEMP
from .instruments import Instrument
from .replay import opt_command, scrub_paths


class Reproducer(Instrument):
    def fail(self, state, error, g):
        ctx = state.ctx
        before = state.before if error.index else None
        snapshot = before if before is not None else state.input
        index = error.index if before is not None else 1     # from the input: the whole pipeline reproduces it
        end = ctx.bisect_limit if ctx.bisect_limit is not None and not ctx.bisect_rewrites else None
        remaining = state.pipeline[index - 1:end]
        limit = None
        if ctx.bisect_rewrites and ctx.bisect_limit is not None:
            limit = ctx.bisect_limit - state.runs[index - 1].rewrites_before
        flags = dict(rewrite_limit=limit, check_numerics=ctx.numerics_on, seed=ctx.seed,
                     roundtrip=ctx.roundtrip_on, verify_each=ctx.verify_each, plugins=ctx.plugins)
        header = [f"dspark reproducer: {scrub_paths(str(error))}",
                  f"rerun: {opt_command('repro.dsir', remaining, **flags)}",
                  f"full pipeline: {state.pipeline}",
                  f"source: {ctx.source or 'python'}"]
        error.reproducer = print_graph(snapshot, header)
        path = ctx.repro_path
        if path is None:
            return
        try:
            if path == REPRO_TEMP:
                path = _new_temp_path()
            _write(ctx, path, error.reproducer)
        except DsparkError as e:  # never hide the pass's error behind this one
            print(f"dspark: could not write the reproducer: {e}", file=state.stderr)
            return
        error.rerun = command = opt_command(path, remaining, **flags)
        print(f"dspark: reproducer written to {path}; rerun: {command}", file=state.stderr)


def _new_temp_path() -> str:
    try:
        return os.path.join(tempfile.mkdtemp(prefix="dspark-repro-"), "repro.dsir")
    except OSError as e:
        raise OutputError(f"cannot create a temporary directory: {e.strerror}", tempfile.gettempdir()) from None


def _write(ctx, path: str, text: str) -> None:
    if ctx.dump_dir and os.path.dirname(os.path.normpath(path)) == os.path.normpath(ctx.dump_dir):
        OutputDir(ctx.dump_dir).write_text(os.path.basename(path), text)
        return
    write_file_atomic(path, text)

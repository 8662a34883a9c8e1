"""--dump-dir D: numbered snapshots and an index.html, written only inside D, byte-identical across runs.

    D/.dspark-dump            marker: D is a dump folder (its dump files are replaced by the next run)
    D/00_input.dsir           the input
    D/NN_<pass>.dsir          after pass application NN (every one, or with --dump changed only changes)
    D/NN_<pass>.dot / .svg    with --dump-dot / --dump-svg (SVG needs graphviz): the graph clustered by block, the
                              nodes the pass added, changed or removed (ghosts) highlighted; an SVG graphviz cannot
                              lay out is left out (one warning line on stderr), never written empty
    D/NN_<pass>.failed.dsir   the output of a pass that failed a check (when it can be printed)
    D/index.html              the trace page; its banner says ok / failed / incomplete
Each snapshot's header carries the pipeline, the cache key and the command that reproduces it from
00_input.dsir in the same folder. No timestamps or absolute paths are written.
"""
from __future__ import annotations

import re
from pathlib import Path

from dspark_ir.dot import Changes, RenderError, have_graphviz, render_svg, to_dot
from dspark_ir.fsutil import OutputDir, OutputError
from dspark_ir.text.printer import print_graph

from . import html
from .instruments import Instrument
from .replay import opt_command, scrub_paths

MARKER = ".dspark-dump"
MANAGED = re.compile(r"([0-9]{2,}_[A-Za-z0-9_.\-]+\.(dsir|dot|svg)|index\.html|repro\.dsir)\Z")


def prepare(path: str) -> OutputDir:
    """Check that `path` is new, empty or a previous dump folder; remove the previous dump's files."""
    root = Path(path)
    if root.is_dir() and any(root.iterdir()) and not (root / MARKER).is_file():
        raise OutputError(f"not empty and not a dump folder (no {MARKER}); choose a new or empty directory",
                          str(root))
    out = OutputDir(root)
    for f in sorted(root.iterdir()):
        if f.is_file() and not f.is_symlink() and MANAGED.match(f.name):
            f.unlink()
    out.write_text(MARKER, "dspark opt dump folder: the next run replaces its numbered files and index.html\n")
    return out


class DumpWriter(Instrument):
    def __init__(self, ctx):
        if ctx.dump_svg and not have_graphviz():
            raise OutputError("--dump-svg needs graphviz's `dot` on PATH (apt-get install graphviz)", ctx.dump_dir)
        self.out = prepare(ctx.dump_dir)
        self.uses_before = ctx.dump_dot or ctx.dump_svg      # the removed nodes are drawn as ghosts
        self.files: dict[int, list[str]] = {}

    def start(self, state, g):
        self.width = max(2, len(str(len(state.pipeline))))
        self.last = print_graph(g)
        self.texts: dict[int, tuple[str, str | None]] = {}
        self.input_files = self._write(state, self._stem(0, "input"), g, self._input_header(state))
        self._index(state, "running")

    def after_pass(self, state, run, before, g):
        text = print_graph(g)
        self.texts[run.index] = (self.last, text)
        self.last = text
        if state.ctx.dump == "all" or run.changed:
            changes = Changes.of(before, run.added, run.removed, run.modified)
            self.files[run.index] = self._write(state, self._stem(run.index, run.name), g, self._header(state, run),
                                                changes)
            run.snapshot = self.files[run.index][0]

    def fail(self, state, error, g):
        run = next((r for r in state.runs if r.status == "failed"), None)
        if run is not None:
            try:
                text = print_graph(g)
            except Exception:  # the failing graph may not even print (e.g. a cycle)
                text = None
            if text is not None:
                self.texts[run.index] = (self.last, text)
                header = self._header(state, run) + [f"FAILED: {scrub_paths(str(error))}"]
                self.files[run.index] = self._write(state, self._stem(run.index, run.name) + ".failed", g, header)
                run.snapshot = self.files[run.index][0]
        self._index(state, f"failed: {scrub_paths(str(error))}")

    def finish(self, state, result):
        self._index(state, "ok")

    # ---- files ------------------------------------------------------------------------------------
    def _stem(self, index: int, name: str) -> str:
        return f"{index:0{self.width}d}_{name}"

    def _write(self, state, stem: str, g, header: list[str], changes: Changes | None = None) -> list[str]:
        files = [stem + ".dsir"]
        self.out.write_text(files[0], print_graph(g, header))
        if state.ctx.dump_dot:
            files.append(stem + ".dot")
            self.out.write_text(files[-1], to_dot(g, changes))
        if state.ctx.dump_svg:
            try:
                svg = render_svg(g, changes)
            except RenderError as e:
                print(f"dspark: warning: {stem}.svg not written: {e}", file=state.stderr)
            else:
                files.append(stem + ".svg")
                self.out.write_text(files[-1], svg)
        return files

    def _common(self, state) -> list[str]:
        env = [f"environment: {k}={v}" for k, v in state.ctx.environment().items()]
        return [f"pipeline: {state.pipeline}", f"cache key: {state.pipeline.key}",
                f"source: {state.ctx.source or 'python'}", *env]

    def _input_header(self, state) -> list[str]:
        ctx = state.ctx
        made_by = opt_command(ctx.source or "INPUT", state.pipeline, plugins=ctx.plugins) + " --dump-dir DIR"
        if ctx.dump == "changed":
            made_by += " --dump changed"
        return [f"dspark opt dump {self._stem(0, 'input')} · the input graph"] + self._common(state) + \
               [f"this folder: {made_by}"]

    def _header(self, state, run) -> list[str]:
        ctx = state.ctx
        limit = run.rewrites_used if ctx.bisect_rewrites and ctx.bisect_limit is not None else None
        command = opt_command(self.input_files[0], state.pipeline[:run.index], rewrite_limit=limit,
                              plugins=ctx.plugins)
        title = (f"dspark opt dump {self._stem(run.index, run.name)} · after #{run.index} {run.spec} · "
                 f"{run.status} ({run.delta()}, {len(run.rewrites)} rewrites)")
        return [title] + self._common(state) + [f"reproduce (in this folder): {command}"]

    # ---- index.html -------------------------------------------------------------------------------
    def _index(self, state, status: str) -> None:
        n = len(state.input)
        rows = [html.Row(0, "input", "", "input", nodes=(n, n), files=self.input_files, after=self._input_text(state))]
        for r in state.runs:
            before, after = self.texts.get(r.index, (None, None))
            files = self.files.get(r.index, [])
            rows.append(html.Row(r.index, r.spec, str(r.pass_.contract), r.status, r.note,
                                 (len(r.added), len(r.removed), len(r.modified)), (r.nodes_before, r.nodes_after),
                                 [str(x) for x in r.rewrites], [str(s) for s in r.skips], files, before, after))
        ctx = state.ctx
        header = [("pipeline", str(state.pipeline)), ("cache key", state.pipeline.key),
                  ("source", ctx.source or "python"), ("dump", ctx.dump)]
        self.out.write_text("index.html", html.render(header, status, rows))

    def _input_text(self, state) -> str:
        return print_graph(state.input)

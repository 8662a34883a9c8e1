"""The compile driver: one call from a graph (or a layer name) to everything the lowering makes of it.

    c = compile("decode-swa", config="tiny", tp=1, pipeline="default", command="dspark lower ...")
    c.graph       the optimised graph (c.input: the graph given; c.passes: the pass manager's result or None)
    c.tg, c.lint  the task graph and its dependency lint
    c.templates   each task's pypto template (None: dummy or no template), resolved once; Task.template set
    c.sources     kernels/<kernel>.py and orchestrate.py by path, as `emit(c, out_dir)` writes them
    c.seconds     the time of each stage: passes, lowering (task graph + lint), codegen

The steps: verify the graph, run the pass pipeline (`pipeline`: None or "" = no passes, "default" = the context's
pipeline, i.e. the default pipeline unless `ctx` names one, else a pipeline string; `ctx`: the PassContext,
default the current one), build the task graph, lint it (`strict`: an error of the lint raises), resolve the
templates and generate the sources (`sources=False`: on first use of `c.sources`). Every command that compiles
(dspark compile, lower, simulate, the run backends) and perf (ab, bench, the cost cache, the layer program)
goes through here; `emit` only writes what a `Compiled` holds.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping

from dspark_ir.graph import Graph

from .build import build_task_graph
from .codegen import RUNTIME_SYMBOLS, Template, generate, kernel_file, template_of
from .emit import orchestrate_source
from .errors import LoweringError
from .lint import LintReport, lint
from .taskgraph import Task, TaskGraph

if TYPE_CHECKING:
    from passes import OptResult, PassContext


@dataclass
class Compiled:
    """What the driver made of one graph (see the module doc)."""

    tg: TaskGraph
    lint: LintReport
    templates: dict[int, Template | None]
    graph: Graph | None = None            # the optimised graph (None: compiled from a task graph)
    input: Graph | None = None            # the graph given to the driver
    passes: OptResult | None = None       # the pass manager's result; None when no pass ran
    runtime_symbols: tuple[str, ...] = RUNTIME_SYMBOLS
    command: str = ""                     # the command line that reproduces it (the files' Reproduce: line)
    seconds: dict[str, float] = field(default_factory=dict)
    _sources: dict[str, str] | None = field(default=None, repr=False)

    @property
    def sources(self) -> dict[str, str]:
        """kernels/<kernel>.py of every kernel task, then orchestrate.py: relative path → text."""
        return self._sources if self._sources is not None else self._generate()

    def _generate(self) -> dict[str, str]:
        out = {}
        for t in self.tg.kernels:
            template = self.templates[t.id]
            body = None if template is None else generate(t, template, self.runtime_symbols, self.tg.bodies)
            out[f"kernels/{t.kernel}.py"] = kernel_file(t, self.tg, body, self.command)
        out["orchestrate.py"] = orchestrate_source(self.tg, self.command)
        self._sources = out
        return out

    @property
    def pipeline_key(self) -> str | None:
        return None if self.passes is None else self.passes.cache_key

    @property
    def templated(self) -> list[Task]:
        """The kernel tasks with a pypto template."""
        return [t for t in self.tg.kernels if t.template]

    @property
    def untemplated_ops(self) -> list[str]:
        return sorted({t.op for t in self.tg.kernels if not t.template})


def compile(target: Graph | str, *, config: str = "tiny", tp: int | None = None, batch: int | None = None,
            seq: int | None = None, ep: int | None = None, params: Mapping[str, Any] | None = None,
            pipeline: str | None = None, ctx: PassContext | None = None, verify: bool = True, strict: bool = False,
            runtime_symbols: Iterable[str] = RUNTIME_SYMBOLS, command: str = "", sources: bool = True,
            clock: Callable[[], float] = time.perf_counter) -> Compiled:
    """Compile a graph, or the layer `target` names built at config/tp/batch/seq/ep and `params` (module doc)."""
    graph = target if isinstance(target, Graph) else _layer(target, config, tp, batch, seq, ep, params or {})
    if verify:
        from dspark_ir import verify as verify_graph

        verify_graph(graph)
    t0 = clock()
    passes = run_passes(graph, pipeline, ctx)
    optimised = graph if passes is None else passes.graph
    t1 = clock()
    tg = build_task_graph(optimised)
    report = lint(tg)
    if strict and not report.ok:
        raise LoweringError(f"the lowered deps fail the lint: {report.errors[0]}")
    t2 = clock()
    compiled = compile_task_graph(tg, lint_report=report, runtime_symbols=runtime_symbols, command=command)
    compiled.graph, compiled.input, compiled.passes = optimised, graph, passes
    if sources:
        compiled._generate()
    compiled.seconds = {"passes": t1 - t0, "lowering": t2 - t1, "codegen": clock() - t2}
    return compiled


def compile_task_graph(tg: TaskGraph, *, lint_report: LintReport | None = None,
                       runtime_symbols: Iterable[str] = RUNTIME_SYMBOLS, command: str = "") -> Compiled:
    """The driver's last steps on a task graph built elsewhere: the lint (unless given) and the templates."""
    templates = {t.id: None if t.is_dummy else template_of(t, tg) for t in tg.tasks}
    for t in tg.tasks:
        t.template = templates[t.id] is not None
    return Compiled(tg, lint_report if lint_report is not None else lint(tg), templates,
                    runtime_symbols=tuple(runtime_symbols), command=command)


def run_passes(graph: Graph, pipeline: str | None, ctx: PassContext | None = None) -> OptResult | None:
    """The pass manager's result of `pipeline` on `graph` (module doc), or None for no passes."""
    if not pipeline:
        return None
    from passes import run_pipeline

    return run_pipeline(graph, None if pipeline == "default" else pipeline, ctx=ctx)


def _layer(name: str, config: str, tp, batch, seq, ep, params: Mapping[str, Any]) -> Graph:
    from dspark_ir import layers

    return layers.build(name, config=config, tp=tp, batch=batch, seq=seq, **({} if ep is None else {"ep": ep}),
                        **params)

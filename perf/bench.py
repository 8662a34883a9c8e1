"""Compile-speed benchmark of our own pipeline: parse → passes → lowering → pypto source.

    results = run_bench(config="flash", repeat=3)      # one layer, the full model, the doubled model
    print(bench_table(results))

Each case starts from the graph's .dsir text (printed once, untimed) and times, best of `repeat` runs (CPU
seconds of this process by default, so other load on a shared machine does not count; `cpu=False` for wall;
the runs go round robin over the cases):
  parse     `parse_graph(text)` (the printer's layout read by dspark_ir/text/fastparse.py, else the lark grammar)
  then the stages of `lowering.compile` (its `seconds`):
  passes    the default pipeline (`ctx_factory` gives the PassContext; the CLI's default verifies once at the
            end, `--verify-each` after every pass)
  lowering  `build_task_graph` (buffers, views, hazards, deps, transitive reduction) and the dependency lint
  codegen   the templates and every kernel file + orchestrate.py (the pypto files `dspark lower` writes; a
            kernel the layers repeat is generated once per task graph and renamed, see lowering/codegen.py)
Cases: each attention layer kind alone, one decoder layer (CSA attention + MoE), the full model
(`perf.model.model_graph`: 43 decoder layers, attention + MoE each), the model twice over (86 layers) and the
prefill model (the same 43 layers as prefill-swa/csa/hca on a chunk of PREFILL_CHUNK tokens, + MoE on them).
The ratios (full / one decoder layer, doubled / full) are computed from the same run, and its cases take turns,
so machine load affects numerator and denominator alike.
"""
from __future__ import annotations

import gc
import time
from dataclasses import dataclass, field
from typing import Callable

STAGES = ("parse", "passes", "lowering", "codegen")
PREFILL_CHUNK = 512   # upstream PREFILL_SEQ: the prefill model's chunk (tokens per rank)


@dataclass
class BenchCase:
    name: str
    nodes: int
    tasks: int = 0
    kernels: int = 0
    seconds: dict[str, float] = field(default_factory=dict)   # best of the repeats, per stage
    runs: list[dict[str, float]] = field(default_factory=list)

    @property
    def total(self) -> float:
        return sum(self.seconds.get(s, 0.0) for s in STAGES)

    def to_json(self) -> dict:
        return {"name": self.name, "nodes": self.nodes, "tasks": self.tasks, "kernels": self.kernels,
                "seconds": dict(self.seconds), "total": self.total, "runs": self.runs}


def compile_once(text: str, ctx_factory: Callable[[], object] | None = None,
                 cpu: bool = False) -> tuple[dict[str, float], tuple]:
    """One pass through the pipeline from .dsir text; returns (stage seconds, (graph, task graph))."""
    from dspark_ir import parse_graph
    from lowering import compile
    from passes import PassContext

    clock = time.process_time if cpu else time.perf_counter
    t0 = clock()
    g = parse_graph(text)
    t1 = clock()
    ctx = ctx_factory() if ctx_factory is not None else PassContext(use_env=False)
    c = compile(g, pipeline="default", ctx=ctx, verify=False, clock=clock)
    return {"parse": t1 - t0, **c.seconds}, (c.graph, c.tg)


def bench_case(name: str, graph, repeat: int = 3, ctx_factory=None, cpu: bool = True) -> BenchCase:
    from dspark_ir import print_graph

    text = print_graph(graph)
    case = BenchCase(name, len(graph))
    for _ in range(max(1, repeat)):
        _run(case, text, ctx_factory, cpu)
    return _finished(case)


def _run(case: BenchCase, text: str, ctx_factory, cpu: bool) -> None:
    """One timed compile of the case (nothing of the previous one alive)."""
    gc.collect()
    times, (_g, tg) = compile_once(text, ctx_factory, cpu=cpu)
    case.runs.append(times)
    case.tasks, case.kernels = len(tg), len(tg.kernels)


def _finished(case: BenchCase) -> BenchCase:
    case.seconds = {s: min(r[s] for r in case.runs) for s in STAGES}
    return case


@dataclass
class BenchResult:
    config: str
    cases: list[BenchCase]
    clock: str = "CPU"
    target_model_s: float = 2.0
    target_doubling: float = 2.2

    def case(self, name: str) -> BenchCase:
        return next(c for c in self.cases if c.name == name)

    def ratios(self) -> dict[str, float]:
        names = {c.name for c in self.cases}
        out = {}
        if {"decoder layer", "model"} <= names:
            out["model / decoder layer"] = self.case("model").total / self.case("decoder layer").total
        if {"model", "model x2"} <= names:
            out["model x2 / model"] = self.case("model x2").total / self.case("model").total
        return out

    def verdicts(self) -> dict[str, str]:
        out = {}
        names = {c.name for c in self.cases}
        for model in ("model", "prefill model"):
            if model in names:
                t = self.case(model).total
                verdict = "met" if t < self.target_model_s else "NOT met"
                out[f"{model} < %.1f s" % self.target_model_s] = f"{verdict} ({t:.2f} s)"
        r = self.ratios().get("model x2 / model")
        if r is not None:
            verdict = "met" if r <= self.target_doubling else "NOT met"
            out["doubling ≤ %.1f×" % self.target_doubling] = f"{verdict} ({r:.2f}×)"
        return out

    def to_json(self) -> dict:
        return {"config": self.config, "clock": self.clock, "cases": [c.to_json() for c in self.cases],
                "ratios": self.ratios(), "verdicts": self.verdicts()}


def run_bench(config: str = "flash", *, repeat: int = 3, model: bool = True, doubled: bool = True,
              kinds: bool = True, prefill: bool = True, ctx_factory=None, cpu: bool = True,
              progress: Callable[[str], None] | None = None) -> BenchResult:
    from dspark_ir import layers, print_graph

    from .model import model_graph

    builds = []
    if kinds:
        builds += [(kind, lambda kind=kind: layers.build(kind, config=config))
                   for kind in ("decode-swa", "decode-hca", "decode-csa", "moe")]
    builds.append(("decoder layer", lambda: _decoder_layer(config)))
    if model:
        builds.append(("model", lambda: model_graph(config)))
        if doubled:
            builds.append(("model x2", lambda: model_graph(config, repeat=2)))
        if prefill:
            builds.append(("prefill model", lambda: model_graph(config, prefill=PREFILL_CHUNK)))
    cases, texts = [], []
    for name, build in builds:
        graph = build()
        cases.append(BenchCase(name, len(graph)))
        texts.append(print_graph(graph))
    for round_ in range(max(1, repeat)):       # round robin: a change in the machine's load hits every case
        for case, text in zip(cases, texts):
            if progress and round_ == 0:
                progress(case.name)
            _run(case, text, ctx_factory, cpu)
    return BenchResult(config, [_finished(c) for c in cases], clock="CPU" if cpu else "wall-clock")


def _decoder_layer(config: str):
    """One CSA decoder layer (attention + MoE), spliced like the model splices each of its layers."""
    return _single(config, "csa")


def _single(config: str, kind: str):
    from dspark_ir import layers as L
    from dspark_ir.graph import Graph

    from .model import SHARED_SYMBOLS, splice_layer

    att = L.build(f"decode-{kind}", config=config)
    moe = L.build("moe", config=config, layer_id=3)
    symbols = {k: v for k, v in att.symbols.items() if k in SHARED_SYMBOLS}
    ranks = max(int(att.attributes.get("ranks", 1)), int(moe.attributes.get("ranks", 1)))
    g = Graph(f"{config}_decoder_layer", symbols, {"config": config, "tp": att.attributes.get("tp"),
                                                   "ranks": ranks, "layer": "model", "layers": 1})
    shared: dict = {}
    x = splice_layer(g, att, "L0.", None, shared)
    x = splice_layer(g, moe, "L0.moe.", x, shared)
    g.returns.insert(0, x)
    g.set_returns(g.returns)
    return g


def bench_table(result: BenchResult) -> str:
    runs = len(result.cases[0].runs) if result.cases else 0
    lines = [f"Compile speed, config {result.config} ({result.clock} seconds, best of {runs} runs)", "",
             "| case | nodes | tasks | kernels | parse | passes | lowering | codegen | total |",
             "|---|---|---|---|---|---|---|---|---|"]
    for c in result.cases:
        s = c.seconds
        lines.append(f"| {c.name} | {c.nodes} | {c.tasks} | {c.kernels} | {s['parse']:.3f} | {s['passes']:.3f} | "
                     f"{s['lowering']:.3f} | {s['codegen']:.3f} | **{c.total:.3f}** |")
    ratios = result.ratios()
    if ratios:
        lines += ["", "| ratio (same run) | value |", "|---|---|"]
        lines += [f"| {k} | {v:.2f}× |" for k, v in ratios.items()]
    verdicts = result.verdicts()
    if verdicts:
        lines += ["", "| target | verdict |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in verdicts.items()]
    return "\n".join(lines) + "\n"

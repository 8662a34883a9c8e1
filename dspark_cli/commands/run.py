"""Run a layer on seeded golden inputs and compare every output with the independent golden.

Prints max abs / max rel error (|a−e| / max(|e|, 1)) per output with the documented tolerance
(goldens/tolerances.py; at TP > 1 the ranks' outputs are concatenated, as one layer output); exits 0 when every
output is within tolerance, 1 otherwise. Inputs, golden and comparison come from the runner (runner/): caches
and states are compared on the rows the step writes, the rest must be unchanged; then the sub-block checks
(runner.subblock_checks, on a reference-interpreter run of the graph) compare stages such as the Sinkhorn comb
with the golden stage on the same operands. Before
that verdict, a determinism line: bitwise across schedules, or not, naming every order-dependent accumulation
left in the task graph (atomic split-K); `--backend shuffled` also reruns 3 more shuffled schedules and says
"not bitwise across schedules" when their bits differ.
The target may also be a .dsir file of a layer graph (its attributes name the layer, config and tp).
`-p PIPELINE` runs a pass pipeline first (`default` = the default pipeline; `none` or omitted: no passes);
the backend executes the resulting graph.
"""
from __future__ import annotations

import argparse
import importlib
from typing import Any, Callable

from ..common import NO_PASSES, UsageError, add_progress_argument, add_target_arguments, load_graph, progress_bars

NAME = "run"
HELP = "run a layer against its golden and report errors"

# Backend name → "module:function" or a callable fn(graph, inputs) -> result, where inputs and result have the
# interpreter's form (a dict, or a list of dicts per rank). Extend this dict to add executors.
# The task-graph executors of lowering/ join when the run command is chosen (backends()); an entry set here first wins.
BACKENDS: dict[str, str | Callable[..., Any]] = {}


def backends() -> dict[str, str | Callable[..., Any]]:
    for name, fn in importlib.import_module("lowering.backends").BACKENDS.items():
        BACKENDS.setdefault(name, fn)
    return BACKENDS


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_target_arguments(p, "LAYER|FILE")
    p.add_argument("--seed", type=int, default=0, help="input seed (default: 0)")
    p.add_argument("--regime", default="default", help="input regime (default: default; see goldens/inputs.py)")
    p.add_argument("--backend", choices=sorted(backends()), default="numpy",
                   help="executor: numpy = the reference interpreter (default)")
    p.add_argument("-p", "--pipeline", default=None,
                   help="pass pipeline to run first: 'default' = the default pipeline, a pipeline string "
                        "(passes syntax), or 'none' (also: omitted) = no passes")
    p.add_argument("--ep", type=int, default=None,
                   help="expert-parallel ranks of the moe layer (default: the config's)")
    add_progress_argument(p)


def backend(name: str) -> Callable[..., Any]:
    fn = backends()[name]
    if isinstance(fn, str):
        module, _, attr = fn.partition(":")
        fn = getattr(importlib.import_module(module), attr)
    return fn


def run(args: argparse.Namespace) -> int:
    import runner
    from dspark_ir import verify

    g = _load(args)
    verify(g)
    if "layer" not in g.attributes:
        raise UsageError(f"graph '@{g.name}' is not a layer graph (no 'layer' attribute)")
    _check_regime(g, args.regime)
    inputs = runner.layer_inputs(g, args.seed, args.regime)
    golden = runner.golden_outputs(g, inputs)
    pipeline = _pipeline_name(args.pipeline)
    g = _apply_pipeline(g, pipeline)
    bars = progress_bars(args, "task") if args.backend == "pypto" else None    # the one backend over 10 s
    result = backend(args.backend)(g, inputs, **({"progress": bars} if bars else {}))
    a = g.attributes
    ep = f" · ep {a['ep']}" if "ep" in a else ""
    piped = f" · pipeline {pipeline}" if pipeline else f" · pipeline {NO_PASSES}"
    print(f"dspark run {a['layer']} · config {a['config']} · tp {a['tp']}{ep} · seed {args.seed} · "
          f"regime {args.regime}{piped} · backend {args.backend}")
    print(f"  {'output':<14} {'max abs':>10}  {'max rel':>10}  {'tolerance':<46} result")
    comparisons = runner.compare_outputs(g, result, golden, inputs)
    for c in comparisons:
        verdict = "ok (bitwise)" if c.bitwise else "ok" if c.ok else f"FAIL: {c.detail}"
        print(f"  {c.name:<14} {c.max_abs:>10.3g}  {c.max_rel:>10.3g}  {c.tolerance.describe():<46} {verdict}")
    stages = _subblocks(g, inputs)
    _determinism(g, inputs, result if args.backend == "shuffled" else None)
    failed = sum(not c.ok for c in comparisons)
    stages_failed = sum(not c.ok for c in stages)
    ranks = f" (all {a.get('ranks')} ranks)" if int(a.get("ranks", 1)) > 1 else ""
    verdict = "ok" if not failed and not stages_failed else "FAIL"
    print(f"{verdict}: {len(comparisons) - failed}/{len(comparisons)} outputs within tolerance{ranks}"
          + (f", {len(stages) - stages_failed}/{len(stages)} sub-blocks" if stages else ""))
    return 0 if verdict == "ok" else 1


def _subblocks(g, inputs) -> list:
    """The sub-block checks (runner.subblock_checks) on a reference-interpreter run of the graph: stages
    whose faults a layer-level tolerance cannot see. Prints the failing ones."""
    import runner
    from dspark_ir import interp

    stages = runner.subblock_checks(g, interp.run(g, inputs, keep=True))
    for c in stages:
        if not c.ok:
            print(f"  sub-block {c.name}: FAIL: {c.detail} (max abs {c.max_abs:.3g})")
    return stages


SHUFFLED_SCHEDULES = 4      # --backend shuffled: runs compared bit for bit (the first is the one reported above)


def _determinism(g, inputs, shuffled_result) -> None:
    """Name the order-dependent accumulations left in the task graph; with the shuffled backend, also compare
    the result bit for bit with further shuffled schedules."""
    import os

    import numpy as np

    from lowering import build_task_graph, run_shuffled
    from lowering.splitk import determinism, order_dependent

    tg = build_task_graph(g)
    print(f"determinism: {determinism(tg.tasks)}")
    if shuffled_result is None:
        return
    seed = int(os.environ.get("DSPARK_SHUFFLE_SEED", "0"))
    first = shuffled_result if isinstance(shuffled_result, list) else [shuffled_result]
    for s in range(seed + 1, seed + SHUFFLED_SCHEDULES):
        other = run_shuffled(tg, inputs, s)
        other = other if isinstance(other, list) else [other]
        differ = sorted({k for a, b in zip(first, other) for k in a
                         if not np.array_equal(np.asarray(a[k]), np.asarray(b[k]), equal_nan=True)})
        if differ:
            print(f"shuffled: not bitwise across schedules: shuffle seeds {seed} and {s} differ in "
                  f"{', '.join('%' + k for k in differ)}")
            return
    agreed = f"{SHUFFLED_SCHEDULES} shuffled schedules (seeds {seed}..{seed + SHUFFLED_SCHEDULES - 1})"
    if order_dependent(tg.tasks):
        print(f"shuffled: {agreed} happened to agree bit for bit; the accumulations above may still differ")
    else:
        print(f"shuffled: bitwise equal over {agreed}")


def _load(args: argparse.Namespace):
    if args.ep is None:
        return load_graph(args)
    target = args.target
    if target.endswith(".dsir") or "/" in target:
        raise UsageError("applies to a layer name, not a file", "--ep")
    from dspark_ir import layers

    return layers.build(target, config=args.config, tp=args.tp, batch=args.batch, seq=args.seq, ep=args.ep)


def _pipeline_name(pipeline: str | None) -> str | None:
    """None for no passes ('none', '' or omitted), else the pipeline text ('default' for the default one)."""
    if pipeline is None or pipeline.strip() in ("", "none"):
        return None
    return pipeline.strip()


def _apply_pipeline(g, pipeline: str | None):
    from lowering import run_passes

    result = run_passes(g, pipeline)
    return g if result is None else result.graph


def _check_regime(g, regime: str) -> None:
    import runner

    known = runner.regimes(g.attributes["layer"])
    if regime not in known:
        from dspark_ir.errors import did_you_mean

        raise UsageError(f"unknown regime '{regime}'{did_you_mean(regime, known)} (known: {', '.join(known)})")

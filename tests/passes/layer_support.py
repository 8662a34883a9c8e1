"""Helpers for DSpark pass tests on layer graphs: run one pass with its numeric contract checked, compare the
optimised graph with the golden, and run `dspark opt <layer> --config flash --tp 4` (graph-level only)."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import runner
from dspark_cli.main import main
from dspark_ir import Graph, layers, parse_file
from dspark_ir.interp import run
from passes import OptResult, PassContext, run_pipeline

SEEDS = (0, 1, 2)
ATTENTION = ("decode-swa", "decode-hca", "decode-csa")


@lru_cache(maxsize=None)
def tiny(layer: str, tp: int | None = None, batch: int | None = None) -> Graph:
    return layers.build(layer, config="tiny", tp=tp, batch=batch)


def optimise(g: Graph, pipeline: str, seed: int = 0, numerics: bool = True) -> OptResult:
    """Run `pipeline` on `g` with the verifier, the round trip and (by default) the numeric contract on."""
    ctx = PassContext(use_env=False, check_numerics=numerics, roundtrip_each=True, verify_each=True, seed=seed)
    return run_pipeline(g, pipeline, ctx=ctx)


def golden_mismatches(g: Graph, seed: int) -> list[str]:
    """Run `g` (a layer graph, possibly optimised) in the interpreter on the golden inputs of `seed` and list
    the outputs outside their documented tolerance (goldens/tolerances.py)."""
    inputs = runner.layer_inputs(g, seed)
    comparisons = runner.compare_outputs(g, run(g, inputs), runner.golden_outputs(g, inputs))
    return [f"{c.name}: {c.detail}" for c in comparisons if not c.ok]


def flash_opt(layer: str, tmp_path: Path, *flags: str) -> Graph:
    """`dspark opt LAYER --config flash --tp 4` (the default pipeline, no flash numerics) → the output graph."""
    out = tmp_path / f"{layer}.flash.dsir"
    assert main(["opt", layer, "--config", "flash", "--tp", "4", "--no-check-numerics", "-o", str(out),
                 *flags]) == 0
    return parse_file(str(out)).entry


def statuses(result: OptResult) -> dict[str, str]:
    return {r.name: r.status for r in result.runs}


def skips(result: OptResult, name: str) -> dict[str, str]:
    """node name → Skip reason of the run of pass `name` (a candidate that did not fire, or why a rewritten node
    went no further)."""
    run_ = next(r for r in result.runs if r.name == name)
    return {s.at: s.reason for s in [*run_.skips, *run_.limits]}


def assert_simulates_as_interpreted(g: Graph, seeds: int = 3) -> None:
    """The multi-rank simulation of `g` on one core group (1 cube, 2 vector cores; jittered schedules) completes
    and gives, bit for bit, the reference interpreter's outputs on the golden inputs."""
    import numpy as np

    from lowering.simulate import simulate

    inputs = runner.layer_inputs(g, 0)
    want = run(g, inputs)
    for seed in range(seeds):
        sim = simulate(g, inputs, seed=seed, cube=1, vector=2, jitter=seed)
        assert sim.ok, sim.report()
        for got, exp in zip(sim.outputs, want):
            for k in exp:
                np.testing.assert_array_equal(got[k], exp[k], err_msg=k)

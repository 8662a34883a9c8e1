"""Simulate a lowered layer on N ranks: cores per rank, early dispatch, signals, spinning waits, deadlocks.

The graph (a layer name or a .dsir file, after the -p pipeline) is lowered to its task graph and every rank runs
it on its own cores (lowering/simulate: the scheduling model is in its module docstring). Prints the makespan in
simulated steps, or the deadlock report (the wait-for cycle and every held core), and any problem found (signal
epoch mismatches, reads of data no rank wrote yet). With values on (default for layer graphs that fit in
memory) the numpy references run as tasks complete and the outputs are compared with the reference interpreter.
Then it explores: --schedules N (default 24) runs in all, the others with drawn core budgets (half of them the
smallest that fits), dispatch seeds and block-duration jitter (lowering/simulate/explore.py), because with ample
cores the ranks run in lockstep and a missing cross-rank edge never shows; the first failing one is printed with
the flags that reproduce it. `moe --rounds R` simulates R MoE sublayers chained (perf.model.moe_rounds_graph: one
all-to-all round each, at the --batch/--seq chunk), where a missing handshake edge shows once the rounds' early
waits hold enough cores (dspark-model.md §6(g)). Exit status: 0 every schedule completed and clean, 1 deadlock,
problem or value mismatch, 2 error.
"""
from __future__ import annotations

import argparse

from dspark_ir.hardware import HARDWARE

from ..common import NO_PASSES, UsageError, add_target_arguments, load_graph

NAME = "simulate"
HELP = "simulate the lowered task graph on N ranks (makespan in steps, or the deadlock report)"
VALUES_LIMIT = 1 << 30     # bytes of buffers over all ranks up to which values are on by default
DEFAULT_SCHEDULES = 24     # runs per simulate: enough to find every single missing signal edge of the tiny MoE


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_target_arguments(p, "LAYER|FILE")
    p.add_argument("--ep", type=int, default=None,
                   help="expert-parallel ranks of the moe layer (default: the config's)")
    p.add_argument("--rounds", type=int, default=1, metavar="R",
                   help="moe only: R MoE sublayers chained, one all-to-all round each (perf.model.moe_rounds_graph; "
                        "a prefill chunk with --batch/--seq); default 1: the moe layer itself")
    p.add_argument("--cores-cube", type=int, default=HARDWARE.cube_cores, metavar="N",
                   help=f"cube (AIC) cores per rank (default {HARDWARE.cube_cores})")
    p.add_argument("--cores-vector", type=int, default=HARDWARE.vector_cores, metavar="N",
                   help=f"vector (AIV) cores per rank (default {HARDWARE.vector_cores}); "
                        "a mix task takes 1 cube + 2 vector")
    p.add_argument("--seed", type=int, default=0, help="seed of the dispatch order among ready tasks (default 0)")
    p.add_argument("--jitter", type=int, default=0, metavar="J",
                   help="each block takes 1 + a seeded draw in 0..J steps (default 0)")
    p.add_argument("--waiters-first", action="store_true",
                   help="ready waiters take cores before every other ready task (the adversarial order)")
    p.add_argument("--schedules", type=int, default=DEFAULT_SCHEDULES, metavar="N",
                   help=f"run the given schedule and N-1 more with drawn core budgets (half of them the smallest), "
                        f"dispatch seeds and jitter (default {DEFAULT_SCHEDULES}; 1: the given schedule only)")
    p.add_argument("--input-seed", type=int, default=0, help="seed of the layer's golden inputs (default 0)")
    p.add_argument("-p", "--pipeline", help="pass pipeline to run first ('default' = the default pipeline; "
                                            "none when omitted)")
    p.add_argument("--values", action=argparse.BooleanOptionalAction, default=None,
                   help="run the numpy references and compare with the interpreter (default: on for layer graphs "
                        "whose buffers fit in 1 GiB)")
    p.add_argument("--early-resolve", choices=("dispatched", "ignored"), default="dispatched",
                   help="AER tasks wait for their inferred producers to be dispatched (default) or ignore them")
    p.add_argument("--signal-edges", action="store_true",
                   help="keep the lowering's notifier → waiter hazards on signal windows as inferred deps "
                        "(default: signal windows are invisible to dependency tracking, as on hardware)")


def run(args: argparse.Namespace) -> int:
    from lowering import compile
    from lowering.simulate import SimConfig
    from lowering.simulate.explore import explore

    if args.cores_cube < 0 or args.cores_vector < 0:
        raise UsageError("core counts must be >= 0", "--cores-cube/--cores-vector")
    if args.schedules < 1:
        raise UsageError("must be >= 1", "--schedules")
    if args.jitter < 0:
        raise UsageError("must be >= 0", "--jitter")
    if args.rounds < 1:
        raise UsageError("must be >= 1", "--rounds")
    c = compile(_graph(args), pipeline=args.pipeline, sources=False)
    g, tg = c.graph, c.tg
    inputs = _inputs(g, tg, args)
    config = SimConfig(cube=args.cores_cube, vector=args.cores_vector, seed=args.seed, jitter=args.jitter,
                       waiters_first=args.waiters_first,
                       track_signal_windows=args.signal_edges, early_resolve=args.early_resolve)
    exploration = explore(tg, inputs, config, args.schedules)
    result = exploration.results[0]
    print(_header(g, args))
    print(result.report())
    mismatch = False
    if inputs is None:
        print("values: not computed (timing only; --values runs the numpy references)")
    elif result.completed and result.outputs is not None:
        mismatch = not _compare(g, inputs, result.outputs)
    elif result.completed:
        print("values: not compared (a numpy reference failed, see the problems above)")
    if args.schedules > 1:
        print(exploration.summary())
        others = [(s, r) for s, r in exploration.failed if s.index > 0]
        if others:
            schedule, failed = others[0]
            print(f"first failing schedule: #{schedule.index} (reproduce with {schedule.flags()}):")
            print(failed.report())
    return 0 if not exploration.failed and not mismatch else 1


def _graph(args: argparse.Namespace):
    if args.rounds == 1:
        return load_graph(args)
    if args.target != "moe":
        raise UsageError("applies to the moe layer only", "--rounds")
    if args.tp is not None:
        raise UsageError("the moe rounds run on the config's ranks (use --ep)", "--tp")
    from perf.model import moe_rounds_graph

    return moe_rounds_graph(args.config, ep=args.ep, batch=args.batch, seq=args.seq, rounds=args.rounds)


def _inputs(g, tg, args: argparse.Namespace):
    """Golden inputs of a layer graph (the graph's own ep for moe), seeded random ones for other graphs with
    --values, or None (timing only)."""
    wanted = args.values
    size = sum(_nbytes(b) for b in tg.buffers.values()) * max(tg.ranks, 1)
    if wanted is False or (wanted is None and ("layer" not in g.attributes or size > VALUES_LIMIT)):
        return None
    if "layer" not in g.attributes:
        from lowering.orchestration import random_inputs

        return [random_inputs(tg, args.input_seed + r) for r in range(tg.ranks)] if tg.ranks > 1 \
            else random_inputs(tg, args.input_seed)
    return layer_inputs(g, args.input_seed)


def layer_inputs(g, seed: int):
    """runner.layer_inputs, except that a moe graph's inputs follow its `ep` attribute (ranks = ep)."""
    import numpy as np

    import runner
    from dspark_ir import layers
    from dspark_ir.semantics.dtypes import NP_DTYPES
    from goldens import inputs as gi

    ep = g.attributes.get("ep")
    if ep is None or int(g.attributes.get("ranks", 1)) == layers.graph_config(g).ep:
        return runner.layer_inputs(g, seed)
    try:
        cfg = layers.graph_config(g).with_(ep=int(ep))
        per_rank = gi.make_rank_inputs(g.attributes["kind"], cfg, seed)
    except ValueError as e:       # goldens' ConfigError: a graph whose config the goldens cannot rebuild
        from dspark_ir.errors import ConfigError

        raise ConfigError(f"no golden inputs for this graph: {e}", f"graph '@{g.name}'") from None
    typed = [{p.name: np.asarray(d[p.name]).astype(NP_DTYPES[p.type.dtype.value]) for p in g.params}
             for d in per_rank]
    return typed if len(typed) > 1 else typed[0]


def _nbytes(buf) -> int:
    import numpy as np

    from dspark_ir.semantics.dtypes import NP_DTYPES

    return buf.numel * np.dtype(NP_DTYPES[buf.dtype]).itemsize


def _compare(g, inputs, outputs) -> bool:
    import numpy as np

    from dspark_ir.interp import run

    expected = run(g, inputs)
    expected = expected if isinstance(expected, list) else [expected]
    bad = [(r, k) for r, (got, want) in enumerate(zip(outputs, expected)) for k in want
           if not np.array_equal(got[k], want[k], equal_nan=True)]
    if bad:
        r, k = bad[0]
        print(f"values: FAIL: %{k} on rank {r} differs from the interpreter ({len(bad)} output(s) differ)")
        return False
    print(f"values: outputs equal the interpreter's on {len(outputs)} rank(s) (bitwise)")
    return True


def _header(g, args: argparse.Namespace) -> str:
    a = g.attributes
    what = f"{a['layer']} · config {a.get('config')}" if "layer" in a else f"@{g.name}"
    ranks = f"ep {a['ep']}" if "ep" in a else f"tp {a.get('tp', 1)}"
    if "rounds" in a:
        what = f"moe × {a['rounds']} rounds · T = {g.symbols.get('T')} · config {a.get('config')}"
    pipeline = args.pipeline if args.pipeline and args.pipeline.strip() != "none" else NO_PASSES
    return (f"dspark simulate {what} · {ranks} · {args.cores_cube} cube + {args.cores_vector} vector cores per "
            f"rank · seed {args.seed} · pipeline {pipeline}")

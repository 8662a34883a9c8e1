"""Time the reference interpreter against the independent golden on every tiny layer, side by side.

    python benchmarks/interp_vs_golden.py [--repeat N] [--tp 1 2 4] [--layers decode-swa ...]

For each layer and TP size: build the graph, make the seeded inputs once, then alternate interpreter and golden
runs N times and report the median wall time of each and their ratio (target: interpreter ≤ 1.5× golden).
Graph building and input generation are not timed. Not a unit test: timings depend on the machine.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import runner
from dspark_ir import layers
from dspark_ir.interp import run

TARGET = 1.5


def _time(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def bench(name: str, tp: int, repeat: int) -> tuple[float, float] | None:
    g = layers.build(name, config="tiny", tp=tp)
    inputs = runner.layer_inputs(g, 0)
    run(g, inputs), runner.golden_outputs(g, inputs)  # warm-up (imports, caches)
    t_interp, t_golden = [], []
    for _ in range(repeat):
        t_interp.append(_time(lambda: run(g, inputs)))
        t_golden.append(_time(lambda: runner.golden_outputs(g, inputs)))
    return statistics.median(t_interp), statistics.median(t_golden)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--tp", type=int, nargs="+", default=[1, 4])
    p.add_argument("--layers", nargs="+", default=list(layers.LAYER_NAMES))
    args = p.parse_args(argv)
    print(f"# interpreter vs golden, config tiny, median of {args.repeat} runs "
          f"(python benchmarks/interp_vs_golden.py {' '.join(argv or sys.argv[1:])})".rstrip())
    print(f"  {'layer':<12} {'tp':>3} {'ranks':>5} {'interp ms':>10} {'golden ms':>10} {'ratio':>7}")
    worst = 0.0
    for name in args.layers:
        for tp in args.tp:
            result = bench(name, tp, args.repeat)
            if result is None:
                continue
            ti, tg = result
            ratio = ti / tg
            worst = max(worst, ratio)
            ranks = layers.build(name, config="tiny", tp=tp).attributes["ranks"]
            flag = "" if ratio <= TARGET else "  > target"
            print(f"  {name:<12} {tp:>3} {ranks:>5} {ti * 1e3:>10.1f} {tg * 1e3:>10.1f} {ratio:>6.2f}x{flag}")
    print(f"worst ratio {worst:.2f}x (target ≤ {TARGET}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

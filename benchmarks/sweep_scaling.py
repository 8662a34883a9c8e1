"""Scale-out of `dspark sweep` on Dask: 1 vs 2 workers cold, the cache warm, an interrupted sweep resumed.

    python benchmarks/sweep_scaling.py            # flash decode-swa TP4, default and all-off: 42 distinct kernels
                                                  # at flash shapes (seconds each; not yet timed on a quiet machine)
    python benchmarks/sweep_scaling.py --tiny     # tiny decode-swa TP1/2: 71 distinct sub-second kernels
    python benchmarks/sweep_scaling.py --quick    # a few small kernels: proves the script works

The default grid is what users sweep (flash shapes, whose kernels take seconds each); `--tiny` shows the other end,
where a kernel's pypto run is mostly fixed costs (process-level g++ compiles of the host code, which run several at
once and so already use more than one core with one worker) and the 2-core machine, not the executor, limits the
speed-up.

1. Cold: the same sweep on a Dask LocalCluster (127.0.0.1) of 1 worker, then of 2 workers (one thread each),
   each with an empty temporary cost cache; the workers' pypto processes are started before the clock starts.
   Prints both wall times and the speed-up (target >= 1.6x).
2. Warm: the sweep again into a new output directory with the 2-worker run's cache. Prints the fraction of
   kernel look-ups the cache answered (target >= 95 %) and the kernels simulated (0 expected).
3. Resume: the sweep into a new output directory, interrupted (KeyboardInterrupt from the progress hook) after
   N points, then run again with the same directory. Prints how many recorded points the second run redid
   (0 expected) and whether the results equal the uninterrupted run's.
Needs pypto and dask[distributed]. Not a unit test: timings depend on the machine.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from perf.costs import PyptoCosts
from perf.executors import KERNELS_PER_TASK, DaskExecutor
from perf.sweep import Grid, run_sweep

SPEED_UP_TARGET = 1.6
HIT_TARGET = 0.95
FULL = dict(grid=Grid(("decode-swa",), ("flash",), (4,), pipelines=("default", "all-off")), stage=None)
TINY = dict(grid=Grid(("decode-swa",), ("tiny",), (1, 2), pipelines=("default", "all-off")), stage=None)
QUICK = dict(grid=Grid(("decode-swa",), ("tiny",), (1, 2), pipelines=("default", "all-off")),
             stage=("attn.*", "qkv.kv_*"))


class Interrupt:
    """A progress bar that raises KeyboardInterrupt once `after` points have finished (a Ctrl-C mid-sweep)."""

    def __init__(self, after: int):
        self.after = after
        self.done = 0

    def __call__(self, total: int) -> "Interrupt":
        return self

    def update(self, n: int = 1) -> None:
        self.done += n
        if self.done >= self.after:
            raise KeyboardInterrupt

    def set_postfix_str(self, text: str) -> None:
        pass

    def close(self) -> None:
        pass


def cluster(workers: int):
    from distributed import LocalCluster

    return LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host="127.0.0.1",
                        dashboard_address=None)


def warm_workers(executor: DaskExecutor) -> None:
    """Wait until every worker's pypto processes are up (their start-up is not part of the timing)."""
    from perf.dask_worker import PLUGIN

    executor.client.run(lambda dask_worker: dask_worker.plugins[PLUGIN].ready.wait(900))


def load() -> str:
    """The machine's load averages (1, 5 min) and cores: the timings are only as good as the machine was quiet."""
    one, five, _ = os.getloadavg()
    return f"load {one:.1f}/{five:.1f} on {os.cpu_count()} cores"


def sweep(points, stage, cache: Path, out: Path, executor: DaskExecutor, progress=None):
    source = PyptoCosts(cache=cache, executor=executor)
    t0 = time.perf_counter()
    report = run_sweep(points, source, out, stage=stage, progress=progress)
    return report, time.perf_counter() - t0


def measure(args, points, stage, tmp: Path) -> dict:
    """Cold 1 and 2 workers, warm, resume: the summary (also printed as one JSON line)."""
    wall, reports, tasks = {}, {}, {}
    for n in (1, 2):
        with cluster(n) as c:
            executor = DaskExecutor(c.scheduler_address, args.timeout, kernels_per_task=args.kernels_per_task)
            try:
                warm_workers(executor)
                before = load()
                reports[n], wall[n] = sweep(points, stage, tmp / f"cache{n}", tmp / f"cold{n}", executor)
                tasks[n] = executor.tasks
            finally:
                executor.close()
        print(f"cold, {n} worker{'s' if n > 1 else ''}: {reports[n].simulated} kernels simulated in "
              f"{wall[n]:.1f} s ({tasks[n]} Dask tasks; {before} before, {load()} after)", flush=True)
    same = reports[1].to_json()["points"] == reports[2].to_json()["points"]
    speed_up = wall[1] / wall[2]
    print(f"speed-up 1 -> 2 workers: {speed_up:.2f}x (target >= {SPEED_UP_TARGET}x); results identical: {same}")

    with cluster(2) as c:
        executor = DaskExecutor(c.scheduler_address, args.timeout, kernels_per_task=args.kernels_per_task)
        try:
            warm, t_warm = sweep(points, stage, tmp / "cache2", tmp / "warm", executor)
            hits = warm.cache_hits / max(1, warm.cache_hits + warm.cache_misses)
            print(f"warm: {warm.cache_hits} of {warm.cache_hits + warm.cache_misses} kernel look-ups from the cache "
                  f"({100 * hits:.1f} %, target >= {100 * HIT_TARGET:g} %), {warm.simulated} simulated, "
                  f"{t_warm:.1f} s", flush=True)

            out = tmp / "resume"
            after = max(1, min(args.interrupt_after, len(points) - 1))
            try:
                sweep(points, stage, tmp / "cache2", out, executor, progress=Interrupt(after))
                print("resume: the interrupt did not come")
            except KeyboardInterrupt:
                pass
            recorded = {p: p.stat().st_mtime_ns for p in (out / "points").glob("*.json")}
            resumed, _ = sweep(points, stage, tmp / "cache2", out, executor)
            redone = sum(1 for p, mtime in recorded.items() if p.stat().st_mtime_ns != mtime)
            equal = resumed.to_json()["points"] == reports[2].to_json()["points"]
            print(f"resume: interrupted after {len(recorded)} of {len(points)} points; the second run loaded "
                  f"{resumed.resumed}, redid {redone} recorded points, estimated {len(points) - resumed.resumed}; "
                  f"results equal the uninterrupted run's: {equal}")
        finally:
            executor.close()
    summary = {"points": len(points), "kernels": reports[2].simulated, "cold_s": wall, "tasks": tasks,
               "speed_up": speed_up,
               "identical": same, "warm_hit_fraction": hits, "warm_simulated": warm.simulated,
               "resume_redone": redone, "resume_equal": equal}
    print(json.dumps(summary))
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="a few small kernels (the qkv stage), to check the script")
    ap.add_argument("--tiny", action="store_true", help="the tiny grid: 71 sub-second kernels")
    ap.add_argument("--kernels-per-task", type=int, default=KERNELS_PER_TASK, metavar="N",
                    help=f"at most N short kernels per Dask task (default {KERNELS_PER_TASK}; 1: a task per kernel)")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds per kernel simulation")
    ap.add_argument("--interrupt-after", type=int, default=2, metavar="N", help="points before the interrupt")
    ap.add_argument("--keep", action="store_true", help="keep the temporary caches and outputs")
    args = ap.parse_args(argv)
    setup = QUICK if args.quick else TINY if args.tiny else FULL
    points, _ = setup["grid"].points()
    stage = setup["stage"]
    tmp = Path(tempfile.mkdtemp(prefix="dspark-sweep-bench-"))
    print(f"sweep: {len(points)} points ({', '.join(p.label() for p in points)})"
          + (f", stage {','.join(stage)}" if stage else ""), flush=True)

    try:
        summary = measure(args, points, stage, tmp)
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    ok = (summary["identical"] and summary["resume_equal"] and summary["resume_redone"] == 0
          and summary["warm_hit_fraction"] >= HIT_TARGET and (args.quick or summary["speed_up"] >= SPEED_UP_TARGET))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

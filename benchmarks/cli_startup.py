"""CPU seconds of the quick commands (`dspark --help`, `dspark list`, `dspark verify FILE`), each in a fresh
interpreter, best of --repeat runs (user + system time of the child). The issue-21 budget is 0.3 s each.

    PYTHONPATH=$PWD python benchmarks/cli_startup.py [--repeat 5]
"""
from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = {
    "dspark --help": ["--help"],
    "dspark list": ["list"],
    "dspark verify examples/rmsnorm_matmul_rope.dsir": ["verify", str(ROOT / "examples" / "rmsnorm_matmul_rope.dsir")],
}
BUDGET = 0.3


def cpu_seconds(argv: list[str]) -> float:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run([sys.executable, "-m", "dspark_cli.main", *argv], check=True, stdout=subprocess.DEVNULL,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    worst = 0.0
    for label, argv in COMMANDS.items():
        best = min(cpu_seconds(argv) for _ in range(args.repeat))
        worst = max(worst, best)
        print(f"{best:6.3f} s CPU  {label}")
    print(f"{'ok' if worst <= BUDGET else 'over'}: slowest {worst:.3f} s (budget {BUDGET} s)")
    return 0 if worst <= BUDGET else 1


if __name__ == "__main__":
    sys.exit(main())

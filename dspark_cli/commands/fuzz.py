"""Fuzz the .dsir front end (parser + verifier) with generated and mutated inputs.

Every input must end in a verified graph or a located error; crashes (any other exception, or an
input slower than the budget) are written to the corpus directory, one file each.
"""
from __future__ import annotations

import argparse
import hashlib

from dspark_ir.fsutil import OutputDir

NAME = "fuzz"
HELP = "fuzz the parser and verifier"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--count", type=int, default=10000, help="number of inputs (default 10000)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--budget", type=float, default=2.0, help="seconds allowed per input (default 2)")
    p.add_argument("--corpus", help="directory to save crashing inputs into")


def run(args: argparse.Namespace) -> int:
    from dspark_ir.fuzzing import run_fuzz

    result = run_fuzz(args.seed, args.count, args.budget)
    print(f"fuzz: {result.inputs} inputs in {result.seconds:.1f}s: {result.parsed} verified, "
          f"{result.rejected} rejected with a located error, {len(result.crashes)} crashes")
    if result.crashes and args.corpus:
        out = OutputDir(args.corpus)
        for text, error in result.crashes:
            digest = hashlib.sha256(text.encode()).hexdigest()[:12]
            out.write_text(f"crash-{digest}.dsir", f"# {error.splitlines()[0][:200]}\n{text}")
    for _, error in result.crashes[:10]:
        print(f"  crash: {error.splitlines()[0][:200]}")
    return 1 if result.crashes else 0

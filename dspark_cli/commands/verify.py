"""Parse and verify .dsir files; print `ok` per file or the first error with its location."""
from __future__ import annotations

import argparse

NAME = "verify"
HELP = "verify .dsir files"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("files", nargs="+", metavar="FILE")
    p.add_argument("-q", "--quiet", action="store_true", help="print nothing on success")


def run(args: argparse.Namespace) -> int:
    from dspark_ir import parse_file, verify

    for path in args.files:
        module = parse_file(path)
        for g in module.graphs:
            verify(g)
        if not args.quiet:
            names = ", ".join(f"@{g.name}" for g in module.graphs)
            nodes = sum(len(g) for g in module.graphs)
            print(f"{path}: ok ({names}: {nodes} nodes)")
    return 0

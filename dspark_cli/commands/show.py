"""Print a layer (or a .dsir file) in the textual IR."""
from __future__ import annotations

import argparse

from ..common import add_target_arguments, emit, load_graph

NAME = "show"
HELP = "print a layer's IR"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_target_arguments(p, "LAYER|FILE")
    p.add_argument("-o", "--output", help="write to this file instead of stdout")


def run(args: argparse.Namespace) -> int:
    from dspark_ir import print_graph, verify

    g = load_graph(args)
    verify(g)
    emit(print_graph(g, header=header(g)), args.output)
    return 0


def header(g) -> list[str]:
    """`dspark-ir 1 · layer decode-swa · config tiny · tp 2` (from the graph's own attributes)."""
    parts = ["dspark-ir 1"] + [f"{key} {g.attributes[key]}" for key in ("layer", "config", "tp")
                               if key in g.attributes]
    return [" · ".join(parts)]

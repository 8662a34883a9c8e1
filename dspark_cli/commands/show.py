"""Print a layer (or a .dsir file) in the textual IR."""
from __future__ import annotations

import argparse

from dspark_ir import print_graph, verify

from ..common import add_target_arguments, emit, load_graph

NAME = "show"
HELP = "print a layer's IR"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_target_arguments(p, "LAYER|FILE")
    p.add_argument("-o", "--output", help="write to this file instead of stdout")


def run(args: argparse.Namespace) -> int:
    g = load_graph(args)
    verify(g)
    emit(print_graph(g), args.output)
    return 0

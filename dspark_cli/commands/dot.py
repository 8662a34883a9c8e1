"""Export a graph as Graphviz DOT (and SVG when graphviz is installed and -o ends in .svg)."""
from __future__ import annotations

import argparse

from dspark_ir import verify
from dspark_ir.dot import dot_to_svg, to_dot

from ..common import UsageError, add_target_arguments, emit, load_graph

NAME = "dot"
HELP = "export a graph as DOT/SVG"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_target_arguments(p)
    p.add_argument("-o", "--output", help="out.dot, or out.svg to render with graphviz")


def run(args: argparse.Namespace) -> int:
    g = load_graph(args)
    verify(g)
    text = to_dot(g)
    if args.output and args.output.endswith(".svg"):
        svg = dot_to_svg(text)
        if svg is None:
            raise UsageError("SVG needs graphviz's `dot` on PATH (apt-get install graphviz); use -o FILE.dot")
        text = svg
    emit(text, args.output)
    return 0

"""Export a graph as Graphviz DOT, or as SVG when -o ends in .svg (clustered by block; needs graphviz's `dot`).

An SVG graphviz cannot lay out is an error of one line naming graphviz's version and message; nothing is written."""
from __future__ import annotations

import argparse

from ..common import add_target_arguments, emit, load_graph

NAME = "dot"
HELP = "export a graph as DOT/SVG"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_target_arguments(p)
    p.add_argument("-o", "--output", help="out.dot, or out.svg to render with graphviz")


def run(args: argparse.Namespace) -> int:
    from dspark_ir import verify
    from dspark_ir.dot import render_svg, to_dot

    g = load_graph(args)
    verify(g)
    emit(render_svg(g) if args.output and args.output.endswith(".svg") else to_dot(g), args.output)
    return 0

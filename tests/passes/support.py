"""Helpers for pass tests: every graph a test touches goes through print → parse and the verifier."""
from __future__ import annotations

import difflib
from pathlib import Path

from dspark_ir import Graph, parse_graph, print_graph, verify

HERE = Path(__file__).parent
CORE_GRAPH = """
graph @mini<T = 4>(
    %x: bf16[T,8],
    %w: bf16[8],
    %m: bf16[8,8]
) {
  # a
  %a.flat = reshape(%x) {shape = [32]} : bf16[32]
  %a.back = reshape(%a.flat) {shape = [T, 8]} : bf16[T,8]
  %a.n1 = rmsnorm(%a.back, %w) : bf16[T,8]
  %a.n2 = rmsnorm(%x, %w) : bf16[T,8]
  %a.sum = add(%a.n1, %a.n2) : bf16[T,8]
  %a.proj = matmul(%a.sum, %m) : f32[T,8]
  %a.dead = mul(%a.n1, %a.n2) : bf16[T,8]
  %a.out = cast(%a.proj) {to = bf16} : bf16[T,8]
  return %a.out
}
"""


def checked(g: Graph | str, filename: str = "<test>") -> Graph:
    """Verify, then require print → parse → structurally equal and print → parse → print identical."""
    if isinstance(g, str):
        g = parse_graph(g, filename)
    verify(g)
    text = print_graph(g)
    again = parse_graph(text, filename)
    assert again.structurally_equal(g), f"{filename}: print → parse changed the graph"
    assert print_graph(again) == text, f"{filename}: print → parse → print is not identical"
    verify(again)
    return g


def load(path: Path) -> Graph:
    return checked(path.read_text(), str(path))


def mini() -> Graph:
    return checked(CORE_GRAPH, "<mini>")


def diff(expected: str, got: str) -> str:
    return "".join(difflib.unified_diff(expected.splitlines(True), got.splitlines(True), "expected", "got"))


def header_value(text: str, key: str) -> str | None:
    """`# key: value` from the leading comment lines of a .dsir file."""
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        k, _, v = line[1:].strip().partition(":")
        if k.strip() == key:
            return v.strip()
    return None

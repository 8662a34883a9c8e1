"""Fuzzing of the front end: grammar-based generation plus byte- and token-level mutation.

The property: every input ends in a parsed, verified graph or in a located `DsparkError`
(`file:line:col` or a node name). Any other exception, or an input that takes longer than the
per-input budget, is a crash; `run_fuzz` returns them so callers can save a regression corpus.
"""
from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from .errors import DsparkError
from .text.parser import parse_module
from .verifier import verify

DTYPES = ("bf16", "f32", "i8", "i32", "fp16")
OPS = ("rmsnorm", "matmul", "cast", "add", "mul", "rope", "concat", "slice", "join", "zeros", "reshape")
ATTR_VALUES = ("8", "[8]", "[16, 64, 128]", "ceil(T/8)", "true", "false", "atomic", "bf16", "1e-06",
               '"late_dep"', "-1", "T*2", "[]", "((T))", "min(T, 4)")
TOKENS = ("graph", "@g", "<", ">", "(", ")", "{", "}", "[", "]", ",", ":", "=", "%x", "%a.b", "return",
          "deps", "inout", "token", "attributes", "T", "ceil", "/", "//", "*", "+", "-", "#", "\n", " ",
          "bf16[T,64]", "1.5e3", '"s"', "\x00", "é", "9" * 30)


@dataclass
class FuzzResult:
    inputs: int = 0
    parsed: int = 0
    rejected: int = 0
    crashes: list[tuple[str, str]] = field(default_factory=list)  # (input, error)
    seconds: float = 0.0


def generate_graph_text(rng: random.Random) -> str:
    """A random, mostly well-formed graph in the textual IR."""
    width = rng.choice([16, 32, 64])
    lines = [f"graph @g{rng.randint(0, 9)}<T = {rng.choice([8, 16, 100])}>(%x: bf16[T,{width}], "
             f"%w: bf16[{width}], %m: bf16[{width},{width}], %c: bf16[T,4], %s: bf16[T,4]) {{"]
    values = ["%x"]
    for i in range(rng.randint(0, 8)):
        name = f"%b{rng.randint(0, 3)}.op{i}"
        op = rng.choice(OPS)
        src = rng.choice(values)
        operands, attrs, ty = _op_line(rng, op, src, width, values)
        lines.append(f"  {name} = {op}({operands}){attrs} : {ty}")
        values.append(name)
    lines.append(f"  return {rng.choice(values)}")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _op_line(rng: random.Random, op: str, src: str, width: int, values: list[str]) -> tuple[str, str, str]:
    bf = f"bf16[T,{width}]"
    attrs = ""
    if rng.random() < 0.4:
        key = rng.choice(["tile", "blocks", "aer", "eps", "k_split", "to", "axis", "core", "tail", "bogus"])
        attrs = f" {{{key} = {rng.choice(ATTR_VALUES)}}}"
    table = {
        "rmsnorm": (f"{src}, %w", bf), "matmul": (f"{src}, %m", f"f32[T,{width}]"), "cast": (src, bf),
        "add": (f"{src}, {rng.choice(values)}", bf), "mul": (f"{src}, {src}", bf),
        "rope": (f"{src}, %c, %s", bf), "concat": (f"{src}, {src}", f"bf16[T,{2 * width}]"),
        "slice": (src, bf), "join": (src, "token"), "zeros": ("", f"f32[T,{width}]"), "reshape": (src, bf),
    }
    operands, ty = table[op]
    return operands, attrs, ty


def mutate(text: str, rng: random.Random) -> str:
    """One to three random byte- or token-level edits."""
    for _ in range(rng.randint(1, 3)):
        text = rng.choice(_MUTATORS)(text, rng)
    return text


def _delete_span(text: str, rng: random.Random) -> str:
    if not text:
        return text
    i = rng.randrange(len(text))
    return text[:i] + text[i + rng.randint(1, 8):]


def _insert_token(text: str, rng: random.Random) -> str:
    i = rng.randrange(len(text) + 1)
    return text[:i] + rng.choice(TOKENS) + text[i:]


def _duplicate_line(text: str, rng: random.Random) -> str:
    lines = text.split("\n")
    i = rng.randrange(len(lines))
    lines.insert(i, lines[i])
    return "\n".join(lines)


def _swap_tokens(text: str, rng: random.Random) -> str:
    parts = re.split(r"(\s+)", text)
    if len(parts) < 3:
        return text
    i, j = rng.randrange(len(parts)), rng.randrange(len(parts))
    parts[i], parts[j] = parts[j], parts[i]
    return "".join(parts)


def _flip_byte(text: str, rng: random.Random) -> str:
    data = bytearray(text.encode())
    if not data:
        return text
    data[rng.randrange(len(data))] = rng.randrange(256)
    return data.decode("utf-8", errors="replace")


def _nest(text: str, rng: random.Random) -> str:
    depth = rng.choice([20, 200, 2000])
    nested = "(" * depth + "T" + ")" * depth
    return text.replace("ceil(T/8)", nested, 1).replace("[T,", "[" + nested + ",", 1)


def _long_expression(text: str, rng: random.Random) -> str:
    n = rng.choice([10, 1000, 3000])
    piece = rng.choice(["T+" * n + "T", "- " * n + "T", "T*" * n + "1", "9" * (n * 2)])
    return text.replace("<T = ", f"<T = {piece}, U = ", 1) if rng.random() < 0.5 else \
        text.replace("[T,", f"[{piece},", 1)


_MUTATORS: tuple[Callable[[str, random.Random], str], ...] = (
    _delete_span, _insert_token, _duplicate_line, _swap_tokens, _flip_byte, _nest, _long_expression)


def check_one(text: str, budget_s: float = 2.0) -> tuple[str, str]:
    """("parsed" | "rejected" | "crash", detail). Parsed inputs verify; rejected ones fail with a
    located DsparkError; anything else, or a run over `budget_s`, is a crash."""
    start = time.perf_counter()
    outcome = ("parsed", "")
    try:
        for g in parse_module(text, "fuzz.dsir").graphs:
            verify(g)
    except DsparkError as e:
        outcome = ("rejected", str(e)) if e.location else ("crash", f"unlocated {type(e).__name__}: {e}")
    except Exception as e:  # the property under test: nothing else may escape
        outcome = ("crash", f"{type(e).__name__}: {e}")
    elapsed = time.perf_counter() - start
    if elapsed > budget_s:
        return ("crash", f"slow: {elapsed:.2f}s")
    return outcome


def inputs(seed: int, count: int) -> Iterator[str]:
    rng = random.Random(seed)
    for i in range(count):
        text = generate_graph_text(rng)
        yield text if i % 4 == 0 else mutate(text, rng)


def run_fuzz(seed: int, count: int, budget_s: float = 2.0) -> FuzzResult:
    result = FuzzResult()
    start = time.perf_counter()
    for text in inputs(seed, count):
        result.inputs += 1
        status, detail = check_one(text, budget_s)
        if status == "crash":
            result.crashes.append((text, detail))
        elif status == "parsed":
            result.parsed += 1
        else:
            result.rejected += 1
    result.seconds = time.perf_counter() - start
    return result

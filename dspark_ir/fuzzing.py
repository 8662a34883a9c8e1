"""Fuzzing of the front end: grammar-based generation plus byte- and token-level mutation.

The property: every input ends in a parsed, verified graph that prints and reads back to the same text, or in a
located one-line `DsparkError` (`file:line:col` or a node name). Any other exception, or an input that takes
longer than the per-input budget, is a crash; `run_fuzz` returns them so callers can save a regression corpus.
Besides random edits, the mutators aim at what broke before: string escapes and control characters, deep
lists and dims, long whitespace runs, huge literals and names, zero, negative and dividing-by-zero dims, rank-0
and zero-size operands, and graph attributes of the wrong type.
"""
from __future__ import annotations

import random
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Iterator

from .errors import DsparkError
from .text.parser import parse_module
from .text.printer import print_graph
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


STRINGS = ('"\\x"', '"\\u12"', '"\\N{NOPE}"', '"\\U00110000"', '"a\nb"', '"a\x00b"', '"\ta"', '"\\"',
           '"\\n\\t\\r\\"\\\\"', '"\\x41\\u00e9\\U0001f600"', '"é\u2028"', '"\\', '"\\\n"', '"\x7f"')


def _attr_at(text: str, rng: random.Random, attr: str) -> str:
    """`attr` added to a statement's attributes (or as its attribute dict)."""
    statements = [m for m in re.finditer(r"\)( \{| :)", text)]
    if not statements:
        return text
    m = rng.choice(statements)
    added = f" {{{attr}," if m.group(1) == " {" else f" {{{attr}}} :"
    return text[:m.start() + 1] + added + text[m.end():]


def _string_attr(text: str, rng: random.Random) -> str:
    return _attr_at(text, rng, f"sched = {rng.choice(STRINGS)}")


def _deep_list(text: str, rng: random.Random) -> str:
    depth = rng.choice([15, 16, 17, 500, 5000])
    key = rng.choice(["tile", "sched", "blocks"])
    return _attr_at(text, rng, f"{key} = " + "[" * depth + "8" + "]" * depth)


def _whitespace_run(text: str, rng: random.Random) -> str:
    i = rng.randrange(len(text) + 1)
    return text[:i] + rng.choice([" ", "\n", "\t", " \n"]) * rng.choice([1000, 65536]) + text[i:]


def _huge_literal(text: str, rng: random.Random) -> str:
    n = rng.choice([2000, 100_000, 1_000_000])
    literal = rng.choice(['"' + "a" * n + '"', '"' + "\\n" * (n // 2) + '"', "9" * n, "1." + "5" * n, "x" * n,
                          "[" + "1, " * (n // 3) + "1]"])
    if rng.random() < 0.3:      # a huge name instead
        return text.replace("%x", "%" + "x" * n, 2)
    return _attr_at(text, rng, f"{rng.choice(['sched', 'blocks', 'tile', 'eps'])} = {literal}")


BAD_DIMS = ("0", "-1", "T-T", "ceil(T/(T-T))", "T-{t}", "T-{t}-1", "T//(T-{t})", "ceil(T/(T-{t}))", "U",
            "min(T, 0)", "ceil(TT/4)", "1")


def _bad_dims(text: str, rng: random.Random) -> str:
    """Bound symbols < 1, and dims that are zero, negative or divide by zero at the graph's T, or use an unbound
    symbol."""
    bound = re.search(r"<T = (\d+)>", text)
    dim = rng.choice(BAD_DIMS).format(t=bound.group(1) if bound else 16)
    choice = rng.random()
    if choice < 0.2:
        return re.sub(r"<T = \d+>", f"<T = {rng.choice(['0', '1', '-1'])}>", text, count=1)
    if choice < 0.6:
        return _attr_at(text, rng, f"blocks = {dim}")
    shapes = list(re.finditer(r"\[T,", text))
    if not shapes:
        return text
    m = rng.choice(shapes)
    return text[:m.start()] + f"[{dim}," + text[m.end():]


def _rank_change(text: str, rng: random.Random) -> str:
    """A rank-0, zero-size or lower-rank operand type."""
    shapes = list(re.finditer(r"\[[^\]\[]*\]", text))
    if not shapes:
        return text
    m = rng.choice(shapes)
    return text[:m.start()] + rng.choice(["[]", "[0]", "[0,0]", "[T]", "[0,64]", "[T,0]", "[1]"]) + text[m.end():]


GRAPH_ATTRS = ("ranks = 2.0", "ranks = true", "ranks = 0", "tp = \"x\"", "tp = -1", "layer = 3", "outputs = [1]",
               "config = [\"a\"]", "ep = 1.5", "layers = false", "note = \"\\x\"", "ranks = 2", "kind = \"swa\"")


def _graph_attribute(text: str, rng: random.Random) -> str:
    attrs = ", ".join(rng.sample(GRAPH_ATTRS, rng.randint(1, 2)))
    return re.sub(r"\) \{\n", lambda _: f") attributes {{{attrs}}} {{\n", text, count=1)


Mutator = Callable[[str, random.Random], str]
# The mutators aimed at one class of hostile input each (issue 22), by name.
HOSTILE_MUTATORS: dict[str, Mutator] = {
    "string escapes": _string_attr, "deep lists": _deep_list, "whitespace runs": _whitespace_run,
    "huge literals": _huge_literal, "zero, negative and dividing dims": _bad_dims,
    "rank-0 and zero-size operands": _rank_change, "wrong-typed graph attributes": _graph_attribute,
}
_MUTATORS: tuple[Mutator, ...] = (
    _delete_span, _insert_token, _duplicate_line, _swap_tokens, _flip_byte, _nest, _long_expression,
    *HOSTILE_MUTATORS.values())


def check_one(text: str, budget_s: float = 2.0) -> tuple[str, str]:
    """("parsed" | "rejected" | "crash", detail). Parsed inputs verify; rejected ones fail with a
    located DsparkError; anything else, or a run over `budget_s`, is a crash."""
    start = time.perf_counter()
    outcome = ("parsed", "")
    try:
        for g in parse_module(text, "fuzz.dsir").graphs:
            verify(g)
            printed = print_graph(g)
            if print_graph(parse_module(printed, "printed.dsir").entry) != printed:
                outcome = ("crash", f"graph '@{g.name}' does not print back to the same text")
    except DsparkError as e:
        if not e.location or "\n" in str(e):
            outcome = ("crash", f"unlocated or multi-line {type(e).__name__}: {e}"[:500])
        else:
            outcome = ("rejected", str(e))
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

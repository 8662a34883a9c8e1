"""Hypothesis strategies that build random, valid DSpark graphs from the core ops."""
from __future__ import annotations

from hypothesis import strategies as st

from dspark_ir import Graph, TensorType
from dspark_ir.dims import Const, Sym, ceildiv, dim, dmax, dmin, floordiv
from dspark_ir.verifier import GRAPH_ATTRIBUTES

SYMBOLS = ("T", "B", "S")
NAME = st.from_regex(r"[a-z][a-z0-9_]{0,6}", fullmatch=True)
NOTE = NAME.filter(lambda name: name not in GRAPH_ATTRIBUTES)     # a free-form graph attribute


@st.composite
def dims(draw, depth: int = 2):
    """A random dim expression over T, B, S."""
    if depth == 0 or draw(st.booleans()):
        return draw(st.one_of(st.integers(0, 4096).map(Const), st.sampled_from(SYMBOLS).map(Sym)))
    a, b = draw(dims(depth - 1)), draw(dims(depth - 1))
    divisor = draw(st.integers(1, 64))
    kind = draw(st.sampled_from(["+", "-", "*", "//", "ceil", "min", "max"]))
    return {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b,
            "//": lambda: floordiv(a, divisor), "ceil": lambda: ceildiv(a, divisor),
            "min": lambda: dmin(a, b), "max": lambda: dmax(a, b)}[kind]()


@st.composite
def graphs(draw):
    """A graph: a few [T, D] bf16 inputs, then a random mix of core ops over earlier values."""
    t = draw(st.sampled_from([8, 16, 32]))
    symbols = {"T": t, "S": draw(st.sampled_from([None, 4]))}
    g = Graph(draw(NAME), symbols, draw(st.dictionaries(NOTE, st.one_of(st.integers(0, 9), NAME), max_size=2)))
    width = draw(st.sampled_from([16, 32, 64]))
    values = [g.add_param(f"in{i}", TensorType.of("bf16", ["T", width])) for i in range(draw(st.integers(1, 3)))]
    weight = g.add_param("w", TensorType.of("bf16", [width]))
    mat = g.add_param("wm", TensorType.of("bf16", [width, width]))
    cos = g.add_param("cos", TensorType.of("bf16", ["T", 4]))
    sin = g.add_param("sin", TensorType.of("bf16", ["T", 4]))
    blocks_list = [f"blk{i}" for i in range(3)]
    for i in range(draw(st.integers(1, 12))):
        x = draw(st.sampled_from(values))
        block = draw(st.sampled_from(blocks_list))
        name = g.fresh_name(f"{block}.{draw(NAME)}")
        kind = draw(st.sampled_from(["rmsnorm", "matmul", "add", "cast", "rope", "concat_slice"]))
        sched = _sched_attrs(draw)
        if kind == "rmsnorm":
            eps = draw(st.sampled_from([1e-6, 1e-5, 0.5]))
            node = g.add_op("rmsnorm", [x, weight], {"eps": eps, **sched}, names=name)
            out = node.result
        elif kind == "matmul":
            node = g.add_op("matmul", [x, mat], {"k_split": draw(st.integers(1, 4))}, names=name)
            out = g.add_op("cast", [node.result], {"to": "bf16"}, names=g.fresh_name(name + ".cast")).result
        elif kind == "add":
            out = g.add_op("add", [x, draw(st.sampled_from(values))], sched, names=name).result
        elif kind == "cast":
            mid = g.add_op("cast", [x], {"to": "f32"}, names=name).result
            out = g.add_op("cast", [mid], {"to": "bf16"}, names=g.fresh_name(name + ".back")).result
        elif kind == "rope":
            out = g.add_op("rope", [x, cos, sin], {"rope_dim": 8, "inverse": draw(st.booleans())}, names=name).result
        else:
            cat = g.add_op("concat", [x, draw(st.sampled_from(values))], {"axis": 1}, names=name).result
            out = g.add_op("slice", [cat], {"axis": 1, "start": 0, "size": width},
                           names=g.fresh_name(name + ".s")).result
        values.append(out)
    done = g.add_op("join", values[-2:], names="end.join").result
    g.set_returns([values[-1], done])
    return g


def _sched_attrs(draw) -> dict:
    attrs = {}
    if draw(st.booleans()):
        attrs["blocks"] = draw(st.sampled_from([dim(4), ceildiv(Sym("T"), 8), Sym("T") * 2]))
    if draw(st.booleans()):
        attrs["aer"] = draw(st.booleans())
    if draw(st.booleans()):
        attrs["sched"] = draw(st.sampled_from(["late_dep", "x \"quoted\" \\ y"]))
    return attrs

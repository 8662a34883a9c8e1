"""Random valid graphs dense in what the standard passes rewrite: reshape/slice/cast chains, identity ops,
duplicates, joins with repeats, random explicit deps and dead nodes (core ops only)."""
from __future__ import annotations

from hypothesis import strategies as st

from dspark_ir import Graph, TensorType

KINDS = ["reshape", "slice", "cast", "dup", "add", "mul", "norm", "join"]


@st.composite
def rewrite_dense_graphs(draw):
    t = draw(st.sampled_from([2, 4]))
    g = Graph("dense", {"T": t})
    tensors = [g.add_param(f"x{i}", TensorType.of("bf16", ["T", 8])) for i in range(draw(st.integers(1, 3)))]
    w = g.add_param("w", TensorType.of("bf16", [8]))
    f = g.add_param("f", TensorType.of("f32", ["T", 8]))
    produced = []
    for i in range(draw(st.integers(1, 14))):
        kind = draw(st.sampled_from(KINDS))
        name = f"b{draw(st.integers(0, 2))}.{kind}{i}"
        deps = draw(st.lists(st.sampled_from(produced), max_size=3)) if produced and draw(st.booleans()) else []
        x, y = draw(st.sampled_from(tensors)), draw(st.sampled_from(tensors))
        out = _add(draw, g, kind, name, x, y, w, f, deps, produced)
        if out is not None:
            (tensors if not out.type.is_token else produced).append(out)
            if not out.type.is_token:
                produced.append(out)
    g.set_returns([tensors[-1]] + ([produced[-1]] if produced and draw(st.booleans()) else []))
    return g


def _add(draw, g, kind, name, x, y, w, f, deps, produced):
    if kind == "reshape":
        shape = draw(st.sampled_from([[8, "T"], ["T", 8], draw(st.sampled_from([[1, "T*8"], [2, "T*4"]]))]))
        mid = g.add_op("reshape", [x], {"shape": shape}, names=name, deps=deps).result
        return g.add_op("reshape", [mid], {"shape": ["T", 8]}, names=g.fresh_name(name + ".back")).result
    if kind == "slice":
        cat = g.add_op("concat", [x, y], {"axis": 1}, names=name).result
        start = draw(st.sampled_from([0, 2, 4]))
        mid = g.add_op("slice", [cat], {"axis": 1, "start": start, "size": 12}, names=g.fresh_name(name + ".a")).result
        inner = draw(st.sampled_from([0, 2, 4]))
        return g.add_op("slice", [mid], {"axis": 1, "start": inner, "size": 8}, names=g.fresh_name(name + ".b")).result
    if kind == "cast":
        route = draw(st.sampled_from(["bf16-f32-bf16", "bf16-bf16", "f32-bf16-f32"]))
        if route == "f32-bf16-f32":
            mid = g.add_op("cast", [f], {"to": "bf16"}, names=name).result
            wide = g.add_op("cast", [mid], {"to": "f32"}, names=g.fresh_name(name + ".up")).result
            return g.add_op("cast", [wide], {"to": "bf16"}, names=g.fresh_name(name + ".down")).result
        mid = g.add_op("cast", [x], {"to": "f32" if route == "bf16-f32-bf16" else "bf16"}, names=name).result
        return g.add_op("cast", [mid], {"to": "bf16"}, names=g.fresh_name(name + ".back")).result
    if kind == "dup" and produced:
        node = draw(st.sampled_from(produced)).producer
        if node.op in ("add", "mul", "rmsnorm"):
            return g.add_op(node.op, node.operands, node.attrs, names=name, deps=node.deps).result
        return None
    if kind in ("add", "mul"):
        return g.add_op(kind, [x, y], names=name, deps=deps).result
    if kind == "norm":
        return g.add_op("rmsnorm", [x, w], names=name, deps=deps).result
    if kind == "join":
        ins = draw(st.lists(st.sampled_from(produced + [x]), min_size=1, max_size=3))
        return g.add_op("join", ins, names=name).result
    return None

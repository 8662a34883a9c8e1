"""Every op's shape rule is total: any operand types and attribute values end in a list of result types or a
ShapeError, never IndexError / ZeroDivisionError. The operands are those of every node of the layer graphs, with
one operand made rank 0, one axis dropped, set to 0 or 1, or every operand zero-sized; attributes set to 0/-1."""
from __future__ import annotations

import pytest

from dspark_ir.dims import Const
from dspark_ir.errors import DsparkError
from dspark_ir.graph import infer_types
from dspark_ir.layers import LAYER_NAMES, build
from dspark_ir.types import TensorType


def _variants(t: TensorType) -> list[TensorType]:
    if t.is_token:
        return []
    out = [TensorType(t.dtype, ()), TensorType(t.dtype, tuple(Const(0) for _ in t.shape))]
    for i in range(t.rank):
        for replacement in ((), (Const(0),), (Const(1),)):
            out.append(TensorType(t.dtype, t.shape[:i] + replacement + t.shape[i + 1:]))
    return out


def _zero_sized(t: TensorType) -> TensorType:
    return t if t.is_token else TensorType(t.dtype, tuple(Const(0) for _ in t.shape))


def _attr_variants(attrs: dict) -> list[dict]:
    out = []
    for key, value in attrs.items():
        if type(value) is int:
            out += [{**attrs, key: n} for n in (0, -1, 1)]
        elif isinstance(value, tuple):
            out += [{**attrs, key: ()}, {**attrs, key: tuple(0 for _ in value)}]
    return out


def _cases(layer: str):
    seen = set()
    for tp in (1, 2):
        g = build(layer, "tiny", tp=tp)
        for node in g.nodes.values():
            types = [v.type for v in node.operands]
            key = (node.op, tuple(map(str, types)), repr(sorted(node.attrs.items(), key=str)))
            if key in seen:
                continue
            seen.add(key)
            attrs = dict(node.attrs)
            for i, t in enumerate(types):
                for v in _variants(t):
                    yield node.opdef, types[:i] + [v] + types[i + 1:], attrs
            yield node.opdef, [_zero_sized(t) for t in types], attrs
            for a in _attr_variants(attrs):
                yield node.opdef, types, a
                yield node.opdef, [_zero_sized(t) for t in types], a


@pytest.mark.parametrize("layer", LAYER_NAMES)
def test_shape_rules_are_total_on_rank_0_and_zero_size_operands(layer):
    crashes = []
    for opdef, types, attrs in _cases(layer):
        try:
            attrs = opdef.normalize_attrs(attrs)
            outs = infer_types(opdef, types, attrs, "n")
            opdef().tile_axes(types, outs, attrs)
        except DsparkError:
            pass
        except Exception as e:      # the property: nothing else
            crashes.append(f"{opdef.name}({', '.join(map(str, types))}) {attrs}: {type(e).__name__}: {e}")
    assert not crashes, crashes[:5]

"""Generic ops: casts, elementwise, layout, matmul, normalisation, seeds and joins."""
from __future__ import annotations

from .. import dims as D
from ..types import TOKEN, DType, TensorType
from .base import (
    REQUIRED,
    Attr,
    OpDef,
    expect,
    expect_dtype,
    expect_rank,
    expect_same_dim,
    numpy_reference,
    register_op,
)

FLOATS = (DType.bf16, DType.fp16, DType.fp32)


def _numel(shape) -> D.Dim:
    total: D.Dim = D.Const(1)
    for d in shape:
        total = D.mul(total, d)
    return total


@register_op
class Join(OpDef):
    """Zero-work task that completes when all its inputs have (`task_dummy`)."""
    name = "join"
    operands = ("*ins",)
    core = "none"
    lowers_to = "dummy"
    reference = numpy_reference("elementwise", "join")
    family = "elementwise"

    def infer(self, ins, attrs):
        return [TOKEN]


@register_op
class Cast(OpDef):
    name = "cast"
    operands = ("x",)
    attrs = {"to": Attr("dtype", REQUIRED), "mode": Attr("enum", "rint", choices=("rint", "trunc"))}
    reference = numpy_reference("elementwise", "cast")
    family = "elementwise"

    def infer(self, ins, attrs):
        return [ins[0].with_dtype(attrs["to"])]


class _Binary(OpDef):
    operands = ("a", "b")
    family = "elementwise"

    def infer(self, ins, attrs):
        a, b = ins
        expect(a.shape == b.shape, f"operand shapes differ: {a} vs {b}")
        expect(a.dtype == b.dtype, f"operand dtypes differ: {a} vs {b}")
        return [a]


@register_op
class Add(_Binary):
    name = "add"
    reference = numpy_reference("elementwise", "add")


@register_op
class Mul(_Binary):
    name = "mul"
    reference = numpy_reference("elementwise", "mul")


@register_op
class Reshape(OpDef):
    name = "reshape"
    operands = ("x",)
    attrs = {"shape": Attr("dims", REQUIRED)}
    core = "none"
    lowers_to = "view"
    reference = numpy_reference("elementwise", "reshape")
    family = "elementwise"

    def infer(self, ins, attrs):
        x, shape = ins[0], attrs["shape"]
        before, after = _numel(x.shape), _numel(shape)
        a, b = before.value(), after.value()
        expect(before == after or a is None or b is None or a == b,
               f"reshape of {x} to [{', '.join(map(str, shape))}] changes the element count ({before} vs {after})")
        return [x.with_shape(shape)]


@register_op
class Slice(OpDef):
    name = "slice"
    operands = ("x",)
    attrs = {"axis": Attr("int", REQUIRED), "start": Attr("dim", REQUIRED), "size": Attr("dim", REQUIRED)}
    core = "none"
    lowers_to = "view"
    reference = numpy_reference("elementwise", "slice_")
    family = "elementwise"

    def infer(self, ins, attrs):
        x = ins[0]
        axis = attrs["axis"]
        expect(0 <= axis < x.rank, f"axis {axis} out of range for {x}")
        end = D.add(attrs["start"], attrs["size"])
        n, extent = end.value(), x.shape[axis].value()
        expect(n is None or extent is None or n <= extent, f"slice end {end} exceeds {x.shape[axis]}")
        shape = list(x.shape)
        shape[axis] = attrs["size"]
        return [x.with_shape(shape)]


@register_op
class Concat(OpDef):
    name = "concat"
    operands = ("*xs",)
    attrs = {"axis": Attr("int", REQUIRED)}
    core = "none"
    lowers_to = "placement"
    reference = numpy_reference("elementwise", "concat")
    family = "elementwise"

    def infer(self, ins, attrs):
        expect(len(ins) >= 1, "concat needs at least one operand")
        first, axis = ins[0], attrs["axis"]
        expect(0 <= axis < first.rank, f"axis {axis} out of range for {first}")
        total = D.Const(0)
        for t in ins:
            expect(t.dtype == first.dtype and t.rank == first.rank, f"cannot concat {first} and {t}")
            for i, (a, b) in enumerate(zip(t.shape, first.shape)):
                if i != axis:
                    expect_same_dim(a, b, f"concat dim {i}")
            total = D.add(total, t.shape[axis])
        shape = list(first.shape)
        shape[axis] = total
        return [first.with_shape(shape)]


@register_op
class Zeros(OpDef):
    """A freshly zeroed buffer (the seed task of an atomic accumulation)."""
    name = "zeros"
    operands = ()
    attrs = {"shape": Attr("dims", REQUIRED), "dtype": Attr("dtype", "f32")}
    allocates = True
    reference = numpy_reference("elementwise", "zeros")
    family = "elementwise"

    def infer(self, ins, attrs):
        return [TensorType(attrs["dtype"], attrs["shape"])]


@register_op
class Matmul(OpDef):
    """a[M,K] @ b[K,N] (or b[N,K] with trans_b) with an f32/i32/bf16 result.

    `accumulate` records how split-K partial sums are combined: `none` (one pass over K), `atomic`
    (fp32 atomic adds of each k split into the `acc` operand, a seeded buffer updated in place; on
    hardware the order is completion order, the reference adds splits in ascending order) or `ordered`
    (disjoint partial buffers reduced in ascending split order). `k_split`/`m_split` are fan-out factors.
    """
    name = "matmul"
    operands = ("a", "b", "*acc")
    aliases = {0: 2}
    attrs = {
        "out": Attr("dtype", "f32"),
        "trans_b": Attr("bool", False),
        "accumulate": Attr("enum", "none", choices=("none", "atomic", "ordered")),
        "k_split": Attr("int", 1),
        "m_split": Attr("int", 1),
    }
    core = "cube"
    reference = numpy_reference("matmul", "matmul")
    family = "matmul"

    def infer(self, ins, attrs):
        a, b, *acc = ins
        expect(len(acc) <= 1, "matmul takes at most one accumulator")
        expect(bool(acc) == (attrs["accumulate"] == "atomic"),
               "an atomic matmul takes exactly one accumulator operand (the seeded buffer); others take none")
        expect_rank(a, 2, "lhs")
        expect_rank(b, 2, "rhs")
        int8 = a.dtype == DType.i8
        expect(int8 == (b.dtype == DType.i8), f"mixed int8/float operands: {a} x {b}")
        if int8:
            expect(attrs["out"] == DType.i32, "int8 x int8 accumulates to i32")
        else:
            expect_dtype(a, FLOATS, "lhs")
            expect(attrs["out"] in FLOATS, f"float matmul cannot produce {attrs['out']}")
        k_b, n = (b.shape[1], b.shape[0]) if attrs["trans_b"] else (b.shape[0], b.shape[1])
        expect_same_dim(a.shape[1], k_b, "contraction dims")
        expect(attrs["k_split"] >= 1 and attrs["m_split"] >= 1, "k_split and m_split must be >= 1")
        out = TensorType(attrs["out"], (a.shape[0], n))
        if acc:
            expect(acc[0].shape == out.shape and acc[0].dtype == DType.fp32,
                   f"accumulator must be f32[{a.shape[0]},{n}], got {acc[0]}")
        return [out]

    def tile_axes(self, ins, outs, attrs):
        a, b = ins[0], ins[1]
        n = b.shape[0] if attrs["trans_b"] else b.shape[1]
        return [("m", a.shape[0]), ("n", n), ("k", a.shape[1])]


@register_op
class RmsNorm(OpDef):
    """rb((x · rsqrt(mean(x²) + eps)) · w) over the last axis."""
    name = "rmsnorm"
    operands = ("x", "w")
    attrs = {"eps": Attr("float", 1e-6)}
    reference = numpy_reference("norm", "rmsnorm")
    family = "norm"

    def infer(self, ins, attrs):
        x, w = ins
        expect_dtype(x, FLOATS, "x")
        expect(x.rank >= 1, f"x must have at least one axis, got {x}")
        expect_rank(w, 1, "weight")
        expect_same_dim(x.shape[-1], w.shape[0], "weight length")
        return [x.with_dtype(DType.bf16)]

    def tile_axes(self, ins, outs, attrs):
        return [("rows", ins[0].shape[0])]


@register_op
class Rope(OpDef):
    """Interleaved RoPE (or its inverse) on the last rope_dim dims; halves rounded separately."""
    name = "rope"
    operands = ("x", "cos", "sin")
    attrs = {"rope_dim": Attr("int", REQUIRED), "inverse": Attr("bool", False), "out": Attr("dtype", "bf16")}
    reference = numpy_reference("rope", "rope")
    family = "rope"

    def infer(self, ins, attrs):
        x, cos, sin = ins
        rope_dim = attrs["rope_dim"]
        expect(rope_dim > 0 and rope_dim % 2 == 0, f"rope_dim must be positive and even, got {rope_dim}")
        expect(x.rank >= 2, f"x must have a leading row axis, got {x}")
        width = x.shape[-1].value()
        expect(width is None or rope_dim <= width, f"rope_dim {rope_dim} exceeds the last dim of {x}")
        for name, t in (("cos", cos), ("sin", sin)):
            expect_rank(t, 2, name)
            expect_same_dim(t.shape[0], x.shape[0], f"{name} rows")
            expect(t.shape[1].value() in (None, rope_dim // 2), f"{name} must have {rope_dim // 2} columns, got {t}")
        expect(attrs["out"] in FLOATS, f"rope cannot produce {attrs['out']}")
        return [x.with_dtype(attrs["out"])]

    def tile_axes(self, ins, outs, attrs):
        return [("rows", ins[0].shape[0])]

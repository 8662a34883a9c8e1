"""The wire form of the context-parallel compressor payloads (seed decode_cp_allgather, dspark-model.md §6(b)).

The seed's base all-gathers each compressor's projections as bf16 wire rows: the f32 values and scores carried as
bf16 bit pairs (the low half first), then, on the aux/HCA payload, the bf16 kv row:

    row = [ values bits (2·W bf16) | scores bits (2·W bf16) | kv (K bf16, K = 0 when absent) ]

    %w      = cp_wire_pack(%values, %scores[, %kv])            the pack wave: typed rows → wire rows
    %v, %s… = cp_wire_unpack(%wire) {width = W, kv = K}        the unpack wave: wire rows → typed rows

Both are lossless (a bit reinterpretation): unpack(pack(v, s, kv)) == (v, s, kv) bit for bit. The typed step of
the seed (the `typed-gather` pass) has neither wave: its push reads the typed rows as their wire bits
(`cp_typed_allgather`) and its read-back decodes straight into the typed tensors (`cp_typed_readback`).
"""
from __future__ import annotations

from .. import dims as D
from ..types import DType, TensorType
from .base import Attr, OpDef, expect, expect_dtype, expect_rank, expect_same_dim, numpy_reference, register_op


def wire_width(values: TensorType, kv: TensorType | None) -> D.Dim:
    """Columns of a wire row: 2 bf16 per f32 of the values and of the scores, then the kv row."""
    width = D.mul(4, values.shape[1])
    return width if kv is None else D.add(width, kv.shape[1])


def check_typed_payload(ins) -> tuple[TensorType, TensorType | None]:
    """(values, kv or None) of a typed payload (values f32[T, W], scores f32[T, W][, kv bf16[T, K]])."""
    expect(len(ins) in (2, 3), f"expects values, scores[, kv]; got {len(ins)} operands")
    values, scores = ins[0], ins[1]
    expect_rank(values, 2, "values [T, W]")
    expect_dtype(values, DType.fp32, "values")
    expect(scores.dtype == values.dtype and scores.shape == values.shape,
           f"scores must be like values {values}, got {scores}")
    kv = ins[2] if len(ins) == 3 else None
    if kv is not None:
        expect_rank(kv, 2, "kv [T, K]")
        expect_dtype(kv, DType.bf16, "kv")
        expect_same_dim(kv.shape[0], values.shape[0], "kv rows vs values rows")
    return values, kv


def typed_results(rows: D.Dim, width: int, kv: int) -> list[TensorType]:
    """values f32[rows, W], scores f32[rows, W] (+ kv bf16[rows, K] when K > 0)."""
    out = [TensorType(DType.fp32, (rows, D.dim(width)))] * 2
    return out + ([TensorType(DType.bf16, (rows, D.dim(kv)))] if kv else [])


def check_wire(wire: TensorType, width: int, kv: int, what: str) -> None:
    expect_rank(wire, 2, f"{what} [rows, wire width]")
    expect_dtype(wire, DType.bf16, what)
    expect(width >= 1 and kv >= 0, f"width must be positive and kv non-negative, got {width}, {kv}")
    cols = wire.shape[1].value()
    expect(cols is None or cols == 4 * width + kv,
           f"{what} has {wire.shape[1]} columns; width {width}, kv {kv} make {4 * width + kv}")


@register_op
class CpWirePack(OpDef):
    """values f32[T, W], scores f32[T, W][, kv bf16[T, K]] → wire bf16[T, 4·W + K] (bit pairs, low half first):
    the untyped base's pack wave before the CP all-gather push (the seed's *_projection_pack)."""
    name = "cp_wire_pack"
    family = "wire"
    operands = ("values", "scores", "*kv")
    reference = numpy_reference("wire", "cp_wire_pack")

    def infer(self, ins, attrs):
        values, kv = check_typed_payload(ins)
        return [TensorType(DType.bf16, (values.shape[0], wire_width(values, kv)))]

    def tile_axes(self, ins, outs, attrs):
        return [("rows", ins[0].shape[0])]


@register_op
class CpWireUnpack(OpDef):
    """wire bf16[R, 4·W + K] → values f32[R, W], scores f32[R, W][, kv bf16[R, K]]: the untyped base's unpack
    wave after the CP all-gather read-back (the seed's *_projection_unpack)."""
    name = "cp_wire_unpack"
    family = "wire"
    operands = ("wire",)
    results = ("values", "scores", "kv")
    attrs = {"width": Attr("int", 0, doc="W: f32 columns of the values (and of the scores)"),
             "kv": Attr("int", 0, doc="K: bf16 kv columns after them (0: none)")}
    reference = numpy_reference("wire", "cp_wire_unpack")

    def infer(self, ins, attrs):
        check_wire(ins[0], attrs["width"], attrs["kv"], "wire")
        return typed_results(ins[0].shape[0], attrs["width"], attrs["kv"])

    def tile_axes(self, ins, outs, attrs):
        return [("rows", ins[0].shape[0])]

"""Element types and tensor types."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Iterable, Mapping

from .dims import Dim, DimLike, dim


class DType(Enum):
    bf16 = "bf16"
    fp16 = "fp16"
    fp32 = "f32"
    fp8 = "fp8"
    i8 = "i8"
    i32 = "i32"
    i64 = "i64"
    bool = "bool"
    token = "token"

    def __str__(self) -> str:
        return self.value

    @property
    def itemsize(self) -> int:
        return _ITEMSIZE[self]

    @property
    def is_float(self) -> bool:
        return self in (DType.bf16, DType.fp16, DType.fp32, DType.fp8)

    @property
    def is_int(self) -> bool:
        return self in (DType.i8, DType.i32, DType.i64)


_ITEMSIZE = {
    DType.bf16: 2, DType.fp16: 2, DType.fp32: 4, DType.fp8: 1,
    DType.i8: 1, DType.i32: 4, DType.i64: 8, DType.bool: 1, DType.token: 0,
}
DTYPE_NAMES = {d.value: d for d in DType}


def dtype(x: "DType | str") -> DType:
    if isinstance(x, DType):
        return x
    try:
        return DTYPE_NAMES[x]
    except KeyError:
        raise ValueError(f"unknown dtype '{x}'") from None


@dataclass(frozen=True)
class TensorType:
    """A tensor of `dtype` with a (possibly symbolic) shape. `token` has no shape."""

    dtype: DType
    shape: tuple[Dim, ...] = ()

    @staticmethod
    def of(dt: "DType | str", shape: Iterable[DimLike] = ()) -> "TensorType":
        return TensorType(dtype(dt), tuple(dim(d) for d in shape))

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_token(self) -> bool:
        return self.dtype is DType.token

    def __str__(self) -> str:
        text = self.__dict__.get("_text")   # immutable (frozen, Dims are frozen): format once
        if text is None:
            text = "token" if self.is_token else f"{self.dtype}[{','.join(str(d) for d in self.shape)}]"
            object.__setattr__(self, "_text", text)
        return text

    def symbols(self) -> frozenset[str]:
        """The symbols the shape mentions."""
        found = self.__dict__.get("_symbols")     # immutable: collect once
        if found is None:
            found = frozenset().union(*(d.symbols() for d in self.shape))
            object.__setattr__(self, "_symbols", found)
        return found

    def evaluate(self, env: Mapping[str, int]) -> "TensorType":
        return TensorType(self.dtype, tuple(d.evaluate(env) for d in self.shape))

    def concrete_shape(self, env: Mapping[str, int]) -> tuple[int, ...] | None:
        values = tuple(d.value(env) for d in self.shape)
        return None if any(v is None for v in values) else values  # type: ignore[return-value]

    def with_shape(self, shape: Iterable[DimLike]) -> "TensorType":
        return TensorType(self.dtype, tuple(dim(d) for d in shape))

    def with_dtype(self, dt: "DType | str") -> "TensorType":
        return TensorType(dtype(dt), self.shape)

    def nbytes(self, env: Mapping[str, int]) -> int | None:
        shape = self.concrete_shape(env)
        if shape is None:
            return None
        n = self.dtype.itemsize
        for s in shape:
            n *= s
        return n


TOKEN = TensorType(DType.token)

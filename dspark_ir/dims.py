"""Dimension expressions: integers, symbols, + - *, floor division, ceil division, min and max.

Dims are immutable and hashable. Constructors fold constants and apply a few identities, so two
expressions that print the same compare equal. `evaluate` substitutes bound symbols.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Union

from .errors import DimError

DimLike = Union["Dim", int, str]


class Dim:
    """Base of the dim expression tree."""

    precedence = 3

    def __add__(self, other: DimLike) -> "Dim":
        return add(self, other)

    def __radd__(self, other: DimLike) -> "Dim":
        return add(other, self)

    def __sub__(self, other: DimLike) -> "Dim":
        return sub(self, other)

    def __rsub__(self, other: DimLike) -> "Dim":
        return sub(other, self)

    def __mul__(self, other: DimLike) -> "Dim":
        return mul(self, other)

    def __rmul__(self, other: DimLike) -> "Dim":
        return mul(other, self)

    def __floordiv__(self, other: DimLike) -> "Dim":
        return floordiv(self, other)

    def symbols(self) -> set[str]:
        raise NotImplementedError

    def evaluate(self, env: Mapping[str, int]) -> "Dim":
        raise NotImplementedError

    def value(self, env: Mapping[str, int] | None = None) -> int | None:
        """The integer value under `env`, or None while a symbol stays unbound."""
        folded = self.evaluate(env or {})
        return folded.n if isinstance(folded, Const) else None


@dataclass(frozen=True)
class Const(Dim):
    n: int

    def __str__(self) -> str:
        return str(self.n)

    def symbols(self) -> set[str]:
        return set()

    def evaluate(self, env: Mapping[str, int]) -> Dim:
        return self


@dataclass(frozen=True)
class Sym(Dim):
    name: str

    def __str__(self) -> str:
        return self.name

    def symbols(self) -> set[str]:
        return {self.name}

    def evaluate(self, env: Mapping[str, int]) -> Dim:
        if self.name in env:
            return Const(int(env[self.name]))
        return self


_BIN_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "//": 2}


@dataclass(frozen=True)
class BinOp(Dim):
    op: str
    a: Dim
    b: Dim

    @property
    def precedence(self) -> int:  # type: ignore[override]
        return _BIN_PRECEDENCE[self.op]

    def __str__(self) -> str:
        text = self.__dict__.get("_text")        # immutable: format once
        if text is None:
            left = _wrap(self.a, self.precedence, right_side=False)
            right = _wrap(self.b, self.precedence, right_side=True)
            text = f"{left}{self.op}{right}" if self.op in ("*", "//") else f"{left} {self.op} {right}"
            object.__setattr__(self, "_text", text)
        return text

    def symbols(self) -> set[str]:
        return self.a.symbols() | self.b.symbols()

    def evaluate(self, env: Mapping[str, int]) -> Dim:
        return _BUILDERS[self.op](self.a.evaluate(env), self.b.evaluate(env))


@dataclass(frozen=True)
class Call(Dim):
    """ceil(a/b), min(a, b), max(a, b)."""

    fn: str
    args: tuple[Dim, ...]

    def __str__(self) -> str:
        text = self.__dict__.get("_text")        # immutable: format once
        if text is None:
            if self.fn == "ceil":
                a, b = self.args
                text = f"ceil({_wrap(a, 2, False)}/{_wrap(b, 2, True)})"
            else:
                text = f"{self.fn}({', '.join(str(a) for a in self.args)})"
            object.__setattr__(self, "_text", text)
        return text

    def symbols(self) -> set[str]:
        return set().union(*(a.symbols() for a in self.args))

    def evaluate(self, env: Mapping[str, int]) -> Dim:
        return _BUILDERS[self.fn](*(a.evaluate(env) for a in self.args))


def _wrap(d: Dim, parent_precedence: int, right_side: bool) -> str:
    needs = d.precedence < parent_precedence or (right_side and d.precedence == parent_precedence)
    return f"({d})" if needs else str(d)


def dim(x: DimLike) -> Dim:
    """Coerce an int, a symbol name or a Dim to a Dim."""
    if isinstance(x, Dim):
        return x
    if isinstance(x, bool):
        raise TypeError("a dim cannot be a bool")
    if isinstance(x, int):
        return Const(x)
    if isinstance(x, str):
        from .text.dims_text import parse_dim

        return parse_dim(x)
    raise TypeError(f"cannot make a dim of {x!r}")


def add(a: DimLike, b: DimLike) -> Dim:
    a, b = dim(a), dim(b)
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(a.n + b.n)
    if a == Const(0):
        return b
    if b == Const(0):
        return a
    return BinOp("+", a, b)


def sub(a: DimLike, b: DimLike) -> Dim:
    a, b = dim(a), dim(b)
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(a.n - b.n)
    if b == Const(0):
        return a
    if a == b:
        return Const(0)
    return BinOp("-", a, b)


def mul(a: DimLike, b: DimLike) -> Dim:
    a, b = dim(a), dim(b)
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(a.n * b.n)
    if a == Const(1):
        return b
    if b == Const(1):
        return a
    if Const(0) in (a, b):
        return Const(0)
    return BinOp("*", a, b)


def floordiv(a: DimLike, b: DimLike) -> Dim:
    a, b = dim(a), dim(b)
    _check_divisor(b)
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(a.n // b.n)
    if b == Const(1):
        return a
    exact = _divide_exactly(a, b)
    if exact is not None:
        return exact
    return BinOp("//", a, b)


def _divide_exactly(a: Dim, b: Dim) -> Dim | None:
    """x when a is b·x or x·b, or (k·x)//m with m dividing k; otherwise None."""
    if not (isinstance(a, BinOp) and a.op == "*"):
        return None
    for factor, other in ((a.a, a.b), (a.b, a.a)):
        if factor == b:
            return other
        if isinstance(factor, Const) and isinstance(b, Const) and factor.n % b.n == 0:
            return mul(factor.n // b.n, other)
    return None


def ceildiv(a: DimLike, b: DimLike) -> Dim:
    a, b = dim(a), dim(b)
    _check_divisor(b)
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(-(-a.n // b.n))
    if b == Const(1):
        return a
    return Call("ceil", (a, b))


def dmin(a: DimLike, b: DimLike) -> Dim:
    a, b = dim(a), dim(b)
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(min(a.n, b.n))
    if a == b:
        return a
    return Call("min", (a, b))


def dmax(a: DimLike, b: DimLike) -> Dim:
    a, b = dim(a), dim(b)
    if isinstance(a, Const) and isinstance(b, Const):
        return Const(max(a.n, b.n))
    if a == b:
        return a
    return Call("max", (a, b))


def _check_divisor(b: Dim) -> None:
    if isinstance(b, Const) and b.n <= 0:
        raise DimError(f"division by non-positive {b.n}")


_BUILDERS = {"+": add, "-": sub, "*": mul, "//": floordiv, "ceil": ceildiv, "min": dmin, "max": dmax}
FUNCTIONS = {"ceil": 2, "min": 2, "max": 2}

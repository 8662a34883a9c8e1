"""Typed pass options: the dataclass fields of a pass, parsed from and printed back to pipeline text.

Supported field types: int, float, bool, str, Literal["a", "b", ...], and tuples of int/float/str
(`tuple[int, ...]`, written `[1,2,3]`). Every field needs a default, so `name` alone builds the pass.
Text forms: ints `4` `-2`; floats `0.5` `1e-05` `inf`; bools `true` `false`; strings bare (`abc`, `x.y-z`)
or quoted (`"a b"`, with \\" and \\\\ escapes); lists `[a,b]`.

A numeric option may declare its range where it is declared, `ways: int = option(4, min=1)`; a value outside
it is an error that names the option and the range (`option 'ways' must be >= 1, got 0`), whether it comes
from a pipeline string, `--pass-option`, PassContext(options=...) or a direct `SplitMFanout(ways=0)`.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import re
import typing
from dataclasses import dataclass
from typing import Any, Literal

from dspark_ir.errors import DsparkError

BARE_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_.\-]*\Z")
INT_RE = re.compile(r"[-+]?[0-9]+\Z")
FLOAT_RE = re.compile(r"[-+]?(([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?|inf|infinity)\Z", re.IGNORECASE)
SCALARS = {int: "int", float: "float", bool: "bool", str: "str"}


@dataclass(frozen=True)
class Raw:
    """An option value as written in a pipeline string (before typing). `items` is set for a list."""

    text: str = ""
    quoted: bool = False
    items: tuple["Raw", ...] | None = None
    col: int = 0

    def __str__(self) -> str:
        if self.items is not None:
            return "[" + ",".join(str(i) for i in self.items) + "]"
        return _quote(self.text) if self.quoted else self.text


def option(default: Any, *, min: float | None = None, max: float | None = None) -> Any:  # noqa: A002
    """A pass option field with its valid range (inclusive bounds; None: unbounded): `ways: int = option(4, min=1)`.
    For a list option the range applies to every item."""
    return dataclasses.field(default=default, metadata={"min": min, "max": max})


@dataclass(frozen=True)
class OptionSpec:
    name: str
    kind: str                         # int | float | bool | str | choice | list
    default: Any
    choices: tuple[str, ...] = ()
    item: str = ""                    # element kind of a list
    min: float | None = None          # inclusive range of a number (of each item of a list)
    max: float | None = None

    @property
    def type_name(self) -> str:
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        if self.kind == "list":
            return f"list of {self.item}"
        return self.kind

    @property
    def range_text(self) -> str:
        """`>= 1`, `<= 8`, `in [1, 8]`, or "" when unbounded."""
        lo, hi = self.min, self.max
        if lo is not None and hi is not None:
            return f"in [{_num(lo)}, {_num(hi)}]"
        if lo is not None:
            return f">= {_num(lo)}"
        return f"<= {_num(hi)}" if hi is not None else ""

    def check_range(self, value: Any) -> Any:
        """`value` if inside the declared range, else ValueError naming the option and the range."""
        items = value if self.kind == "list" else (value,)
        for v in items:
            if isinstance(v, (int, float)) and not isinstance(v, bool) and (
                    (self.min is not None and not v >= self.min) or (self.max is not None and not v <= self.max)):
                what = "every item of option" if self.kind == "list" else "option"
                raise ValueError(f"{what} '{self.name}' must be {self.range_text}, got {format_value(self, value)}")
        return value


def _num(x: float) -> str:
    return f"{x:g}" if isinstance(x, float) else str(x)


@functools.lru_cache(maxsize=None)
def option_specs(cls: type) -> dict[str, OptionSpec]:
    """The options of a pass class, in field order. Raises TypeError for an unsupported field type."""
    hints = typing.get_type_hints(cls)
    specs: dict[str, OptionSpec] = {}
    for f in dataclasses.fields(cls):
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise TypeError(f"pass option '{f.name}' of {cls.__name__} needs a default")
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()
        spec = _spec(cls.__name__, f.name, hints[f.name], default)
        lo, hi = f.metadata.get("min"), f.metadata.get("max")
        if lo is not None or hi is not None:
            if "int" not in (spec.kind, spec.item) and "float" not in (spec.kind, spec.item):
                raise TypeError(f"pass option {cls.__name__}.{f.name}: a range needs a number (or list of numbers)")
            spec = dataclasses.replace(spec, min=lo, max=hi)
            spec.check_range(spec.default)
        specs[f.name] = spec
    return specs


def check_ranges(p: Any) -> None:
    """Every option of the pass instance `p` within its declared range (ValueError otherwise)."""
    for name, spec in option_specs(type(p)).items():
        if spec.min is not None or spec.max is not None:
            spec.check_range(getattr(p, name))


def _spec(owner: str, name: str, tp: Any, default: Any) -> OptionSpec:
    if tp in SCALARS:
        return OptionSpec(name, SCALARS[tp], default)
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is Literal and args and all(isinstance(a, str) for a in args):
        return OptionSpec(name, "choice", default, tuple(args))
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis and args[0] in (int, float, str):
        return OptionSpec(name, "list", tuple(default), item=SCALARS[args[0]])
    raise TypeError(f"pass option {owner}.{name}: unsupported type {tp!r} "
                    "(use int, float, bool, str, Literal[...] or tuple[int|float|str, ...])")


# ---- text → value ---------------------------------------------------------------------------------
def coerce(spec: OptionSpec, value: Any) -> Any:
    """A Raw (pipeline text), a str (text as on the command line) or a Python value → the typed value.
    Raises ValueError with a message that says what was expected."""
    if isinstance(value, str) and spec.kind not in ("str", "choice"):
        from .pipeline import parse_value_text

        try:
            value = parse_value_text(value)
        except DsparkError:
            raise ValueError(_expected(spec, repr(value))) from None
    if isinstance(value, Raw):
        return spec.check_range(_from_raw(spec, value))
    return spec.check_range(_from_python(spec, value))


def _from_raw(spec: OptionSpec, raw: Raw) -> Any:
    if spec.kind == "list":
        if raw.items is None:
            raise ValueError(_expected(spec, str(raw)))
        item_spec = OptionSpec(spec.name, spec.item, None)
        return tuple(_from_raw(item_spec, r) for r in raw.items)
    if raw.items is not None:
        raise ValueError(_expected(spec, str(raw)))
    return _scalar(spec, raw.text, raw.quoted)


def _scalar(spec: OptionSpec, text: str, quoted: bool) -> Any:
    kind = spec.kind
    if kind == "str":
        return text
    if kind == "choice" and text in spec.choices:
        return text
    if not quoted and kind == "int" and INT_RE.match(text):
        return int(text)
    if not quoted and kind == "float" and (FLOAT_RE.match(text) or text.lower() == "nan"):
        return float(text)
    if not quoted and kind == "bool" and text in ("true", "false"):
        return text == "true"
    raise ValueError(_expected(spec, _quote(text) if quoted else text))


def _from_python(spec: OptionSpec, value: Any) -> Any:
    kind = spec.kind
    ok = {
        "int": isinstance(value, int) and not isinstance(value, bool),
        "float": isinstance(value, (int, float)) and not isinstance(value, bool),
        "bool": isinstance(value, bool),
        "str": isinstance(value, str),
        "choice": value in spec.choices,
        "list": isinstance(value, (list, tuple)),
    }[kind]
    if not ok:
        raise ValueError(_expected(spec, repr(value)))
    if kind == "float":
        return float(value)
    if kind == "list":
        item_spec = OptionSpec(spec.name, spec.item, None)
        return tuple(coerce(item_spec, v) if not isinstance(v, str) or spec.item == "str"
                     else _scalar(item_spec, v, False) for v in value)
    return value


def _expected(spec: OptionSpec, got: str) -> str:
    return f"option '{spec.name}' expects {spec.type_name}, got {got}"


# ---- value → text ---------------------------------------------------------------------------------
def format_value(spec: OptionSpec, value: Any) -> str:
    if spec.kind == "list":
        item_spec = OptionSpec(spec.name, spec.item, None)
        return "[" + ",".join(format_value(item_spec, v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else repr(value)
    if isinstance(value, str):
        return value if BARE_RE.match(value) else _quote(value)
    return str(value)


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

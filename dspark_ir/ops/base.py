"""The op registry: every op kind is one `OpDef` subclass declared with `@register_op`.

An op declares its operands, results, typed attributes with defaults, the core kind it runs on,
which results alias which operands (in-place buffer updates), what a node of it becomes in the task graph
(`lowers_to`), a shape/dtype rule, and the numpy function that defines its meaning
(`reference = numpy_reference("<family>", "<fn>")`: dspark_ir/semantics/<family>.py, imported on first use, so
checking shapes and verifying graphs never loads numpy).

The op class is the key every later stage registers its facts against (view rules in lowering/build.py,
roofline rules in perf/roofline.py, ...): keyed by the class, not by its `name` string, a renamed class fails
at import and a renamed `name` needs no other change.
"""
from __future__ import annotations

import importlib
import math
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Mapping, Sequence

from ..dims import Dim, Sym, dim
from ..errors import ShapeError, did_you_mean
from ..text.strings import quote
from ..types import DType, TensorType, dtype

ATTR_KINDS = ("int", "float", "bool", "str", "dtype", "dim", "ints", "dims", "floats", "enum")


@dataclass(frozen=True)
class Attr:
    """Schema of one attribute. `default=REQUIRED` makes it mandatory."""

    kind: str
    default: Any = None
    choices: tuple[str, ...] = ()
    doc: str = ""

    def __post_init__(self):
        assert self.kind in ATTR_KINDS, self.kind
        assert self.kind != "enum" or self.choices, "enum attrs need choices"

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED = _Required()

CORE_KINDS = ("cube", "vector", "mix", "none")

# What a node of an op becomes in the task graph: the op's own fact, read by the lowering and by passes.
LOWERS_TO: dict[str, str] = {
    "kernel": "one kernel task (the default)",
    "view": "a view of its one operand's buffer, no task (lowering/build.py's view rule for the op class says "
            "which view; a result no strided view expresses is a copy task)",
    "placement": "its operands' producers write straight into their slots of its result when they can "
                 "(else a copy task)",
    "dummy": "no work: a point other tasks wait for (task_dummy)",
    "signal": "a task whose whole effect is meeting its peer ranks: at one rank there is nothing to do",
    "host": "a host step before the run (window allocation): no core, no time",
}

# Scheduling attributes every op accepts; passes change them and the lowering reads them.
COMMON_ATTRS: dict[str, Attr] = {
    "tile": Attr("ints", doc="tile sizes, one per tiled axis (see the op's tile_axes)"),
    "blocks": Attr("dim", doc="SPMD block count of the task"),
    "core": Attr("enum", choices=CORE_KINDS, doc="override of the op's core kind"),
    "tail": Attr("enum", choices=("clamp",), doc="the last tile is clamped to the remaining extent"),
    "aer": Attr("bool", doc="allow early resolve (scheduling hint)"),
    "workers": Attr("int", doc="cyclic worker count instead of one block per item"),
    "sched": Attr("str", doc="scheduling-only marker (e.g. late_dep)"),
}


def _coerce(name: str, spec: Attr, value: Any) -> Any:
    """Convert a parsed or Python value to the attribute's canonical type, or raise ShapeError."""
    kind = spec.kind
    try:
        if kind == "int":
            return _as_int(value)
        if kind == "float":
            if isinstance(value, bool):
                raise TypeError
            if isinstance(value, Dim):
                return float(_as_int(value))
            return float(value)
        if kind == "bool":
            return _as_bool(value)
        if kind == "str":
            if not isinstance(value, str):
                raise TypeError
            return value
        if kind == "dtype":
            return dtype(_ident(value))
        if kind == "dim":
            if isinstance(value, bool):
                raise TypeError
            return dim(value)
        if kind == "enum":
            ident = _ident(value)
            if ident not in spec.choices:
                raise ShapeError(f"attribute '{name}' must be one of {', '.join(spec.choices)}, got '{ident}'")
            return ident
        if kind in ("ints", "dims", "floats"):
            if not isinstance(value, (list, tuple)):
                raise TypeError
            item = _ITEM_SPECS[kind]
            return tuple(_coerce(name, item, v) for v in value)
    except ShapeError:
        raise
    except (TypeError, ValueError):
        pass
    raise ShapeError(f"attribute '{name}' expects {kind}, got {format_attr_value(value)}")


_ITEM_SPECS = {"ints": Attr("int"), "dims": Attr("dim"), "floats": Attr("float")}


def _as_int(value: Any) -> int:
    if isinstance(value, bool):
        raise TypeError
    if isinstance(value, int):
        return value
    if isinstance(value, Dim):
        n = value.value()
        if n is None:
            raise TypeError
        return n
    raise TypeError


def _as_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, Sym) and value.name in ("true", "false"):
        return value.name == "true"
    raise TypeError


def _ident(value: Any) -> str:
    if isinstance(value, Sym):
        return value.name
    if isinstance(value, DType):
        return value.value
    if isinstance(value, str):
        return value
    raise TypeError


def format_attr_value(value: Any) -> str:
    """Canonical text of an attribute value (used by the printer and in messages)."""
    if type(value) is int:
        return str(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return quote(value)
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_attr_value(v) for v in value) + "]"
    return str(value)


@dataclass(frozen=True)
class CrossRank:
    """How a rendezvous collective crosses ranks, as the seeds' code runs it: what perf's schedule model (rule 10)
    adds to the collective's local part, which is all that pypto can simulate on one rank.

    `steps`: the seed's tasks of this op in order (named for the reader; the chip swimlane's task names).
    `link`: how the link transfer of the bytes this rank sends composes with the local part: `overlap` (the local
    part makes the same stores, the peers' share over the link: the slower of the two), `before` (a publish the
    local part does not contain precedes it: the two add up) or `none` (nothing leaves the chip).
    `signals`: the signal tasks (peer waits, completes, retires) the seed runs after the data, each a task of its
    own. `exchanged`: the argument whose bytes the TP group exchanges, read as `wire` (its own dtype when empty);
    `whole_group`: it holds the whole group's rows (this rank sends (tp - 1) / tp of it), else this rank's rows
    only (it sends them to each of the tp - 1 peers). `readback_signals`: on an exchange op, the signal tasks
    of the read-back (`window_copy_out`) of its window, which the seed names by the exchange (the CP step's
    read-back wait and retire; the all-to-all's complete); None: the read-back's own `signals`."""

    steps: str
    link: str = "none"
    signals: int = 0
    exchanged: str = "out"
    whole_group: bool = True
    wire: str = ""
    readback_signals: int | None = None

    def __post_init__(self):
        if self.link not in ("overlap", "before", "none"):
            raise ValueError(f"CrossRank.link must be overlap | before | none, got {self.link!r}")
        if self.signals < 0:
            raise ValueError(f"CrossRank.signals must be >= 0, got {self.signals}")
        if self.readback_signals is not None and self.readback_signals < 0:
            raise ValueError(f"CrossRank.readback_signals must be >= 0, got {self.readback_signals}")

    def sent_bytes(self, shape: Sequence[int], dtype_name: str, tp: int) -> float:
        """Bytes this rank sends over the link, given the exchanged argument's concrete shape and dtype."""
        if self.link == "none" or tp <= 1:
            return 0.0
        size = math.prod(int(d) for d in shape) * dtype(self.wire or dtype_name).itemsize
        return size * (tp - 1) / tp if self.whole_group else float(size * (tp - 1))


class OpDef:
    """Declaration of one op kind. Subclass it and decorate with @register_op."""

    name: ClassVar[str]
    operands: ClassVar[tuple[str, ...]] = ()   # a trailing '*name' is variadic
    results: ClassVar[tuple[str, ...]] = ("out",)
    attrs: ClassVar[dict[str, Attr]] = {}
    core: ClassVar[str] = "vector"
    aliases: ClassVar[dict[int, int]] = {}      # result index -> operand index updated in place
    reference: ClassVar[Callable[..., Any] | None] = None   # numpy semantics (dspark_ir/semantics/<family>.py)
    family: ClassVar[str] = ""                  # kernel family (module under kernels/)
    collective: ClassVar[bool] = False          # runs across ranks (interpreter gathers all ranks)
    allocates: ClassVar[bool] = False           # results are fresh local buffers (may be updated in place)
    lowers_to: ClassVar[str] = "kernel"         # what a node becomes in the task graph: a key of LOWERS_TO
    row_sets: ClassVar[bool] = False            # each result row is a set: order within a row is no part of the
                                                # contract (top-k with tied scores); compare rows sorted
    # operand position -> (indexed operand position, axis[, page attr]): the operand holds indices into that
    # axis (into its pages of `attrs[page attr]` rows when given); sample.py draws random indices in range
    index_operands: ClassVar[dict[int, tuple[int, int] | tuple[int, int, str]]] = {}
    open_entries: ClassVar[Callable[..., Any] | None] = None   # the result entries the contract leaves open
                                                # (any value is right; a consumer must not read them): numpy
                                                # (dspark_ir/semantics/<family>.py), called like `reference`,
                                                # one boolean mask per result; compare only the other entries
    cross_rank: ClassVar[CrossRank | None] = None  # a rendezvous collective's link transfer and signal tasks
    doc: ClassVar[str] = ""

    # ---- shape rule -------------------------------------------------------------------------
    def infer(self, ins: Sequence[TensorType], attrs: Mapping[str, Any]) -> list[TensorType]:
        raise NotImplementedError(f"op '{self.name}' has no shape rule")

    def tile_axes(self, ins: Sequence[TensorType], outs: Sequence[TensorType],
                  attrs: Mapping[str, Any]) -> list[tuple[str, Dim]]:
        """(axis name, extent) for each entry of the `tile` attribute, in order. Empty: untiled."""
        return []

    # ---- declaration helpers ----------------------------------------------------------------
    @classmethod
    def all_attrs(cls) -> dict[str, Attr]:
        merged = dict(COMMON_ATTRS)
        merged.update(cls.attrs)
        return merged

    @classmethod
    def arity(cls) -> tuple[int, bool]:
        """(number of fixed operands, whether a variadic tail is allowed)."""
        variadic = bool(cls.operands) and cls.operands[-1].startswith("*")
        return (len(cls.operands) - (1 if variadic else 0), variadic)

    @classmethod
    def normalize_attrs(cls, given: Mapping[str, Any]) -> dict[str, Any]:
        """Validate and coerce attributes; fill declared defaults. Raises ShapeError."""
        schema = cls.all_attrs()
        out: dict[str, Any] = {}
        for key, value in given.items():
            if key not in schema:
                raise ShapeError(f"unknown attribute '{key}' for op '{cls.name}'{did_you_mean(key, schema)}")
            out[key] = _coerce(key, schema[key], value)
        for key, spec in cls.attrs.items():
            if key in out:
                continue
            if spec.required:
                raise ShapeError(f"op '{cls.name}' needs attribute '{key}'")
            if spec.default is not None:
                out[key] = _coerce(key, spec, spec.default)
        return out

    @classmethod
    def explicit_attrs(cls, attrs: Mapping[str, Any]) -> dict[str, Any]:
        """The attributes that differ from their declared defaults (what the printer shows)."""
        shown = {}
        for key, value in attrs.items():
            spec = cls.attrs.get(key)
            if spec is not None and spec.default is not None and not spec.required \
                    and _coerce(key, spec, spec.default) == value:
                continue
            shown[key] = value
        return shown

    @classmethod
    def core_of(cls, attrs: Mapping[str, Any]) -> str:
        return attrs.get("core") or cls.core

    @classmethod
    def reference_fn(cls) -> Callable[..., Any]:
        if cls.reference is None:
            raise ShapeError(f"op '{cls.name}' has no numpy reference")
        return cls.reference

    @classmethod
    def reference_name(cls) -> str:
        """`module:function` of the numpy reference ("" without one), as reports and generated headers show it."""
        fn = cls.reference
        return f"{fn.__module__}:{fn.__qualname__}" if fn is not None else ""


class numpy_reference:
    """`reference = numpy_reference("elementwise", "add")` in an OpDef: the function `add` of
    dspark_ir/semantics/elementwise.py, imported when first read."""

    def __init__(self, family: str, function: str):
        self.family, self.function = family, function
        self.op = "?"

    def __set_name__(self, owner: type, name: str) -> None:
        self.op = getattr(owner, "name", owner.__name__)

    def __get__(self, obj: object, owner: type | None = None) -> Callable[..., Any]:
        module = f"{__package__.rsplit('.', 1)[0]}.semantics.{self.family}"
        fn = getattr(importlib.import_module(module), self.function, None)
        if fn is None:   # tests/ir/test_semantics_coverage.py reads every op's reference
            raise AttributeError(f"op '{self.op}': its numpy reference {module}:{self.function} does not exist")
        return fn


OP_REGISTRY: dict[str, type[OpDef]] = {}


def register_op(cls: type[OpDef]) -> type[OpDef]:
    assert cls.name not in OP_REGISTRY, f"op '{cls.name}' registered twice"
    assert cls.lowers_to in LOWERS_TO, f"{cls.name}: lowers_to '{cls.lowers_to}' is not one of {', '.join(LOWERS_TO)}"
    for key, spec in cls.attrs.items():
        assert key not in COMMON_ATTRS, f"{cls.name}: '{key}' shadows a common attribute"
        assert isinstance(spec, Attr)
    OP_REGISTRY[cls.name] = cls
    return cls


def get_op(name: str) -> type[OpDef]:
    cls = OP_REGISTRY.get(name)
    if cls is not None:             # registration is append-only (register_op refuses a second one): no need
        return cls                  # to load the op modules again
    from . import load_all

    load_all()
    try:
        return OP_REGISTRY[name]
    except KeyError:
        raise ShapeError(f"unknown op '{name}'{did_you_mean(name, OP_REGISTRY)}") from None


# ---- helpers for shape rules ----------------------------------------------------------------
def expect(cond: bool, message: str) -> None:
    if not cond:
        raise ShapeError(message)


def expect_rank(t: TensorType, rank: int, what: str) -> None:
    expect(t.rank == rank, f"{what} must have rank {rank}, got {t}")


def expect_dtype(t: TensorType, allowed: "DType | tuple[DType, ...]", what: str) -> None:
    allowed_t = allowed if isinstance(allowed, tuple) else (allowed,)
    expect(t.dtype in allowed_t, f"{what} must be {'/'.join(str(a) for a in allowed_t)}, got {t}")


def expect_same_dim(a: Dim, b: Dim, what: str) -> None:
    expect(a == b, f"{what}: {a} != {b}")

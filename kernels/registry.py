"""Which pypto 0.2.0 template lowers which op kind: templates register against the op definition itself.

The key is the op's definition class (the `OpDef` subclass in `dspark_ir/ops`), never its name string, so a
renamed or removed op fails at import instead of leaving a dead dict entry:

    from dspark_ir.ops.core import RmsNorm
    from .registry import template

    @template(RmsNorm)
    def pypto_rmsnorm(spec: KernelSpec) -> str: ...

* `@template(*ops)`: the op's kernel template, `fn(KernelSpec) -> str` (one function may serve several ops).
  For a collective op it is the op's local part (e.g. window_copy_out's copy), used at every rank count.
* `@one_rank_template(*ops)`: the form of a collective when the task graph runs on one rank (every peer is
  itself, e.g. MoE dispatch/combine at EP1); used only at `ranks == 1` and only when the op has no `template`.
* `unsupported(op, reason)`: the op has no pypto form (cross-rank signalling, ...); the reason is reported by
  the pypto executor.
* `@cost_template(*ops)`: for a collective with no template, its local part at one rank (this rank's share of
  the data movement or reduction, e.g. the reduce-scatter's ordered sum of tp row slices) as pypto source for the
  cost model only: perf runs it on zeros; the lowering never runs it (its values are not the collective's, the
  link transfer and barriers are not in it).

Registering an op twice in the same table, a template for an op declared unsupported (or the reverse), or
anything that is not a registered op definition raises `RegistryError` at import. The lowering asks
`template_for(opdef, ranks)` and `unsupported_reason(opdef)`; both load every template module first.
"""
from __future__ import annotations

import importlib
import pkgutil
from typing import Callable

from dspark_ir.ops import OP_REGISTRY, OpDef

from .pto import KernelSpec

Template = Callable[[KernelSpec], str]

_TEMPLATES: dict[type[OpDef], Template] = {}
_ONE_RANK: dict[type[OpDef], Template] = {}
_UNSUPPORTED: dict[type[OpDef], str] = {}
_COST: dict[type[OpDef], Template] = {}
_loaded = False


class RegistryError(Exception):
    """A kernel registration that names no op, names one twice, or contradicts another registration."""


def _op_name(op: object) -> str:
    return getattr(op, "name", None) or repr(op)


def _check_op(op: object, what: str) -> type[OpDef]:
    if not (isinstance(op, type) and issubclass(op, OpDef) and OP_REGISTRY.get(getattr(op, "name", "")) is op):
        raise RegistryError(f"{what} registered for {op!r}, which is not a registered op definition "
                            f"(pass the OpDef subclass from dspark_ir.ops, e.g. `@template(RmsNorm)`)")
    return op


def _where(fn: object) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _add(table: dict, op: object, value: object, what: str) -> None:
    opdef = _check_op(op, what)
    if opdef in table:
        first = table[opdef]
        raise RegistryError(f"{what} for op '{opdef.name}' registered twice: "
                            f"{_where(first) if callable(first) else repr(first)} and "
                            f"{_where(value) if callable(value) else repr(value)}")
    if table is _TEMPLATES and opdef in _UNSUPPORTED:
        raise RegistryError(f"op '{opdef.name}' gets a template ({_where(value)}) but is declared unsupported")
    if table is _TEMPLATES and opdef in _COST:
        raise RegistryError(f"op '{opdef.name}' gets a template ({_where(value)}) but has a cost template "
                            f"({_where(_COST[opdef])}): the template is its cost form")
    if table is _UNSUPPORTED and opdef in _TEMPLATES:
        raise RegistryError(f"op '{opdef.name}' is declared unsupported but has a template "
                            f"({_where(_TEMPLATES[opdef])})")
    table[opdef] = value


def template(*ops: type[OpDef]) -> Callable[[Template], Template]:
    """Register the decorated function as the pypto template of each op in `ops`."""
    if not ops:
        raise RegistryError("@template needs at least one op definition")

    def register(fn: Template) -> Template:
        for op in ops:
            _add(_TEMPLATES, op, fn, "template")
        return fn
    return register


def one_rank_template(*ops: type[OpDef]) -> Callable[[Template], Template]:
    """Register the decorated function as the one-rank form of each collective op in `ops`."""
    if not ops:
        raise RegistryError("@one_rank_template needs at least one op definition")

    def register(fn: Template) -> Template:
        for op in ops:
            opdef = _check_op(op, "one-rank template")
            if not opdef.collective:
                raise RegistryError(f"one-rank template {_where(fn)} for op '{opdef.name}', which is not a "
                                    f"collective: register it with @template")
            _add(_ONE_RANK, opdef, fn, "one-rank template")
        return fn
    return register


def cost_template(*ops: type[OpDef]) -> Callable[[Template], Template]:
    """Register the decorated function as the cost-model form of each collective op in `ops` (its local part)."""
    if not ops:
        raise RegistryError("@cost_template needs at least one op definition")

    def register(fn: Template) -> Template:
        for op in ops:
            opdef = _check_op(op, "cost template")
            if not opdef.collective:
                raise RegistryError(f"cost template {_where(fn)} for op '{opdef.name}', which is not a "
                                    f"collective: its template is its cost form")
            if opdef in _TEMPLATES:
                raise RegistryError(f"cost template {_where(fn)} for op '{opdef.name}', which has a template "
                                    f"({_where(_TEMPLATES[opdef])}): the template is its cost form")
            _add(_COST, opdef, fn, "cost template")
        return fn
    return register


def unsupported(op: type[OpDef], reason: str) -> None:
    """Declare that `op` has no pypto 0.2.0 form, and why (one or more sentences; see `unsupported_reason`)."""
    if not isinstance(reason, str) or not reason.strip():
        raise RegistryError(f"unsupported op '{_op_name(op)}' needs a non-empty reason")
    _add(_UNSUPPORTED, op, reason, "unsupported reason")


# ---- lookups ------------------------------------------------------------------------------------------------
def load_templates() -> None:
    """Import every module of this package once (their decorators fill the tables)."""
    global _loaded
    if _loaded:
        return
    _loaded = True
    package = importlib.import_module(__package__)
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if not info.ispkg:
            importlib.import_module(f"{__package__}.{info.name}")


def template_for(op: type[OpDef], ranks: int = 0) -> Template | None:
    """The op's pypto template, or None. At one rank (`ranks` == 1) an op without a template falls back to its
    one-rank form, if it has one."""
    load_templates()
    found = _TEMPLATES.get(op)
    if found is None and ranks == 1:
        found = _ONE_RANK.get(op)
    return found


def cost_template_for(op: type[OpDef]) -> Template | None:
    """The collective's cost-model form (its local part at one rank), or None. Never a lowering template."""
    load_templates()
    return _COST.get(op)


def unsupported_reason(op: type[OpDef]) -> str | None:
    """Why the op has no pypto form (None when it has one or nothing was declared)."""
    load_templates()
    return _UNSUPPORTED.get(op)


def templates() -> dict[type[OpDef], Template]:
    load_templates()
    return dict(_TEMPLATES)


def one_rank_templates() -> dict[type[OpDef], Template]:
    load_templates()
    return dict(_ONE_RANK)


def unsupported_ops() -> dict[type[OpDef], str]:
    load_templates()
    return dict(_UNSUPPORTED)

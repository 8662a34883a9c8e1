"""The pass registry: kebab-case name → pass class, with lazy import.

A pass named `topk-bypass` lives in `passes/topk_bypass.py`: every module of the `passes` package is one
pass (the machinery is this sub-package, `passes.infra`). Listing the names does not import anything, and
the first `get_pass("topk-bypass")` imports that one module. Passes registered at run time (tests,
`dspark opt --plugin MODULE`) join the same name space.
"""
from __future__ import annotations

import importlib
import pkgutil
from functools import lru_cache
from typing import TYPE_CHECKING

from dspark_ir.errors import did_you_mean

from .errors import PipelineError

if TYPE_CHECKING:
    from .base import Pass

PASSES_PACKAGE = __package__.rpartition(".")[0]     # "passes": one module per pass

_REGISTRY: dict[str, type["Pass"]] = {}


def add(cls: type["Pass"]) -> None:
    old = _REGISTRY.get(cls.name)
    if old is not None and (old.__module__, old.__qualname__) != (cls.__module__, cls.__qualname__):
        raise TypeError(f"pass '{cls.name}' is registered twice ({old.__module__} and {cls.__module__})")
    _REGISTRY[cls.name] = cls


@lru_cache(maxsize=1)
def pass_modules() -> dict[str, str]:
    """kebab name → module name, for every module of the passes package (nothing is imported); its
    sub-packages (the machinery) are not passes."""
    from .. import __path__ as package_path

    modules = {}
    for info in pkgutil.iter_modules(package_path):
        if info.ispkg or info.name.startswith("_"):
            continue
        modules[info.name.replace("_", "-")] = f"{PASSES_PACKAGE}.{info.name}"
    return modules


def registered_names() -> list[str]:
    return sorted(set(pass_modules()) | set(_REGISTRY))


def get_pass(name: str) -> type["Pass"]:
    """The pass class for `name`; raises PipelineError with a did-you-mean (no location)."""
    if name not in _REGISTRY and name in pass_modules():
        importlib.import_module(pass_modules()[name])
        if name not in _REGISTRY:
            raise TypeError(f"module {pass_modules()[name]} does not register a pass named '{name}'")
    try:
        return _REGISTRY[name]
    except KeyError:
        raise PipelineError(f"unknown pass '{name}'{did_you_mean(name, registered_names())}") from None


def summary(name: str) -> str:
    """First line of the pass's docstring (used by `dspark list passes`). A pass module not imported yet is read,
    not imported: listing the passes stays fast (benchmarks/cli_startup.py)."""
    if name not in _REGISTRY and name in pass_modules():
        text = _docstring_without_import(pass_modules()[name], name)
        if text is not None:
            return text.strip().splitlines()[0] if text.strip() else ""
    return get_pass(name).summary()


def _docstring_without_import(module: str, name: str) -> str | None:
    """The docstring of the class in `module` whose `name = "<name>"`, from its source; None if not found."""
    import ast
    import importlib.util

    spec = importlib.util.find_spec(module)
    if spec is None or not spec.origin:
        return None
    with open(spec.origin, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for stmt in cls.body:
            if (isinstance(stmt, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "name" for t in stmt.targets)
                    and isinstance(stmt.value, ast.Constant) and stmt.value.value == name):
                return ast.get_docstring(cls) or ""
    return None


def describe(name: str) -> str:
    """What `dspark help PASS` and `dspark list passes -v` print: the summary, where the rewrite comes from, its
    numeric contract, properties, whether the default pipeline runs it, and each option with its type, default
    and range; `help` adds the docstring below."""
    from .defaults import DEFAULT_PIPELINE
    from .options import format_value, option_specs
    from .pipeline import parse_entries

    cls = get_pass(name)
    default = [e for e in DEFAULT_PIPELINE if parse_entries(e.spec, "default pipeline")[0].name == name]
    where = ("in the default pipeline" if default and default[0].enabled else
             "in the default pipeline, off by default (--enable)" if default else "not in the default pipeline")
    plugin = "" if is_builtin(cls) else f" (plugin {cls.__module__})"
    lines = [f"{name}: {cls.summary()}",
             f"  origin:     {cls.origin or 'not declared'}{plugin}",
             f"  contract:   {cls.contract}",
             f"  pipeline:   {where}"]
    for attr in ("requires", "guarantees", "preserves"):
        if getattr(cls, attr):
            lines.append(f"  {attr + ':':<11} {', '.join(sorted(getattr(cls, attr)))}")
    specs = option_specs(cls)
    if not specs:
        lines.append("  options:    none")
    for i, (key, spec) in enumerate(specs.items()):
        rng = f", {spec.range_text}" if spec.range_text else ""
        lines.append(f"  {'options:' if i == 0 else '':<11} {key} ({spec.type_name}{rng}; default "
                     f"{format_value(spec, spec.default)})")
    return "\n".join(lines)


def is_builtin(cls: type["Pass"]) -> bool:
    return cls.__module__.startswith(f"{PASSES_PACKAGE}.")

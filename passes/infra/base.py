"""The pass base class and the records a pass produces.

A pass is a frozen dataclass registered with `@register_pass`. Its fields are its options (typed, with
defaults; they round-trip through the pipeline string). Class attributes declare the rest:

    name        kebab-case name used everywhere (pipeline strings, --disable, dumps)
    contract    numeric contract checked by --check-numerics (passes.infra.contracts)
    requires    graph properties (passes.infra.properties) that must hold before it runs, and `layer:<kind>`
                entries: a pass that requires `layer:decode-swa` is skipped on other layers (not applicable)
    guarantees  properties that hold after it runs (checked with --verify-each)
    preserves   properties it keeps when it changes the graph (others are assumed broken)
    fixpoint    the driver repeats match/rewrite rounds until nothing fires (default True)
    version     bump when the pass's output changes for the same input (part of the cache key)
    origin      where the rewrite comes from: the seed PR (and its dspark-model.md section), a later public
                pypto-lib form, or ours (shown by `dspark list passes -v` and `dspark help PASS`)
Options with a valid range are declared `ways: int = option(4, min=1)` (passes.infra.options.option).

Two ways to write the body:
* `match(g)` yields sites (anything; a Node or an object with a `.node` is checked for staleness) and
  `Skip(at, reason)` records for candidates that did not fire; `rewrite(g, site)` rewrites one site and
  returns a `RewriteRecord`, or None when the site no longer applies. The manager walks, counts rewrites
  (for --bisect-rewrites), verifies and dumps. `match` is consumed lazily, after each rewrite: iterate over
  a list (e.g. `g.topo_order()`), not over a live dict.
* or override `run(g)` to rewrite the whole graph at once; it returns the list of RewriteRecords.
New nodes take names derived from the nodes they replace (`g.fresh_name(old.name + ".part")`).
"""
from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any, ClassVar, Iterable

from dspark_ir.graph import Graph

from .contracts import BITWISE, Contract

KEBAB_RE = re.compile(r"[a-z][a-z0-9]*(-[a-z0-9]+)*\Z")


@dataclass(frozen=True)
class Skip:
    """A candidate site that did not fire, and why (shown by `dspark opt --explain NAME`)."""

    at: str
    reason: str

    def __str__(self) -> str:
        return f"%{self.at}: {self.reason}"


@dataclass(frozen=True)
class RewriteRecord:
    """One applied rewrite: which rule, at which node, and a short human description."""

    rule: str
    at: str
    detail: str = ""

    def __str__(self) -> str:
        return f"{self.rule} at %{self.at}" + (f": {self.detail}" if self.detail else "")


class Pass:
    """Base of every pass. Subclass as a frozen dataclass and decorate with @register_pass."""

    name: ClassVar[str]
    contract: ClassVar[Contract] = BITWISE
    requires: ClassVar[frozenset[str]] = frozenset()
    guarantees: ClassVar[frozenset[str]] = frozenset()
    preserves: ClassVar[frozenset[str]] = frozenset()
    fixpoint: ClassVar[bool] = True
    version: ClassVar[int] = 1
    origin: ClassVar[str] = ""

    def __post_init__(self) -> None:
        from .options import check_ranges

        check_ranges(self)      # the ranges declared with options.option(...): ValueError names the option

    def match(self, g: Graph) -> Iterable[Any]:
        raise NotImplementedError

    def rewrite(self, g: Graph, site: Any) -> RewriteRecord | None:
        raise NotImplementedError

    def run(self, g: Graph) -> list[RewriteRecord]:
        raise NotImplementedError

    def intended(self, g: Graph) -> Graph:
        """The graph whose values this pass's output must match under its contract (--check-numerics): `g` for a
        pass that keeps values. A pass that repairs a defect (a top-k whose sort misses keys) overrides it: `g`
        with the defect's intended meaning, built without the pass's own rewrite, so the check still compares
        two independent computations."""
        return g

    @classmethod
    def whole_graph(cls) -> bool:
        """True when the pass overrides run() instead of match()/rewrite()."""
        return cls.run is not Pass.run

    @classmethod
    def summary(cls) -> str:
        return (cls.__doc__ or "").strip().splitlines()[0]

    def options(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def __str__(self) -> str:
        from .pipeline import format_pass

        return format_pass(self)


def register_pass(cls: type[Pass]) -> type[Pass]:
    """Class decorator: check the declaration and add the pass to the registry."""
    from . import registry
    from .options import option_specs

    where = f"{cls.__module__}.{cls.__qualname__}"
    if not (isinstance(cls, type) and issubclass(cls, Pass)):
        raise TypeError(f"{where}: a pass must subclass passes.Pass")
    if not dataclasses.is_dataclass(cls) or not cls.__dataclass_params__.frozen:  # type: ignore[attr-defined]
        raise TypeError(f"{where}: decorate the pass with @dataclass(frozen=True) below @register_pass")
    name = cls.__dict__.get("name")
    if not isinstance(name, str) or not KEBAB_RE.match(name):
        raise TypeError(f"{where}: `name` must be a kebab-case string, got {name!r}")
    doc = (cls.__doc__ or "").strip()
    if not doc or doc == Pass.__doc__ or doc.startswith(f"{cls.__name__}("):  # dataclass() fills in a signature
        raise TypeError(f"{where}: a pass needs a docstring (what it rewrites and why)")
    if not isinstance(cls.contract, Contract):
        raise TypeError(f"{where}: `contract` must be a passes.Contract")
    if not cls.whole_graph() and (cls.match is Pass.match or cls.rewrite is Pass.rewrite):
        raise TypeError(f"{where}: implement match() and rewrite(), or run()")
    for attr in ("requires", "guarantees", "preserves"):
        setattr(cls, attr, frozenset(getattr(cls, attr)))
    option_specs(cls)  # raises TypeError on an unsupported option type
    registry.add(cls)
    return cls

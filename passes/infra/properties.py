"""Graph properties that passes require and guarantee.

A property has a checker `check(g) -> None | str` (None: holds; else why not) and the pass that
establishes it. Requirements of the form `layer:<kind>` are applicability conditions instead: a pass that
requires `layer:decode-swa` does not run on a graph whose `layer` attribute differs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from dspark_ir.graph import Graph
from dspark_ir.ops.indexer import IdxTopk, unsorted_prefix

from .base import Skip


@dataclass(frozen=True)
class Property:
    name: str
    check: Callable[[Graph], "str | None"]
    established_by: str


PROPERTIES: dict[str, Property] = {}


def register_property(name: str, check: Callable[[Graph], "str | None"], established_by: str) -> None:
    PROPERTIES[name] = Property(name, check, established_by)


def first_site(pass_name: str, g: Graph) -> str | None:
    """Where pass `pass_name` would still fire on `g` (None: nowhere): the generic property checker."""
    from .registry import get_pass

    p = get_pass(pass_name)()
    for site in p.match(g):
        if isinstance(site, Skip):
            continue
        node = getattr(site, "node", site)
        return f"'{pass_name}' would still rewrite %{getattr(node, 'name', site)}"
    return None


def _topk_sorts_prefix(g: Graph) -> str | None:
    for node in g.ops(IdxTopk.name):
        why = unsorted_prefix(node.attrs)
        if why is not None:
            return f"%{node.name}: {why}"
    return None


register_property("topk-sorts-prefix", _topk_sorts_prefix, "topk-merge-stage")
register_property("canonical", lambda g: first_site("canonicalize", g), "canonicalize")
register_property("no-common-subexpressions", lambda g: first_site("cse", g), "cse")
register_property("no-dead-nodes", lambda g: first_site("dce", g), "dce")


def applicability(requires: frozenset[str], g: Graph) -> str | None:
    """Why a pass does not apply to `g` (a `layer:` requirement fails), or None."""
    layer = str(g.attributes.get("layer", ""))
    kinds = sorted(r.split(":", 1)[1] for r in requires if r.startswith("layer:"))
    if kinds and layer not in kinds:
        return f"needs layer {' or '.join(kinds)}, graph is {layer or 'not a layer'}"
    return None


def unmet(required: frozenset[str], established: set[str], g: Graph) -> tuple[str, str] | None:
    """(property, reason) for the first required property that is neither established nor true on `g`."""
    for name in sorted(r for r in required if not r.startswith("layer:")):
        if name in established:
            continue
        prop = PROPERTIES.get(name)
        if prop is None:
            return name, "no such property is registered"
        reason = prop.check(g)
        if reason is not None:
            return name, f"{reason} (run '{prop.established_by}' before it)"
        established.add(name)
    return None


def broken(guaranteed: frozenset[str], g: Graph) -> tuple[str, str] | None:
    """(property, reason) for the first guaranteed property that does not hold on `g`."""
    for name in sorted(guaranteed):
        prop = PROPERTIES.get(name)
        reason = prop.check(g) if prop is not None else None
        if reason is not None:
            return name, reason
    return None

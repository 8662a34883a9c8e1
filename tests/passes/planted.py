"""Passes that exist only in tests: each is wrong in one known way, or probes the option syntax."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from passes import BITWISE, Pass, RewriteRecord, bounded_reassoc, register_pass
from passes.infra.rewriting import replace_node, set_attrs


@register_pass
@dataclass(frozen=True)
class PlantedAddToMul(Pass):
    """(test only) Rewrites add(a, b) into mul(a, b) while declaring a bitwise contract: a wrong pass."""

    name = "planted-add-to-mul"
    contract = BITWISE

    def match(self, g):
        return [n for n in g.topo_order() if n.op == "add"]

    def rewrite(self, g, node):
        new = g.add_op("mul", node.operands, names=g.fresh_name(node.name + ".mul"), near=node)
        replace_node(g, node, new.results)
        return RewriteRecord("add-to-mul", node.name, f"-> %{new.name}")


@register_pass
@dataclass(frozen=True)
class PlantedRounding(Pass):
    """(test only) Rounds every f32 matmul result through bf16 while declaring bounded-reassoc(4)."""

    name = "planted-rounding"
    contract = bounded_reassoc(4)

    def match(self, g):
        return [n for n in g.topo_order() if n.op == "matmul" and str(n.result.type).startswith("f32")
                and not any(u.name.startswith(n.name + ".rb") for u in g.users(n.result))]

    def rewrite(self, g, node):
        down = g.add_op("cast", [node.result], {"to": "bf16"}, names=g.fresh_name(node.name + ".rb"), near=node)
        up = g.add_op("cast", [down.result], {"to": "f32"}, names=g.fresh_name(node.name + ".rf"), near=down)
        g.replace_uses(node.result, up.result, skip=down)
        return RewriteRecord("round-through-bf16", node.name)


@register_pass
@dataclass(frozen=True)
class PlantedCrash(Pass):
    """(test only) Raises ZeroDivisionError on the first rmsnorm it sees."""

    name = "planted-crash"

    def match(self, g):
        return [n for n in g.topo_order() if n.op == "rmsnorm"]

    def rewrite(self, g, node):
        return RewriteRecord("crash", node.name, str(1 // 0))


@register_pass
@dataclass(frozen=True)
class PlantedInvalid(Pass):
    """(test only) Changes a reshape's target shape without changing its result type: an invalid graph."""

    name = "planted-invalid"
    fixpoint = False

    def match(self, g):
        return [n for n in g.topo_order() if n.op == "reshape"][:1]

    def rewrite(self, g, node):
        set_attrs(g, node, shape=tuple(reversed(node.attrs["shape"])) + (1,))
        return RewriteRecord("bad-shape", node.name)


@register_pass
@dataclass(frozen=True)
class PlantedNeedsCanonical(Pass):
    """(test only) Does nothing, but requires the canonical property (for requirement checks)."""

    name = "planted-needs-canonical"
    requires = frozenset({"canonical"})

    def run(self, g):
        return []


@register_pass
@dataclass(frozen=True)
class PlantedSwaOnly(Pass):
    """(test only) Does nothing; applies to decode-swa layers only (for applicability checks)."""

    name = "planted-swa-only"
    requires = frozenset({"layer:decode-swa"})

    def run(self, g):
        return []


@register_pass
@dataclass(frozen=True)
class PlantedOptions(Pass):
    """(test only) A no-op pass with one option of every supported type (pipeline syntax tests)."""

    name = "planted-options"
    ways: int = 4
    scale: float = 1.0
    strict: bool = False
    label: str = "x"
    mode: Literal["ascending", "descending", "any order"] = "ascending"
    tiles: tuple[int, ...] = ()
    weights: tuple[float, ...] = (0.5,)
    tags: tuple[str, ...] = ()

    def run(self, g):
        return []

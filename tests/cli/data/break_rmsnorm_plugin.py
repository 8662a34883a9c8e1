"""A test-only pass that breaks its numeric contract on one op: it drops every rmsnorm whose input has its
output's type (readers read the un-normalised input), while declaring the contract BITWISE."""
from dataclasses import dataclass

from dspark_ir.ops.core import RmsNorm
from passes.infra.base import Pass, RewriteRecord, register_pass
from passes.infra.contracts import BITWISE


@register_pass
@dataclass(frozen=True)
class BreakRmsnorm(Pass):
    """Test only: skip rmsnorm (breaks the BITWISE contract on purpose)."""

    name = "test-break-rmsnorm"
    contract = BITWISE

    def match(self, g):
        for node in g.topo_order():
            if node.opdef is RmsNorm and node.operands[0].type == node.result.type:
                yield node

    def rewrite(self, g, node):
        g.replace_uses(node.result, node.operands[0])
        g.remove_node(node)
        return RewriteRecord("skip", node.name, "readers read its input")

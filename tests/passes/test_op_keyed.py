"""Passes compare ops through the op class (`node.opdef is Matmul`) and create nodes through the op's one name
constant (`g.add_op(Matmul.name, ...)`): a renamed op fails at import, not quietly in a pass that stops matching.
Op names given as pass options (`ops`, `follow`, `barrier_notifiers`) stay names: the user writes them."""
from __future__ import annotations

import re
from pathlib import Path

import passes

PASSES = Path(passes.__file__).parent
# `.op == "x"`, `.op in ("x", ...)`, `add_op("x"`, `g.ops("x")`, `names_of_op("x")`, `get_op("x")`
NAME_KEYED = re.compile(r"""\.op\s*(==|!=|(not\s+)?in\s*[(\[{])\s*["']|\b(add_op|ops|names_of_op|get_op)\(\s*["']""")


def test_no_pass_keys_an_op_by_a_name_literal():
    found = [f"{path.relative_to(PASSES.parent)}:{i}: {line.strip()}"
             for path in sorted(PASSES.rglob("*.py"))
             for i, line in enumerate(path.read_text().splitlines(), 1) if NAME_KEYED.search(line)]
    assert not found, "op named by a string literal (use the op class or its .name):\n" + "\n".join(found)


def test_the_check_catches_name_literals():
    assert NAME_KEYED.search('if node.op == "matmul":')
    assert NAME_KEYED.search("if u.op in ('slice', 'reshape'):")
    assert NAME_KEYED.search('g.add_op("signal_barrier", [w], {})')
    assert not NAME_KEYED.search("if node.opdef is Matmul:")
    assert not NAME_KEYED.search("g.add_op(SignalBarrier.name, [w], {})")

"""Every op kind that lowers to a kernel has a pypto 0.2.0 template or a recorded reason why it has none.

A family module `kernels/<family>.py` registers `PYPTO_TEMPLATES = {op: fn}` and, for the op kinds pypto 0.2.0
cannot express faithfully on CPU (cross-rank signalling, ...), `PYPTO_UNSUPPORTED = {op: "reason"}` in its
`# ---- pypto 0.2.0 template` section. One test per op kind (`pytest -v` lists them all, as
`family:op`); `python -m tests.lowering.test_template_coverage` prints the table. No pypto needed.
"""
from __future__ import annotations

import importlib

import pytest

from lowering import template_coverage

# Op kinds still without a template or a reason while their family's template work is in progress (owner in
# the reason). Non-strict xfail: an entry whose family has caught up just passes; remove it then.
PENDING: dict[str, str] = {}


def _module(family: str | None):
    if not family:
        return None
    try:
        return importlib.import_module(f"kernels.{family}")
    except ImportError:
        return None


def coverage_table() -> dict[str, tuple[str, str, str]]:
    """op kind → (family, status, detail): status is `template`, `unsupported` (detail: the reason) or `missing`."""
    from dspark_ir.ops import OP_REGISTRY, load_all

    load_all()
    table = {}
    for op in sorted(template_coverage()):
        family = OP_REGISTRY[op].family or ""
        module = _module(family)
        templates = getattr(module, "PYPTO_TEMPLATES", None) or {}
        unsupported = getattr(module, "PYPTO_UNSUPPORTED", None) or {}
        if op in templates:
            table[op] = (family, "template", templates[op].__name__)
        elif op in unsupported:
            table[op] = (family, "unsupported", str(unsupported[op]))
        else:
            table[op] = (family, "missing", "")
    return table


def format_table(table) -> str:
    lines = [f"{'family':<15} {'op':<32} status"]
    for op, (family, status, detail) in sorted(table.items(), key=lambda kv: (kv[1][0], kv[0])):
        lines.append(f"{family:<15} {op:<32} {status}{': ' + detail if detail else ''}")
    return "\n".join(lines)


TABLE = coverage_table()


def _param(op):
    family = TABLE[op][0]
    marks = [pytest.mark.xfail(reason=PENDING[op], strict=False)] if op in PENDING else []
    return pytest.param(op, id=f"{family}:{op}", marks=marks)


@pytest.mark.parametrize("op", [_param(op) for op in sorted(TABLE)])
def test_op_has_template_or_unsupported_reason(op):
    family, status, detail = TABLE[op]
    assert status != "missing", (f"op '{op}' (kernels/{family}.py) has neither a pypto 0.2.0 template in "
                                 f"PYPTO_TEMPLATES nor a reason in PYPTO_UNSUPPORTED")
    if status == "unsupported":
        assert detail.strip(), f"op '{op}': empty PYPTO_UNSUPPORTED reason"


def test_no_op_is_both_templated_and_unsupported():
    both = []
    for op, (family, _, _) in TABLE.items():
        module = _module(family)
        if op in (getattr(module, "PYPTO_TEMPLATES", None) or {}) and \
                op in (getattr(module, "PYPTO_UNSUPPORTED", None) or {}):
            both.append(op)
    assert not both, f"listed in both PYPTO_TEMPLATES and PYPTO_UNSUPPORTED: {both}"


def test_registrations_name_ops_of_their_family():
    """A template or reason registered under an op kind of another family (or no op at all) is dead: the
    lowering looks an op up in its own family's module only."""
    from dspark_ir.ops import OP_REGISTRY, load_all

    load_all()
    stray = []
    for family in sorted({op.family for op in OP_REGISTRY.values() if op.family}):
        module = _module(family)
        for attr in ("PYPTO_TEMPLATES", "PYPTO_UNSUPPORTED"):
            for op in getattr(module, attr, None) or {}:
                if op not in OP_REGISTRY or OP_REGISTRY[op].family != family:
                    stray.append(f"kernels/{family}.py {attr}[{op!r}]")
    assert not stray, stray


def test_pending_entries_are_real_gaps_or_stale():
    """PENDING only names op kinds that lower to kernels (a typo would silently xfail nothing)."""
    assert set(PENDING) <= set(TABLE), set(PENDING) - set(TABLE)


if __name__ == "__main__":
    print(format_table(TABLE))

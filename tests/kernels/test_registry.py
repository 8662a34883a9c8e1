"""The kernel registry: every op kind that lowers to a kernel task has a pypto form or a recorded reason.

`kernels.registry` keys templates by the op definition (the OpDef subclass), so a registration can only name an
op that exists. What it cannot know is an op with nothing registered: one test per op kind that the lowering
emits as a kernel (`pytest -v` lists them by op name) checks it has a template, a one-rank form or an
`unsupported` reason. View ops that are always views (slice) and dummy ops (join) never become kernel tasks
(`lowering.template_coverage` leaves them out). `python -m tests.kernels.test_registry` prints the table.
No pypto needed.
"""
from __future__ import annotations

import importlib
import sys

import pytest

from dspark_ir.ops import OP_REGISTRY, OpDef, load_all
from dspark_ir.ops.core import RmsNorm, Slice
from dspark_ir.ops.moe import DispatchMeta
from kernels import registry
from kernels.registry import RegistryError
from lowering import template_coverage


def coverage_table() -> dict[str, tuple[str, str]]:
    """op kind → (status, detail): `template` / `one-rank` (detail: the function), `unsupported` (the reason) or
    `missing`, for every op kind the lowering emits as a kernel task."""
    load_all()
    table = {}
    for name in sorted(template_coverage()):
        opdef = OP_REGISTRY[name]
        if registry.template_for(opdef) is not None:
            table[name] = ("template", registry.template_for(opdef).__name__)
        elif registry.template_for(opdef, ranks=1) is not None:
            table[name] = ("one-rank", registry.template_for(opdef, ranks=1).__name__)
        elif registry.unsupported_reason(opdef):
            table[name] = ("unsupported", registry.unsupported_reason(opdef))
        else:
            table[name] = ("missing", "")
    return table


TABLE = coverage_table()


@pytest.mark.parametrize("op", sorted(TABLE))
def test_op_has_template_one_rank_form_or_unsupported_reason(op):
    status, _ = TABLE[op]
    assert status != "missing", (f"op '{op}' (family {OP_REGISTRY[op].family}) lowers to a kernel task but has no "
                                 f"@template, no @one_rank_template and no unsupported(...) reason in kernels/")


def test_a_one_rank_form_comes_with_the_reason_the_op_has_no_template():
    for op in registry.one_rank_templates():
        assert registry.unsupported_reason(op), f"op '{op.name}': one-rank form but no reason for the EP > 1 case"


def test_collectives_without_a_template_are_explained():
    load_all()
    silent = [name for name, op in OP_REGISTRY.items() if op.collective and registry.template_for(op) is None
              and not registry.unsupported_reason(op)]
    assert not silent, silent


def test_lookups_are_keyed_by_the_op_definition():
    assert registry.template_for(RmsNorm).__name__ == "pypto_rmsnorm"
    assert registry.template_for(DispatchMeta) is None
    assert registry.template_for(DispatchMeta, ranks=1).__name__ == "pypto_dispatch_meta_ep1"
    assert "remote_store" in registry.unsupported_reason(DispatchMeta)
    assert registry.unsupported_reason(RmsNorm) is None


def test_registering_a_template_twice_fails_with_both_places():
    with pytest.raises(RegistryError, match=r"'rmsnorm' registered twice: kernels\.norm\.pypto_rmsnorm and "):
        registry.template(RmsNorm)(lambda spec: "")
    assert registry.template_for(RmsNorm).__name__ == "pypto_rmsnorm"


@pytest.mark.parametrize("bad", ["rmsnorm", OpDef, type("Unregistered", (OpDef,), {"name": "unregistered_op"})])
def test_registering_for_a_non_op_fails(bad):
    with pytest.raises(RegistryError, match="not a registered op definition"):
        registry.template(bad)(lambda spec: "")


def test_contradicting_registrations_fail():
    with pytest.raises(RegistryError, match="'rmsnorm' is declared unsupported but has a template"):
        registry.unsupported(RmsNorm, "no reason")
    with pytest.raises(RegistryError, match="'rmsnorm', which is not a collective"):
        registry.one_rank_template(RmsNorm)(lambda spec: "")
    with pytest.raises(RegistryError, match="needs a non-empty reason"):
        registry.unsupported(Slice, " ")


def test_cost_forms_are_local_parts_of_untemplated_collectives():
    """The all-to-all and the reduce-scatter have a cost form (their local part, for perf) and still no lowering
    template; a cost form for a non-collective or for an op with a template is refused."""
    from dspark_ir.ops.collective import OGroupA2A, TpOReduceScatter, WindowCopyOut

    for op in (OGroupA2A, TpOReduceScatter):
        assert registry.cost_template_for(op) is not None and registry.template_for(op) is None
        assert registry.unsupported_reason(op)
    assert registry.cost_template_for(WindowCopyOut) is None and registry.template_for(WindowCopyOut) is not None
    with pytest.raises(RegistryError, match="'rmsnorm', which is not a collective"):
        registry.cost_template(RmsNorm)(lambda spec: "")
    with pytest.raises(RegistryError, match="'window_copy_out', which has a template"):
        registry.cost_template(WindowCopyOut)(lambda spec: "")
    with pytest.raises(RegistryError, match="'o_group_a2a' registered twice"):
        registry.cost_template(OGroupA2A)(lambda spec: "")


def test_a_duplicate_registration_fails_when_its_module_is_imported(tmp_path, monkeypatch):
    (tmp_path / "dup_kernels.py").write_text(
        "from dspark_ir.ops.core import RmsNorm\n"
        "from kernels.registry import template\n\n\n"
        "@template(RmsNorm)\n"
        "def pypto_rmsnorm_again(spec):\n"
        "    return ''\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(RegistryError, match="'rmsnorm' registered twice: .* and dup_kernels.pypto_rmsnorm_again"):
            importlib.import_module("dup_kernels")
    finally:
        sys.modules.pop("dup_kernels", None)


def format_table(table) -> str:
    lines = [f"{'family':<15} {'op':<32} status"]
    for op, (status, detail) in sorted(table.items(), key=lambda kv: (OP_REGISTRY[kv[0]].family, kv[0])):
        lines.append(f"{OP_REGISTRY[op].family:<15} {op:<32} {status}{': ' + detail if detail else ''}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(format_table(TABLE))

"""Every op definition names numpy semantics that exist: a renamed or removed function fails here, with the op's
name (the references load on first use, so that verifying a graph never imports numpy)."""
from __future__ import annotations

import inspect

import pytest

from dspark_ir.ops import OP_REGISTRY, load_all
from dspark_ir.ops.base import numpy_reference

load_all()
WITH_REFERENCE = sorted(name for name, op in OP_REGISTRY.items() if "reference" in vars(op) or op.reference)


@pytest.mark.parametrize("name", WITH_REFERENCE)
def test_the_op_s_numpy_reference_exists(name):
    op = OP_REGISTRY[name]
    fn = op.reference_fn()
    assert callable(fn), f"op '{name}': reference {op.reference_name()} is not a function"
    assert inspect.getmodule(fn).__name__.startswith("dspark_ir.semantics."), f"op '{name}': {op.reference_name()}"


def test_every_op_that_lowers_to_a_kernel_has_semantics():
    missing = [name for name, op in OP_REGISTRY.items() if op.lowers_to == "kernel" and op.reference is None]
    assert not missing, f"kernel ops without numpy semantics: {missing}"


def test_a_renamed_function_fails_with_the_op_s_name():
    class Probe:
        name = "probe_op"
        reference = numpy_reference("elementwise", "no_such_function")

    with pytest.raises(AttributeError, match=r"op 'probe_op': its numpy reference "
                                             r"dspark_ir\.semantics\.elementwise:no_such_function does not exist"):
        Probe.reference

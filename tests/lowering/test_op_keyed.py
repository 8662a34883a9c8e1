"""The lowering's op facts are keyed by the op class: `OpDef.lowers_to` says what a node becomes, view rules are
registered against the op class (lowering/build.py). A view op without a rule fails with its name."""
from __future__ import annotations

import pytest

from dspark_ir import parse_graph
from dspark_ir.ops import OP_REGISTRY, load_all, register_op
from dspark_ir.ops.base import LOWERS_TO, OpDef
from dspark_ir.ops.core import Concat, Join, Matmul, Reshape, Slice
from lowering import LoweringError, build_task_graph, register_view_rule
from lowering.build import MAY_COPY, VIEW_RULES, lowers_to_kernel


def _ops() -> dict[str, type[OpDef]]:
    load_all()
    return dict(OP_REGISTRY)


def test_every_view_op_has_a_view_rule_and_every_rule_a_view_op():
    views = {name for name, op in _ops().items() if op.lowers_to == "view"}
    ruled = {op.name for op in VIEW_RULES}
    assert views == ruled, (f"view ops without a view rule: {sorted(views - ruled)}; "
                            f"view rules of ops that are not views: {sorted(ruled - views)}")
    assert MAY_COPY <= set(VIEW_RULES)


def test_every_op_declares_a_known_lowering_class():
    bad = {name: op.lowers_to for name, op in _ops().items() if op.lowers_to not in LOWERS_TO}
    assert not bad, bad


def test_lowering_classes_of_the_generic_ops():
    assert (Reshape.lowers_to, Slice.lowers_to, Concat.lowers_to, Join.lowers_to) == \
        ("view", "view", "placement", "dummy")
    kernels = {name for name, op in _ops().items() if lowers_to_kernel(op)}
    assert {"reshape", "concat", "matmul", "window", "signal_wait"} <= kernels     # a reshape may be a copy task
    assert not {"slice", "join"} & kernels


def test_signal_and_host_ops_are_declared_on_their_op():
    ops = _ops()
    assert {n for n, op in ops.items() if op.lowers_to == "signal"} == \
        {"signal_notify", "signal_wait", "signal_barrier", "window_release"}
    assert {n for n, op in ops.items() if op.lowers_to == "host"} == {"window"}


@pytest.fixture
def unruled_view_op():
    """A view op registered without a view rule (removed again afterwards)."""
    @register_op
    class Transpose2(OpDef):
        name = "test_transpose2"
        operands = ("x",)
        core = "none"
        lowers_to = "view"

        def infer(self, ins, attrs):
            return [ins[0].with_shape(list(reversed(ins[0].shape)))]

    yield Transpose2
    del OP_REGISTRY[Transpose2.name]
    VIEW_RULES.pop(Transpose2, None)
    MAY_COPY.discard(Transpose2)


def test_a_view_op_without_a_view_rule_fails_with_its_name(unruled_view_op):
    g = parse_graph("graph @t(%x: f32[4,8]) {\n  %y = test_transpose2(%x) : f32[8,4]\n"
                    "  %z = mul(%y, %y) : f32[8,4]\n  return %z\n}\n")
    with pytest.raises(LoweringError, match="op 'test_transpose2' lowers to a view but has no view rule"):
        build_task_graph(g)
    register_view_rule(unruled_view_op, lambda v, a: None)           # declines: a copy task
    tg = build_task_graph(g)
    assert [t.op for t in tg.tasks] == ["test_transpose2", "mul"]
    assert lowers_to_kernel(unruled_view_op)


def test_only_view_ops_take_a_view_rule():
    with pytest.raises(ValueError, match="op 'matmul' is not a view op"):
        register_view_rule(Matmul, lambda v, a: v)


def test_signal_tasks_do_nothing_at_one_rank_and_windows_are_host_steps():
    from dspark_ir import layers
    from lowering.pypto_exec import NOOP, placement
    from lowering.simulate.adapter import sim_tasks

    tg = build_task_graph(layers.build("moe", config="tiny", tp=1, ep=1))
    signals = [t for t in tg.kernels if t.op in ("signal_wait", "signal_barrier")]
    assert signals and all(placement(t, tg)[0] == NOOP for t in signals)
    roles = {s.op: s.role for s in sim_tasks(tg)}
    assert roles["window"] == "host" and roles["moe_dispatch_meta"] == "compute"

"""`dspark simulate` explores schedules by default, so a missing cross-rank edge is found at default settings.

The optimised tiny MoE graph (`dspark opt moe`, EP2) has five signal edges: deps(...) entries into or out of a
signal op (signal_wait, signal_barrier). Deleting one at a time: every deletion that changes the ordering is
reported by `dspark simulate FILE` with no flags (a deadlock naming the spinning wait, or a remote-read naming
the rank, the reading task and the wait that should have ordered it); a deletion the simulator's dependency
graph still implies through a path (combine_wait's dispatch_push dep, kept to match the seed's task list) orders
nothing new and is checked to be implied."""
from __future__ import annotations

import networkx as nx
import pytest

from dspark_cli.main import main
from dspark_ir import layers, print_graph
from dspark_ir.ops import get_op
from lowering import build_task_graph
from lowering.simulate import SimConfig, simulate
from lowering.simulate.adapter import sim_tasks
from lowering.simulate.explore import explore, schedules


def optimised_moe():
    import passes

    return passes.run_pipeline(layers.build("moe", config="tiny"), None).graph


def is_signal(node) -> bool:
    opdef = get_op(node.op)
    return getattr(opdef, "wait_operand", None) is not None or getattr(opdef, "notify_operand", None) is not None


def signal_edges(g) -> list[tuple[str, str]]:
    return [(n.name, d.name) for n in g.nodes.values() for d in n.deps
            if is_signal(n) or (d.name in g.nodes and is_signal(g.nodes[d.name]))]


def without(g, node: str, dep: str):
    h = g.clone()
    n = h.nodes[node]
    n.deps = [d for d in n.deps if d.name != dep]
    h.invalidate()
    return h


def implied(g, node: str, dep: str) -> bool:
    """The simulator's dependency graph of `g` (the edge already deleted) still orders dep before node."""
    tasks = sim_tasks(build_task_graph(g))
    graph = nx.DiGraph((d, t.id) for t in tasks for d in t.deps)
    ids = {t.name: t.id for t in tasks}
    return nx.has_path(graph, ids[dep], ids[node])


EDGES = signal_edges(optimised_moe())


def test_the_optimised_moe_has_its_five_signal_edges():
    assert EDGES == [("moe.dispatch_wait", "moe.dispatch_push"), ("moe.dispatch_gather", "moe.dispatch_wait"),
                     ("moe.shared_routed", "moe.combine_wait"), ("moe.combine_wait", "moe.combine"),
                     ("moe.combine_wait", "moe.dispatch_push")]


def test_the_optimised_moe_is_clean_at_default_settings(tmp_path, capsys):
    path = tmp_path / "moe.dsir"
    path.write_text(print_graph(optimised_moe()))
    assert main(["simulate", str(path)]) == 0
    out = capsys.readouterr().out
    assert "explored 24 schedules" in out and "all completed without problems" in out


@pytest.mark.parametrize("node, dep", EDGES, ids=[f"{n}<-{d}" for n, d in EDGES])
def test_each_deleted_signal_edge_is_reported_at_default_settings(tmp_path, capsys, node, dep):
    g = without(optimised_moe(), node, dep)
    if implied(g, node, dep):
        assert (node, dep) == ("moe.combine_wait", "moe.dispatch_push")      # the only redundant one
        return
    path = tmp_path / "cut.dsir"
    path.write_text(print_graph(g))
    code = main(["simulate", str(path)])
    out = capsys.readouterr().out
    assert code == 1, out
    assert "failed" in out and "first failing schedule: #" in out and "reproduce with --cores-cube" in out
    report = out[out.index("first failing schedule"):]
    if "deadlock" in report.splitlines()[1]:
        assert "spinning" in report and "rank " in report           # the wait holding cores, on which rank
    else:
        line = next(x for x in report.splitlines() if x.startswith("problem: remote-read"))
        assert " rank " in line and "reads %" in line and ("the wait" in line or "no wait" in line)
    # the printed flags reproduce it on their own
    flags = report.splitlines()[0].split("reproduce with ")[1].rstrip("):").split()
    assert main(["simulate", str(path), "--no-values", *flags]) == 1
    capsys.readouterr()


def test_the_lockstep_default_alone_misses_them():
    """Why exploring is needed: the given schedule alone (ample cores, no jitter) is clean for every cut."""
    g = optimised_moe()
    for node, dep in EDGES:
        assert simulate(build_task_graph(without(g, node, dep)), None, SimConfig()).ok


def test_schedules_are_reproducible_and_vary():
    tg = build_task_graph(optimised_moe())
    a, b = schedules(tg, SimConfig(), 24), schedules(tg, SimConfig(), 24)
    assert a == b and a[0].config == SimConfig()
    assert {s.config.cube for s in a[1::2]} == {1} and {s.config.vector for s in a[1::2]} == {2}
    assert len({s.config.seed for s in a}) == 24 and {s.config.jitter for s in a} == {0, 1, 2, 3}
    assert sum(s.config.waiters_first for s in a) == 6
    assert explore(tg, None, SimConfig(), 1).schedules == a[:1]


def test_jitter_is_seeded_and_zero_jitter_keeps_the_schedule():
    tg = build_task_graph(optimised_moe())
    plain = simulate(tg, None, SimConfig(seed=3, trace=True))
    assert simulate(tg, None, SimConfig(seed=3, jitter=0, trace=True)).trace == plain.trace
    j1, j2 = (simulate(tg, None, SimConfig(seed=3, jitter=2, trace=True)) for _ in range(2))
    assert j1.trace == j2.trace and j1.makespan > plain.makespan

"""The simulator's scheduling model on small hand-written graphs: cores, SPMD blocks, early resolve, spinning
waits, rendezvous collectives, seeded determinism, and the problems it reports (epoch mismatches, reads of data
no rank wrote yet, reads no task writes)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from dspark_ir import parse_graph, verify
from dspark_ir.interp import run
from lowering import TaskGraph, build_task_graph
from lowering.simulate import SimConfig, SimError, simulate


def graph(text: str):
    g = parse_graph(text, "sim.dsir")
    verify(g)
    return g


def inputs(g, seed: int = 0):
    rng = np.random.default_rng(seed)
    ranks = int(g.attributes.get("ranks", 1))
    feeds = [{p.name: rng.standard_normal(p.type.concrete_shape(g.env)).astype(np.float32) for p in g.params}
             for _ in range(ranks)]
    return feeds if ranks > 1 else feeds[0]


def events(result, event: str, task: str, rank: int = 0) -> list:
    return [e for e in result.trace if e.event == event and e.task == task and e.rank == rank]


ELEMENTWISE = """\
graph @ew(%x: f32[8,8]) {
  %v = add(%x, %x) {blocks = 4} : f32[8,8]
  %m = mul(%v, %v) {core = mix, blocks = 2} : f32[8,8]
  return %m
}
"""


@pytest.mark.parametrize("cube, vector, makespan", [(1, 2, 4), (2, 4, 2), (1, 4, 3), (4, 8, 2)])
def test_blocks_take_cores_of_their_kind(cube, vector, makespan):
    """4 vector blocks, then 2 mix blocks of 1 AIC + 2 AIV each: the makespan follows the budget."""
    g = graph(ELEMENTWISE)
    result = simulate(g, inputs(g), cube=cube, vector=vector, trace=True)
    assert result.ok and result.makespan == makespan, result.report()
    assert all(len(e.cores) == 3 for e in events(result, "start", "m"))
    np.testing.assert_array_equal(result.outputs[0]["m"], run(g, inputs(g))["m"])


def test_a_budget_that_cannot_run_a_kind_is_a_clear_error():
    with pytest.raises(SimError, match="task 1 'm' needs a core group \\(1 cube \\+ 2 vector\\) but each rank has "
                                       "4 cube and 1 vector cores"):
        simulate(graph(ELEMENTWISE), cube=4, vector=1)


CHAIN = """\
graph @chain(%x: f32[8,8]) {
  %p = add(%x, %x) {blocks = 2} : f32[8,8]
  %c = mul(%p, %p) {blocks = 1AER} : f32[8,8]
  return %c
}
"""


@pytest.mark.parametrize("aer", [False, True])
def test_early_resolve_parks_the_consumer_on_a_core(aer):
    """AER: the consumer is dispatched once every block of its (inferred) producer is placed, and holds its core,
    parked, until the producer completes. Without AER it is dispatched when the producer is done."""
    g = graph(CHAIN.replace("AER", ", aer = true" if aer else ""))
    result = simulate(g, inputs(g), cube=1, vector=3, trace=True)
    (dispatch,), (start,) = events(result, "dispatch", "c"), events(result, "start", "c")
    assert (dispatch.step, start.step) == ((0, 1) if aer else (1, 1))
    assert result.makespan == 2 and result.ok
    assert result.held[0]["vector"] == (1 if aer else 0)


def test_early_resolve_waits_for_every_producer_block_to_be_placed():
    """With one vector core the producer's second block is placed at step 1: only then may the consumer go."""
    g = graph(CHAIN.replace("AER", ", aer = true"))
    result = simulate(g, inputs(g), cube=1, vector=1, trace=True)
    assert [e.step for e in events(result, "dispatch", "c")] == [2]


def test_explicit_deps_always_wait_for_completion():
    text = CHAIN.replace("%c = mul(%p, %p) {blocks = 1AER}", "%c = mul(%x, %x) {blocks = 1, aer = true} deps(%p)")
    result = simulate(graph(text), cube=1, vector=3, trace=True)
    assert [e.step for e in events(result, "dispatch", "c")] == [1]


TWO_RANKS = """\
graph @handshake(%x: f32[8,8]) attributes {ranks = 2} {
  %sig = window() {shape = [2, 1]} : i32[2,1]
  %p1 = add(%x, %x) {blocks = 2} : f32[8,8]
  %p2 = add(%p1, %x) {blocks = 2} : f32[8,8]
  %note = signal_notify(%sig, %p2) : token
  %wait = signal_wait(%sigANCHOR) {notifier = "note", expected = 1}DEPS : token
  %y = mul(%p2, %p2) deps(%wait) : f32[8,8]
  return %y
}
"""


def handshake(anchor: str) -> str:
    """`deps`: the wait has deps(%note); `token`: it reads the notify's token (an anchor operand); `none`: only the
    window links them."""
    anchor_read, deps = {"deps": ("", " deps(%note)"), "token": (", %note", ""), "none": ("", "")}[anchor]
    return TWO_RANKS.replace("ANCHOR", anchor_read).replace("DEPS", deps)


@pytest.mark.parametrize("anchor", ["deps", "token"])
def test_an_anchored_wait_completes_on_one_core_group(anchor):
    g = graph(handshake(anchor))
    for seed in range(6):
        result = simulate(g, inputs(g), cube=1, vector=2, seed=seed)
        assert result.ok, result.report()
        for out, want in zip(result.outputs, run(g, inputs(g))):
            np.testing.assert_array_equal(out["y"], want["y"])


def test_an_unanchored_wait_starves_its_notifier():
    g = graph(handshake("none"))
    result = simulate(g, cube=1, vector=2, seed=0)
    assert result.status == "deadlock"
    text = result.deadlock.format()
    assert "rank 0: task 4 'wait' holds aic0 aiv0 aiv1, spinning since step 0 on %sig (cell[1] = 0 < 1); " \
           "it waits for 'note' on rank 1 to notify" in text, text
    assert "rank 1: task 1 'p1' cannot get a vector core: held (aiv0 aiv1 by 'wait')" in text, text
    assert [h.kind for h in result.deadlock.cycle].count("spin") == 2
    assert simulate(g, cube=2, vector=4, seed=0).ok       # a second core group lets the notifier run


def test_the_lowerings_signal_edges_anchor_every_wait():
    """The lowering derives a RAW edge notifier → waiter on the signal window; `track_signal_windows` keeps it
    (as an inferred dep), which anchors the wait: this is the difference between the IR and the hardware view."""
    g = graph(handshake("none"))
    assert simulate(g, cube=1, vector=2, track_signal_windows=True).ok


def test_same_seed_same_schedule_and_seeds_change_the_order():
    g = graph(handshake("none"))
    traces = [simulate(g, cube=2, vector=4, seed=s, trace=True).trace for s in (0, 0, 1, 2, 3)]
    assert traces[0] == traces[1]
    assert len({tuple(t) for t in traces}) > 2


def test_task_graph_from_tasks_json_simulates_alike():
    g = graph(handshake("deps"))
    tg = build_task_graph(g)
    again = TaskGraph.from_json(json.loads(json.dumps(tg.to_json())))
    a, b = simulate(tg, cube=1, vector=2, trace=True), simulate(again, cube=1, vector=2, trace=True)
    assert a.trace == b.trace and a.makespan == b.makespan


RENDEZVOUS = """\
graph @a2a(%x: f32[4,2,8]) attributes {ranks = 2, tp = 2} {
  %p = add(%x, %x) {blocks = 3} : f32[4,2,8]
  %r = o_group_a2a(%p) {tp = 2} : f32[2,4,8]
  return %r
}
"""


def test_a_rendezvous_collective_holds_its_core_group_until_every_rank_arrives():
    g = graph(RENDEZVOUS)
    result = simulate(g, inputs(g), cube=1, vector=2, seed=0, trace=True)
    assert result.ok
    arrivals = [events(result, "arrive", "r", r)[0].step for r in range(2)]
    finishes = {events(result, "finish", "r", r)[0].step for r in range(2)}
    assert finishes == {max(arrivals) + 1}
    for out, want in zip(result.outputs, run(g, inputs(g))):
        np.testing.assert_array_equal(out["r"], want["r"])


# ---- problems --------------------------------------------------------------------------------------------------
def test_a_wait_for_an_epoch_this_graph_never_reaches_is_an_epoch_mismatch():
    text = handshake("deps").replace('expected = 1}', 'epoch = 3, expected = 3}')
    g = parse_graph(text)                      # the IR link check passes: 3 = epoch 3 × 1
    verify(g)
    result = simulate(g, cube=24, vector=48)
    assert result.status == "deadlock"
    (problem,) = [p for p in result.problems if p.kind == "epoch-mismatch"]
    assert "waits for %sig ≥ 3 (epoch 3) but the notifiers of that window deliver 1 per peer in this graph" \
        in str(problem)
    assert "no wait-for cycle" in result.deadlock.format()


def test_a_wait_passed_by_another_notifier_is_an_epoch_mismatch():
    """Two notifiers share the window; the wait names the late one but the early one satisfies it."""
    text = """\
graph @shared(%x: f32[8,8]) attributes {ranks = 2} {
  %sig = window() {shape = [2, 1]} : i32[2,1]
  %early = signal_notify(%sig, %x) : token
  %p = add(%x, %x) {blocks = 4} : f32[8,8]
  %late = signal_notify(%sig, %p) : token
  %wait = signal_wait(%sig) {notifier = "late", expected = 1} deps(%early) : token
  %y = mul(%p, %p) deps(%wait) : f32[8,8]
  return %y
}
"""
    result = simulate(graph(text), cube=1, vector=8)
    assert result.completed
    mismatches = [p for p in result.problems if p.kind == "epoch-mismatch"]
    assert mismatches and "with 0 notifies from 'late' on rank 1 (one epoch is 1); the rest came from " \
                          "'early' (1)" in str(mismatches[0]), result.report()


def test_reading_a_put_before_the_peers_put_landed_is_a_remote_read():
    """No notify/wait after the put: on some dispatch orders a rank reads its window while a peer's put is still
    to come. With the handshake, never."""
    racy = """\
graph @racy(%x: f32[2,8], %peer: i32[2], %row: i32[2], %z: f32[8,8]) attributes {ranks = 2} {
  %win = window() {shape = [2, 8], dtype = f32} : f32[2,8]
  %busy = add(%z, %z) {blocks = 3} : f32[8,8]
  %sent = put(%win, %x, %peer, %row) : f32[2,8]
  %y = add(%sent, %sent) : f32[2,8]
  return %y, %busy
}
"""
    g = graph(racy)
    found = [p for s in range(10) for p in simulate(g, cube=1, vector=2, seed=s).problems]
    assert any(p.kind == "remote-read" and "reads %win before the remote writes of 'sent' landed" in str(p)
               for p in found), found
    safe = racy.replace("  %y = add(%sent, %sent) : f32[2,8]", """\
  %sig = window() {shape = [2, 1]} : i32[2,1]
  %note = signal_notify(%sig, %sent) : token
  %wait = signal_wait(%sig) {notifier = "note", expected = 1} deps(%note) : token
  %y = add(%sent, %sent) deps(%wait) : f32[2,8]""")
    assert all(simulate(graph(safe), cube=1, vector=2, seed=s).ok for s in range(10))


def test_a_read_no_task_writes_is_reported():
    g = graph(CHAIN.replace("AER", ""))
    tg = build_task_graph(g)
    tg.tasks[0].args = [a for a in tg.tasks[0].args if a.direction != "out"]   # 'p' no longer writes its buffer
    result = simulate(tg, cube=1, vector=2)
    (problem,) = result.problems
    assert problem.kind == "unwritten-read" and "reads 64 element(s) of %p (p) that no task writes before it" \
        in str(problem)


def test_a_failing_reference_is_a_problem_not_a_crash():
    g = graph(handshake("deps"))
    bad = inputs(g)
    bad[1]["x"] = bad[1]["x"][:4]               # wrong shape on rank 1: the memory refuses it up front
    with pytest.raises(Exception, match="input %x has shape"):
        simulate(g, bad)


def test_config_is_frozen_and_overrides_apply():
    base = SimConfig(cube=2, vector=4)
    result = simulate(graph(ELEMENTWISE), config=base, seed=5)
    assert result.config == SimConfig(cube=2, vector=4, seed=5) and base.seed == 0


def test_early_resolve_ignored_lets_a_consumer_park_ahead_of_its_producer():
    """The literal reading of AER (dispatch on explicit deps alone) parks the consumer on the only vector core
    while its producer still has a block to place: a deadlock the default model (producers placed first) avoids."""
    g = graph(CHAIN.replace("AER", ", aer = true"))
    literal = [simulate(g, cube=1, vector=1, seed=s, early_resolve="ignored") for s in range(8)]
    assert any(not r.completed for r in literal)
    stuck = next(r for r in literal if not r.completed)
    assert [h.kind for h in stuck.deadlock.cycle] == ["parked", "no-core"], stuck.deadlock.format()
    assert all(simulate(g, cube=1, vector=1, seed=s).completed for s in range(8))
    with pytest.raises(SimError, match="early_resolve must be"):
        SimConfig(early_resolve="sometimes")

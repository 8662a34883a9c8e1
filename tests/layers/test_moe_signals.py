"""Signal ops (ops/signal.py): real cross-rank semantics in the interpreter, the expected-count ↔ notifier link,
and located errors when a wait runs before its notifier (on hardware: a deadlock)."""
from __future__ import annotations

import numpy as np
import pytest

from dspark_ir import DsparkError, VerifyError, parse_graph, print_graph, verify
from dspark_ir.interp import InterpError, run
from dspark_ir.ops.signal import check_signals, waits

# Two ranks: a 2-block task notifies `sig`; the waiter expects epoch·blocks = 2 per peer.
SOURCE = """\
graph @signals<NB = 2>(%x: f32[4,8]) attributes {ranks = 2} {
  %sig = window() {shape = [2, 1]} : i32[2,1]
  %buf = window() {shape = [4, 8], dtype = f32} : f32[4,8]
  %peer = window() {shape = [4]} : i32[4]
  %row = window() {shape = [4]} : i32[4]
  %sent = put(%buf, %x, %peer, %row) : f32[4,8]
  %note = signal_notify(%sig, %sent) {notify_per = block, blocks = NB} : token
  %wait = signal_wait(%sig, %x) {notifier = "note", expected = NB} : token
  %got = add(%sent, %sent) deps(%wait) : f32[4,8]
  return %got
}
"""


def graph(text: str = SOURCE, verified: bool = True):
    g = parse_graph(text, "sig.dsir")
    if not verified:
        return g
    verify(g)
    assert isinstance(g.attributes["ranks"], int)  # graph attributes parse as plain ints
    return g


def inputs(ranks: int = 2):
    return [{"x": np.full((4, 8), r + 1, np.float32)} for r in range(ranks)]


def test_round_trip_and_links():
    g = graph()
    text = print_graph(g)
    assert print_graph(parse_graph(text)) == text
    assert list(check_signals(g)) == []
    (site,) = waits(g)
    assert site.node.name == "wait" and site.notifier.name == "note" and site.signal.name == "sig"
    assert str(site.per_epoch) == "NB" and str(site.expected) == "NB"


def test_put_moves_rows_between_ranks_and_wait_passes_after_notify():
    g = graph()
    out = run(g, inputs())
    # peer/row windows are zero: every rank's row i goes to rank 0, row 0 — the last writer is rank 1, row 3.
    np.testing.assert_array_equal(out[0]["got"][0], np.full(8, 4.0, np.float32))
    np.testing.assert_array_equal(out[1]["got"], np.zeros((4, 8), np.float32))


def test_wait_before_its_notifier_raises_a_located_error():
    g = graph()
    order = [n for n in g.topo_order() if n.name != "wait"]
    at = [n.name for n in order].index("sent")
    early = order[:at] + [g.nodes["wait"]] + order[at:]          # after the window, before put + notify
    with pytest.raises(InterpError) as e:
        run(g, inputs(), order=early)
    message = str(e.value)
    assert message.startswith("sig.dsir:8:3: node 'wait': signal_wait failed"), message
    assert "cell[1] >= 2 but it holds 0" in message and "'note'" in message


def test_wait_for_more_than_is_notified_fails_in_the_interpreter_and_the_link_check():
    g = graph(SOURCE.replace('expected = NB}', 'expected = 3}'), verified=False)
    with pytest.raises(VerifyError, match="expected = 3 but epoch 1"):
        verify(g)
    (error,) = check_signals(g)
    assert "expected = 3 but epoch 1 × NB notifies per epoch from 'note' = 2" in str(error)
    assert str(error).startswith("sig.dsir:8:3: node 'wait'")
    with pytest.raises(InterpError, match="node 'wait'.*holds 2"):
        run(g, inputs())


def test_retiling_the_notifier_breaks_the_link():
    g = graph(SOURCE.replace("blocks = NB}", "blocks = 4}"), verified=False)
    (error,) = check_signals(g)
    assert "epoch 1 × 4 notifies per epoch from 'note' = 4" in str(error)


@pytest.mark.parametrize("old, new, message", [
    ('notifier = "note"', 'notifier = "nope"', "notifier 'nope' is not a node of this graph"),
    ('notifier = "note"', 'notifier = "sent"', "notifier 'sent' (put) does not notify"),
    ("signal_notify(%sig,", "signal_notify(%sig2,", "notifier 'note' notifies a different window than %sig"),
    ("{notify_per = block, blocks = NB}", "{notify_per = block}", "notifies per block but has no 'blocks'"),
])
def test_link_errors(old, new, message):
    text = SOURCE.replace(old, new).replace(
        "  %buf", "  %sig2 = window() {shape = [2, 1]} : i32[2,1]\n  %buf")
    g = graph(text, verified=False)
    (error,) = check_signals(g)
    assert message in str(error)
    with pytest.raises(VerifyError, match="node 'wait'"):
        verify(g)


def test_epochs_scale_the_threshold():
    text = SOURCE.replace('expected = NB}', 'epoch = 2, expected = 2*NB}')
    g = graph(text)
    assert list(check_signals(g)) == []
    with pytest.raises(InterpError, match="holds 2"):   # one epoch of notifies only
        run(g, inputs())


def test_barrier_is_its_own_notifier():
    text = """\
graph @barrier(%x: f32[2]) attributes {ranks = 4} {
  %sig = window() {shape = [4, 1]} : i32[4,1]
  %done = signal_barrier(%sig, %x) {notifier = "done", expected = 1} : token
  %y = add(%x, %x) deps(%done) : f32[2]
  return %y
}
"""
    g = graph(text)
    assert list(check_signals(g)) == []
    out = run(g, [{"x": np.ones(2, np.float32)}] * 4)
    assert all(np.array_equal(o["y"], [2.0, 2.0]) for o in out)


def test_single_rank_waits_have_no_peers():
    g = graph(SOURCE.replace("ranks = 2", "ranks = 1")
              .replace("{shape = [2, 1]} : i32[2,1]", "{shape = [1, 1]} : i32[1,1]"))
    run(g, inputs(1)[0])


def test_signal_operand_must_be_a_signal_window():
    with pytest.raises(DsparkError, match="signal must be an i32\\[R,1\\] signal window"):
        graph(SOURCE.replace("signal_wait(%sig,", "signal_wait(%buf,"))


def test_signal_window_has_one_cell_per_rank():
    g = graph(SOURCE.replace("ranks = 2", "ranks = 4"), verified=False)
    (error,) = check_signals(g)
    assert "signal %sig has 2 cells but the graph runs on 4 ranks" in str(error)

"""Cross-rank windows and INT32 signal counters: numpy references (dspark-model.md §5).

Window model. A window is a per-rank buffer the host driver allocates (`pld.alloc_window_buffer`) and peers write
with one-sided puts. Payload windows are ordinary SSA values: a put returns every rank's new window version.
Signal windows (`i32[ranks, 1]`, one cell per source rank) are the one mutable state of the IR: a notify
AtomicAdds into cell[my_rank] of every peer's window *in place*, and a wait reads the cells as they are when it
runs. That is the hardware semantics: remote writes are invisible to dataflow (TensorMap never sees them), so a
waiter is ordered after its notifier only by an explicit edge, and running it before the notifier is a deadlock,
reported here as `WaitNotSatisfied` (the interpreter turns it into a located InterpError).

All signal references are collective: `fn(per_rank_operands, ranks=N, **attrs)` returns one result per rank.
"""
from __future__ import annotations

import numpy as np

from .dtypes import as_dtype


class WaitNotSatisfied(RuntimeError):
    """A wait ran before its notifiers had delivered the expected count (a deadlock on hardware)."""


def window(*, shape, dtype="i32", **_):
    """A zero-filled window buffer of one rank."""
    return as_dtype(np.zeros(shape, np.float32), dtype)


def notify_count(notify_per="task", blocks=None, value=1) -> int:
    """How much one notifier task adds to each peer's cell: `value` once per task, or once per SPMD block."""
    if notify_per == "none":
        return 0
    if notify_per == "block":
        return int(value) * int(blocks if blocks is not None else 1)
    return int(value)


def notify_peers(signals, amount: int) -> None:
    """Every rank r AtomicAdds `amount` into cell[r] of every peer's signal window (in place)."""
    ranks = len(signals)
    for src in range(ranks):
        for dst in range(ranks):
            if dst != src:
                signals[dst][src, 0] += np.int32(amount)


def check_wait(signals, expected: int, *, what: str = "signal_wait", notifier: str = "?") -> None:
    """Every rank's cells from its peers must hold ≥ expected now (WaitCmp.Ge)."""
    ranks = len(signals)
    for me in range(ranks):
        for src in range(ranks):
            have = int(signals[me][src, 0])
            if src != me and have < expected:
                raise WaitNotSatisfied(
                    f"rank {me} waits for cell[{src}] >= {expected} but it holds {have}: "
                    f"'{notifier}' on rank {src} has not notified (deadlock)")


def signal_notify(per_rank, *, ranks, notify_per="task", blocks=None, value=1, **_):
    """Notify every peer: cell[my_rank] += value (per task or per block). Returns tokens."""
    signals = [ops[0] for ops in per_rank]
    notify_peers(signals, notify_count(notify_per, blocks, value))
    return [None] * ranks


def signal_wait(per_rank, *, ranks, expected, notifier="?", **_):
    """Wait until every peer's cell ≥ expected; raise WaitNotSatisfied if that has not happened yet."""
    check_wait([ops[0] for ops in per_rank], int(expected), notifier=notifier)
    return [None] * ranks


def signal_barrier(per_rank, *, ranks, expected, notifier="?", value=1, **_):
    """One notify to every peer, then wait for every peer's cell ≥ expected (a task that is both ends)."""
    signals = [ops[0] for ops in per_rank]
    notify_peers(signals, int(value))
    check_wait(signals, int(expected), notifier=notifier)
    return [None] * ranks


def put(per_rank, *, ranks, **_):
    """Row puts into peers' windows: rank s writes src[i] to window[peer[i]] row row[i] (peer < 0 skips).

    Operands per rank: (window, src, peer i32[N], row i32[N]). Returns every rank's new window version; rows are
    applied source rank by source rank in ascending order, rows of one source in order.
    """
    out = [np.array(ops[0], copy=True) for ops in per_rank]
    for ops in per_rank:
        _, src, peer, row = ops
        for i in range(len(peer)):
            if peer[i] < 0:
                continue
            if peer[i] >= ranks:
                raise ValueError(f"put to rank {int(peer[i])} of {ranks}")
            out[int(peer[i])][int(row[i])] = src[i]
    return out

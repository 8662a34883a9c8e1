"""The release of an exchange window that consumers read directly (dspark-model.md §6(b) "After", §5).

Before the `typed-gather` rewrite, an exchange (`o_group_a2a`: put + barrier 1) is followed by its copy-out
(`window_copy_out`: window rows → local tensor, then barrier 2 and the credit reset). Barrier 2 is what keeps the
window from being overwritten (the next layer's put reuses it) while a peer still copies out of it. Once the
consumers read the window rows directly, the copy-out is gone and the consumers themselves are the window's last
readers, so barrier 2 moves behind them:

    %o.o_group_a2a.release = window_release(%o.o_group_a2a) deps(%o.tp_o_a.g0, %o.tp_o_a.g1) : token

`deps` names every last consumer of the window (the release edge); the task then meets its peers (barrier 2:
every rank's consumers are done with their window) and resets the credit cells. It moves no data. Its window
operand names the window it releases: the lowering orders it after the exchange and, through the buffer, before
any later writer of that window (a WAR edge from the release). It is a rendezvous collective, like the exchange.
"""
from __future__ import annotations

from ..types import TOKEN
from .base import OpDef, numpy_reference, register_op


@register_op
class WindowRelease(OpDef):
    """After the last consumer of an exchange window (its deps): barrier 2 with every peer, then the credit reset;
    returns a token (window_release)."""
    name = "window_release"
    operands = ("window",)
    results = ("released",)
    core = "mix"
    collective = True
    lowers_to = "signal"
    family = "window_release"
    reference = numpy_reference("window_release", "window_release")

    def infer(self, ins, attrs):
        return [TOKEN]

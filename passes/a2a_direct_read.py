"""a2a-direct-read: the O projection reads the all-to-all's exchange window; the gather wave goes."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from dspark_ir.ops.collective import OGroupA2A

from .infra.base import register_pass
from .typed_gather import TypedGather


@register_pass
@dataclass(frozen=True)
class A2aDirectRead(TypedGather):
    """typed-gather's rewrite applied to the TP O path's all-to-all (dspark-model.md §3.5).

    Before: the seed's base (docs/seed-baselines.md "O path") publishes the packed heads into the peers' windows
    (`o_group_a2a`: put + barrier 1), then `o_group_a2a_gather` copies the window's data rows into a local tensor
    on 48 cyclic AIV workers and `o_group_a2a_complete` meets the peers (barrier 2) and resets the credits: one
    `window_copy_out`. The `tp_o_a` consumers read the local copy.
    After: the consumers read the window's data rows (a slice view skipping the pad rows) with a declared dep on
    the exchange; a `window_release` after the last consumer takes over barrier 2 and the reset, ordered before
    the next rendezvous (the reduce-scatter). No seed PR made this change: it is ours, kept apart from the
    seed's typed-gather (the CP all-gathers) so an A/B of the seed's passes does not credit it to them.
    Bitwise: the consumers read exactly the bytes the gather copied.
    """

    name = "a2a-direct-read"
    exchanges: ClassVar[tuple[type, ...]] = (OGroupA2A,)
    typed_steps: ClassVar[bool] = False

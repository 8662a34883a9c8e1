"""Problems the simulator finds besides deadlock: signal epoch mismatches, reads of data no rank wrote (yet),
and numpy references that failed while computing values."""
from __future__ import annotations

from dataclasses import dataclass

KINDS = ("epoch-mismatch", "signal-link", "unwritten-read", "remote-read", "value")


@dataclass(frozen=True)
class Problem:
    kind: str
    message: str
    task: str = ""          # the task's name ('' for graph-wide problems)
    rank: int | None = None
    step: int | None = None

    def __post_init__(self):
        assert self.kind in KINDS, self.kind

    def __str__(self) -> str:
        where = []
        if self.step is not None:
            where.append(f"step {self.step}")
        if self.rank is not None:
            where.append(f"rank {self.rank}")
        if self.task:
            where.append(f"'{self.task}'")
        prefix = f"{' '.join(where)}: " if where else ""
        return f"{self.kind}: {prefix}{self.message}"

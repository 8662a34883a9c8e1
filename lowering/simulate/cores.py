"""The cores of one rank: `cube` AIC cores and `vector` AIV cores.

A block of a `cube` task takes one AIC, a `vector` block one AIV, a `mix` block one core group = 1 AIC + 2 AIV
(dspark-model.md §1: `pl.at(level=CORE_GROUP)`; waits spin on a core group). Cores are taken lowest index first,
so a schedule is reproducible, and held until the block completes.
"""
from __future__ import annotations

NEEDS = {"cube": {"cube": 1}, "vector": {"vector": 1}, "mix": {"cube": 1, "vector": 2}}
PREFIX = {"cube": "aic", "vector": "aiv"}


class CorePool:
    def __init__(self, cube: int, vector: int):
        self.size = {"cube": cube, "vector": vector}
        self.free = {kind: list(range(n)) for kind, n in self.size.items()}

    def fits(self, core: str) -> bool:
        """Whether a block of this core kind could ever run with this budget."""
        return all(self.size[k] >= n for k, n in NEEDS[core].items())

    def take(self, core: str) -> tuple[str, ...] | None:
        """Cores for one block of kind `core`, or None if they are not all free."""
        need = NEEDS[core]
        if any(len(self.free[k]) < n for k, n in need.items()):
            return None
        taken = []
        for kind, n in need.items():
            for _ in range(n):
                taken.append(f"{PREFIX[kind]}{self.free[kind].pop(0)}")
        return tuple(taken)

    def give(self, cores: tuple[str, ...]) -> None:
        for name in cores:
            kind = "cube" if name.startswith("aic") else "vector"
            self.free[kind].append(int(name[3:]))
            self.free[kind].sort()

    @staticmethod
    def kinds(cores: tuple[str, ...]) -> set[str]:
        return {"cube" if c.startswith("aic") else "vector" for c in cores}


def describe_need(core: str) -> str:
    return {"cube": "a cube core", "vector": "a vector core", "mix": "a core group (1 cube + 2 vector)"}[core]

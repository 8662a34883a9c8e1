"""Read pypto's cost-model output: the stat report and where the swimlanes are.

Every SIM call at ALL_COMPLETE writes ``<call dir>/CostModelSimulationOutput/``:

* ``_simulate.stat.report.txt``: "Total Cycles", task counts, per-pipe usage (parsed here);
* ``_simulate.swim.json``: per-core task spans in cycles;
* ``merged_swimlane.json``: a Chrome/Perfetto trace in µs (model clock 1.8 GHz).

The model is ASCEND_910B2 (A2A3). Treat cycles as a regression signal, not a ranking.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from dspark_ir.hardware import HARDWARE

CLOCK_MHZ = HARDWARE.clock_mhz  # cycles per µs of the modelled core clock
COST_DIR = "CostModelSimulationOutput"
STAT_REPORT = "_simulate.stat.report.txt"
SWIM_CYCLES = "_simulate.swim.json"
SWIM_TRACE = "merged_swimlane.json"

_LINE = re.compile(r"^\s*(?:\|--)?\s*(?P<key>[A-Za-z][A-Za-z0-9_ ]*?)\s*\.{2,}:\s*(?P<rest>.*)$")
_PIPE = re.compile(r"^Average (?P<pipe>\S+) Usage$")


@dataclass(frozen=True)
class PipeUsage:
    """One pipe's line of the report: cores using it, mean busy cycles, share of Total Cycles."""

    used: int
    avg_cycles: float
    percent: float


@dataclass(frozen=True)
class CostStats:
    total_cycles: int
    tasks: int | None  # "Total Submit Tasks"
    cube_tasks: int | None
    vector_tasks: int | None
    avg_task_cycles: float | None
    pipes: dict[str, PipeUsage] = field(default_factory=dict)  # "Cube", "Vector", "MTE_IN", ...

    @property
    def us(self) -> float:
        return cycles_to_us(self.total_cycles)


def cycles_to_us(cycles: int) -> float:
    return cycles / CLOCK_MHZ


def _number(text: str) -> float | None:
    match = re.match(r"\s*(-?[0-9]+(?:\.[0-9]+)?)", text)
    return float(match.group(1)) if match else None


def _fields(text: str) -> dict[str, list[str]]:
    """``key .....: v1 v2`` lines -> {key: [v1, v2]}; the first occurrence of a key wins."""
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        match = _LINE.match(line)
        if match and match.group("key") not in out:
            out[match.group("key")] = match.group("rest").split()
    return out


def parse_stat_report(text: str) -> CostStats | None:
    """Parse the text of ``_simulate.stat.report.txt``; None if it has no Total Cycles."""
    fields = _fields(text)

    def first(key: str) -> float | None:
        values = fields.get(key)
        return _number(values[0]) if values else None

    total = first("Total Cycles")
    if total is None:
        return None
    pipes: dict[str, PipeUsage] = {}
    for key, values in fields.items():
        match = _PIPE.match(key)
        if not match or len(values) < 2:
            continue
        pipe = match.group("pipe")
        used = first(f"Used {pipe} Pipe Number")
        pipes[pipe] = PipeUsage(int(used or 0), float(values[0]), float(values[1].rstrip("%")))

    def as_int(value: float | None) -> int | None:
        return None if value is None else int(value)

    return CostStats(
        total_cycles=int(total),
        tasks=as_int(first("Total Submit Tasks")),
        cube_tasks=as_int(first("Cube Tasks")),
        vector_tasks=as_int(first("Vector Tasks")),
        avg_task_cycles=first("Average Task Cycles"),
        pipes=pipes,
    )


def read_stats(call_dir: Path) -> CostStats | None:
    """Stats of one call's output directory (``output_<ts>_<pid>_*``), None if it has no report."""
    report = Path(call_dir) / COST_DIR / STAT_REPORT
    if not report.is_file():
        return None
    return parse_stat_report(report.read_text(errors="replace"))


def swimlane_paths(call_dir: Path) -> dict[str, Path]:
    """The swimlane files that exist: ``{"cycles": _simulate.swim.json, "trace": merged_swimlane.json}``."""
    cost = Path(call_dir) / COST_DIR
    found = {"cycles": cost / SWIM_CYCLES, "trace": cost / SWIM_TRACE}
    return {kind: path for kind, path in found.items() if path.is_file()}

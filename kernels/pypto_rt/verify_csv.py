"""Read pypto's pass-verify report ``verify_*/verify_result_brief.csv``.

One row per compared tensor: the tensor graph against the goldens (``passName`` =
``tensor_graph``, ``referPassName`` = ``golden``) and each checked pass against the
tensor graph. Only outputs with a golden get a tensor_graph row.

The diff columns are not a bit-exactness measure: a PASS row can show ``maxAbsDiff`` 0
while the tensors differ within tolerance (seen: 1.5e-5 on a fp32 matmul, tolerance 1e-3).

pypto writes this file as the process exits (or when the next verify session starts),
so read it only after the worker process has ended.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

BRIEF_CSV = "verify_result_brief.csv"


@dataclass(frozen=True)
class VerifyRow:
    pass_name: str  # "tensor_graph" or "Pass_<nn>_<Name>"
    reference: str  # "golden" or "tensor_graph"
    function: str
    loop: str
    tensor: str  # "output2", ...: which tensor of the function
    shape: str
    valid_shape: str
    dtype: str
    result: str  # "PASS" or "FAILED" (as written by pypto)
    max_abs_diff: float
    max_rel_diff: float
    error_count: int
    error_ratio: float

    @property
    def passed(self) -> bool:
        return self.result.upper() == "PASS"

    def __str__(self) -> str:
        return (f"{self.pass_name} vs {self.reference} {self.tensor} {self.dtype}{self.shape}: "
                f"{self.result} maxAbsDiff={self.max_abs_diff:g} errors={self.error_count}")


def _float(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return float("nan")


def _int(text: str) -> int:
    try:
        return int(float(text))
    except ValueError:
        return -1


def _row(record: dict[str, str]) -> VerifyRow:
    get = lambda key: (record.get(key) or "").strip()  # noqa: E731
    return VerifyRow(
        pass_name=get("passName"), reference=get("referPassName"), function=get("verifyType"),
        loop=get("loopInfo"), tensor=get("ioflag"), shape=get("outputShape"),
        valid_shape=get("outputValidShape"), dtype=get("outputDtype"), result=get("verifyResult"),
        max_abs_diff=_float(get("maxAbsDiff")), max_rel_diff=_float(get("maxRelDiff")),
        error_count=_int(get("errorCount")), error_ratio=_float(get("errorRatio")),
    )


def parse_brief_csv(path: Path) -> list[VerifyRow]:
    with open(path, newline="", errors="replace") as handle:
        return [_row(record) for record in csv.DictReader(handle)]


def read_verify_rows(call_dir: Path) -> list[VerifyRow]:
    """All rows of the verify reports under one call's output directory (empty if none)."""
    rows: list[VerifyRow] = []
    for path in sorted(Path(call_dir).glob(f"verify_*/{BRIEF_CSV}")):
        rows.extend(parse_brief_csv(path))
    return rows

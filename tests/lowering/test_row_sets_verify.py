"""pass-verify of an op whose result rows are sets (OpDef.row_sets): tie swaps are no failure."""
from __future__ import annotations

import numpy as np

from dspark_ir.ops import get_op
from lowering.pypto_exec import row_sets_equal


def test_topk_rows_compare_as_sets():
    assert get_op("idx_topk").row_sets and not get_op("matmul").row_sets
    want = {"topk": np.array([[3, 1, 2, -1], [0, 1, -1, -1]], np.int32)}
    swapped = {"topk": np.array([[3, 2, 1, -1], [1, 0, -1, -1]], np.int32)}     # two tied entries swap places
    wrong = {"topk": np.array([[3, 2, 0, -1], [1, 0, -1, -1]], np.int32)}       # a different entry selected
    assert row_sets_equal("idx_topk", swapped, want)
    assert not row_sets_equal("idx_topk", wrong, want)
    assert not row_sets_equal("matmul", {"out": np.ones(2)}, {"out": np.ones(2)})   # positional ops keep pypto's


def test_the_report_names_a_pass_as_row_sets():
    from lowering.pypto_exec import PYPTO, PyptoReport, TaskRun

    run = TaskRun(7, "idx.topk", PYPTO, op="idx_topk", verify_ok=True, verify_as_sets=True)
    text = "\n".join(PyptoReport(runs=[run]).describe())
    assert "pass-verify: 1/1 pypto tasks PASS" in text and "PASS as row sets: task 7 'idx.topk'" in text
    assert "FAILED:" not in text.replace("positional verify FAILED", "")

"""pass-verify of an op whose contract leaves some result entries open (OpDef.open_entries: idx_score's tail,
which upstream never writes): a failure on those entries is no failure; one on a fixed entry still is."""
from __future__ import annotations

import numpy as np

from dspark_ir.ops import get_op
from lowering.pypto_exec import PYPTO, PyptoReport, TaskRun, fixed_entries_close


def test_open_entries_are_not_compared_the_fixed_ones_are():
    assert get_op("idx_score").open_entries is not None and get_op("idx_topk").open_entries is None
    want = {"out": np.array([[1.0, 2.0, -3.0e38, -3.0e38], [4.0, -3.0e38, -3.0e38, -3.0e38]], np.float32)}
    masks = {"out": np.array([[False, False, True, True], [False, True, True, True]])}
    unwritten = {"out": np.where(masks["out"], 0.0, want["out"]).astype(np.float32)}   # the tail left as zeros
    assert fixed_entries_close(unwritten, want, masks)
    wrong = {"out": unwritten["out"].copy()}
    wrong["out"][1, 0] = 4.5                                                             # a fixed entry off
    assert not fixed_entries_close(wrong, want, masks)
    assert not fixed_entries_close(unwritten, want, {})                                  # no open entries: positional


def test_the_report_names_a_pass_on_the_fixed_entries():
    run = TaskRun(9, "idx.score", PYPTO, op="idx_score", verify_ok=True, verify_open=True)
    text = "\n".join(PyptoReport(runs=[run]).describe())
    assert "pass-verify: 1/1 pypto tasks PASS" in text and "PASS on the fixed entries: task 9 'idx.score'" in text

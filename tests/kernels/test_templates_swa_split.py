"""pypto templates of the two tasks split-writeback-bias produces, against their numpy references."""
from __future__ import annotations

import numpy as np
import pytest

from tests.lowering.pypto_cases import Case, check_case, run_cases

WRITEBACK = """graph @wb<T = 20, KV = 64>(%kv: bf16[T,64], %kv_cache: bf16[KV,64] inout, %slot: i32[T]) {
  %swa.swa_cache_writeback = swa_cache_writeback(%kv, %kv_cache, %slot) {tile = [8], blocks = ceil(T/8), tail = clamp}
  : bf16[KV,64]
  return %swa.swa_cache_writeback
}
"""
BIAS = """graph @bias<T = 20>(%lens: i32[T]) {
  %swa.swa_valid_bias = swa_valid_bias(%lens) {window = 16, tile = [4], blocks = T//4} : f32[T,16]
  return %swa.swa_valid_bias
}
"""


def _writeback_inputs(g, rng):
    slots = rng.permutation(64)[:20].astype(np.int32)
    slots[[3, 11]] = -1                                   # padding tokens are skipped
    return {"kv": rng.standard_normal((20, 64)).astype(np.float32),
            "kv_cache": rng.standard_normal((64, 64)).astype(np.float32), "slot": slots}


def _bias_inputs(g, rng):
    return {"lens": np.array([0, 1, 16, 5] * 5, np.int32)}


CASES = {"swa_cache_writeback": Case(WRITEBACK, make_inputs=_writeback_inputs),
         "swa_valid_bias": Case(BIAS, make_inputs=_bias_inputs)}


@pytest.fixture(scope="module")
def results():
    return run_cases(CASES)


@pytest.mark.pypto
@pytest.mark.parametrize("name", sorted(CASES))
def test_split_swa_templates_are_bitwise(results, name):
    _task, job, res = results[name]
    check_case(CASES[name], job, res)

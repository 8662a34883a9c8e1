"""TP and EP forms agree with the single-rank form on the merged inputs (dsv4-math §7, §8.3)."""
from __future__ import annotations

import numpy as np
import pytest

from goldens.compare import check
from goldens.inputs import make_rank_inputs, merge_rank_inputs, rank_count, split_rank_outputs
from goldens.layers import run_layer, run_layer_ranks

BUFFER_CHECK = {"kv_cache": "kv_cache", "cmp_kv": "cmp_kv", "cmp_state": "cmp_state", "idx_kv_cache": "idx_kv_cache",
                "idx_kv_scale": "idx_kv_scale", "idx_cmp_state": "idx_cmp_state"}


@pytest.mark.parametrize("kind,tp,regime", [
    ("swa", 2, "default"), ("csa", 2, "default"), ("hca", 2, "default"), ("csa", 2, "long_cache"),
    ("swa", 4, "window_boundary"), ("csa", 4, "topk_boundary"), ("hca", 4, "long_cache"), ("hca", 1, "default"),
    ("moe", 2, "default"), ("moe_hash", 2, "swiglu_clip"), ("moe", 4, "default"),
])
def test_multi_rank_equals_single_rank_on_merged_inputs(tiny, kind, tp, regime):
    cfg = tiny.with_(tp=tp)
    ranks = make_rank_inputs(kind, cfg, 11, regime)
    assert len(ranks) == rank_count(kind, cfg)
    per_rank = run_layer_ranks(kind, cfg, ranks)
    merged_cfg, merged = merge_rank_inputs(kind, cfg, ranks)
    expected = split_rank_outputs(kind, cfg, run_layer(kind, merged_cfg, merged))
    x_out_check = "x_out_csa" if kind == "csa" else "x_out"
    for got, want in zip(per_rank, expected):
        assert set(got) == set(want)
        assert check(x_out_check, got["x_out"], want["x_out"])
        for name in set(got) - {"x_out"}:
            assert check(BUFFER_CHECK[name], got[name], want[name]), name


def test_tp1_form_is_bitwise_the_single_rank_form(tiny):
    cfg = tiny.with_(tp=1)
    ranks = make_rank_inputs("csa", cfg, 12)
    got = run_layer_ranks("csa", cfg, ranks)[0]
    want = run_layer("csa", cfg, ranks[0])
    for name in want:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)


def test_rank_count_is_checked(tiny):
    ranks = make_rank_inputs("swa", tiny, 0)
    with pytest.raises(ValueError, match="per_rank_inputs"):
        run_layer_ranks("swa", tiny, ranks[:1])

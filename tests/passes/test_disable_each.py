"""Every DSpark pass can be disabled alone: the rest of the default pipeline still verifies, keeps its
contracts and computes the golden's outputs within tolerance, on every layer at TP1 and TP4 (issue 5)."""
from __future__ import annotations

import pytest

from passes import PassContext, run_pipeline
from passes.infra.defaults import DEFAULT_PIPELINE

from .layer_support import golden_mismatches, tiny

STANDARD = {"canonicalize", "cse", "dce"}
DSPARK_PASSES = [e.spec.split("{")[0] for e in DEFAULT_PIPELINE if e.spec.split("{")[0] not in STANDARD]
LAYERS = ("decode-swa", "decode-csa", "decode-hca", "moe")


def test_the_default_pipeline_holds_the_seven_seed_optimisations():
    assert set(DSPARK_PASSES) >= {"topk-bypass", "typed-gather", "fuse-merge-rope-pack", "split-m-fanout",
                                  "widen-tile", "split-writeback-bias", "deterministic-split-k",
                                  "moe-handshake-deps"}


@pytest.mark.parametrize("tp", [1, 4])
@pytest.mark.parametrize("layer", LAYERS)
@pytest.mark.parametrize("disabled", DSPARK_PASSES)
def test_disable_one_pass(layer, tp, disabled):
    g = tiny(layer, tp)
    # per-pass contracts are checked by each pass's own tests; here: verifier after every pass, golden at the end
    ctx = PassContext(use_env=False, disabled=[disabled], verify_each=True, roundtrip_each=False,
                      check_numerics=False, seed=1)
    result = run_pipeline(g, ctx=ctx)
    assert disabled not in [r.name for r in result.runs if r.status in ("changed", "no-op")]
    assert golden_mismatches(result.graph, seed=1) == []

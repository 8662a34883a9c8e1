"""`dspark opt` reports on a real layer."""
from __future__ import annotations

import os

from dspark_cli.main import main  # noqa: E402


def test_explain_does_not_list_the_nodes_the_pass_rewrote(capsys):
    """widen-tile's fixpoint round sees the node it widened ("already 16 rows per block"): not a skip."""
    assert main(["opt", "decode-swa", "--config", "flash", "--tp", "4", "--explain", "widen-tile",
                 "--explain", "tile-choice", "-o", os.devnull]) == 0
    err = capsys.readouterr().err
    assert "rewrote  widen at %qkv.kv_rms_norm_rope" in err and "rewrote  retile at %qkv.qr_proj_matmul" in err
    assert "skipped  %qkv.kv_rms_norm_rope" not in err and "skipped  %qkv.qr_proj_matmul" not in err
    assert "already" not in err


def test_explain_says_why_a_rewritten_node_went_no_further(capsys):
    assert main(["opt", "decode-hca", "--tp", "4", "--explain", "widen-tile", "-o", os.devnull]) == 0
    err = capsys.readouterr().err                    # tiny TP4: T = 8, the tile widens 4 -> 8 and stops there
    #                                                  (decode-swa's KV side now runs on the TP group's 32 rows)
    assert "  stopped  %qkv.kv_rms_norm_rope: a 16-row tile would exceed the 8 rows" in err
    assert "skipped  %qkv.kv_rms_norm_rope" not in err

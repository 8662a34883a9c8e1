"""Before/after cases: tests/passes/<pass-name>/<case>.before.dsir → <case>.after.dsir.

Each case runs its folder's pass (or the pipeline in a `# pipeline: ...` header line) with the verifier,
the round-trip check and the numeric contract on, compares the result structurally with the after file,
and checks that running again changes nothing (unless the before file says `# idempotent: no`).
Set DSPARK_UPDATE_GOLDENS=1 to rewrite the after files from the current passes (then review the diff).
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from dspark_ir import print_graph
from passes import PassContext, registered_names, run_pipeline

from .support import HERE, diff, header_value, load

CASES = sorted(HERE.glob("*/*.before.dsir"))


def _id(path: Path) -> str:
    return f"{path.parent.name}/{path.name.removesuffix('.before.dsir')}"


@pytest.mark.parametrize("before_path", CASES, ids=[_id(p) for p in CASES])
def test_case(before_path: Path):
    folder = before_path.parent.name
    assert folder in registered_names(), f"{folder}/ is not named after a registered pass"
    text = before_path.read_text()
    pipeline = header_value(text, "pipeline") or folder
    before = load(before_path)
    ctx = PassContext(use_env=False, check_numerics=True, roundtrip_each=True, verify_each=True)
    result = run_pipeline(before, pipeline, ctx=ctx)
    got = print_graph(result.graph)
    after_path = before_path.with_name(before_path.name.replace(".before.", ".after."))
    if os.environ.get("DSPARK_UPDATE_GOLDENS"):
        after_path.write_text(got)
    assert after_path.exists(), f"missing {after_path.name} (run with DSPARK_UPDATE_GOLDENS=1, then review it)"
    expected = load(after_path)
    assert result.graph.structurally_equal(expected), diff(print_graph(expected), got)
    if header_value(text, "idempotent") != "no":
        again = run_pipeline(expected, pipeline, ctx=ctx)
        assert not again.changed, f"not idempotent: {[str(r) for run in again.runs for r in run.rewrites]}"


def test_every_pass_folder_has_cases():
    for folder in ("canonicalize", "cse", "dce"):
        assert list((HERE / folder).glob("*.before.dsir")), folder

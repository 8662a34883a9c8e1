"""Every generated kernel source and orchestrate.py stays byte-identical unless a change means it to differ.

The manifest beside this file hashes what `dspark lower` writes for every layer, config, TP and {default,
all-off} (benchmarks/generated_sources.py). A change that alters generated code on purpose rewrites it with
DSPARK_UPDATE_GOLDENS=1 and says so in its commit.
"""
from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

MANIFEST = Path(__file__).with_name("generated_sources.sha256")
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "generated_sources.py"


def _script():
    spec = importlib.util.spec_from_file_location("generated_sources", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_generated_sources_match_the_manifest():
    script = _script()
    actual = script.manifest()
    if os.environ.get("DSPARK_UPDATE_GOLDENS"):
        MANIFEST.write_text("".join(f"{d}  {n}\n" for n, d in actual.items()))
    problems = script.compare(script.read(MANIFEST), actual)
    assert not problems, "\n".join(problems[:20])


def test_the_comparison_names_every_kind_of_difference():
    script = _script()
    problems = script.compare({"a": "1", "b": "2"}, {"a": "9", "c": "3"})
    assert problems == ["changed: a", "missing: b", "new: c"]

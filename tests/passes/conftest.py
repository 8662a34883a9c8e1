"""Pass tests run with the numeric-contract and round-trip instruments on, and no toggles from the
environment, each in its own temporary working directory. The planted (deliberately wrong) passes are
registered here, for tests only."""
from __future__ import annotations

import pytest

import passes.infra.defaults as defaults

from . import planted  # noqa: F401  (registers the planted-* passes)

STANDARD = ("canonicalize", "cse", "dce")


@pytest.fixture(autouse=True)
def _pass_checks_on(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # a failing run's default ./repro.dsir never lands in the source tree
    monkeypatch.setenv("DSPARK_CHECK_NUMERICS", "1")
    monkeypatch.setenv("DSPARK_ROUNDTRIP_EACH", "1")
    monkeypatch.delenv("DSPARK_DISABLE_PASSES", raising=False)


@pytest.fixture
def std_pipeline(monkeypatch):
    """Pin the default pipeline to the standard passes (with their real `why`), so tests of the machinery do
    not depend on which DSpark passes the default pipeline holds today."""
    entries = tuple(e for e in defaults.DEFAULT_PIPELINE if e.spec in STANDARD)
    assert [e.spec for e in entries] == list(STANDARD)
    monkeypatch.setattr(defaults, "DEFAULT_PIPELINE", entries)

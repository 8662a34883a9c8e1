"""Shared fixtures of the layer tests: tiny configs, golden inputs and golden traces."""
from __future__ import annotations

import pytest

from goldens import config as gc
from goldens import inputs as gi
from goldens import layers as gl


@pytest.fixture(scope="session")
def tiny1():
    return gc.config_by_name("tiny").with_(tp=1)


@pytest.fixture(scope="session")
def swa_case(tiny1):
    """(cfg, inputs, golden trace, golden outputs) of the TP1 tiny SWA layer, seed 0, default regime."""
    inputs = gi.make_inputs("swa", tiny1, 0)
    trace: dict = {}
    outputs = gl.decode_swa(tiny1, inputs, trace)
    return tiny1, inputs, trace, outputs

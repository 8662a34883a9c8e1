"""Shared fixtures of the goldens tests."""
from __future__ import annotations

import pytest

from goldens.config import config_by_name


@pytest.fixture(scope="session")
def tiny():
    return config_by_name("tiny")


@pytest.fixture(scope="session")
def flash():
    return config_by_name("flash")

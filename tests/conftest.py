"""Shared pytest setup: hypothesis profiles (CI runs the same example counts as a developer) and the file order."""
from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile("default", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", deadline=None, max_examples=2000, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("DSPARK_HYPOTHESIS_PROFILE", "default"))


def pytest_collection_modifyitems(config, items):
    """Files with pypto or slow tests first (a stable sort, each file's tests stay together and in order): CI runs
    two processes that take whole files (`--dist loadfile`), and starting the long files first lets both finish
    together instead of one running a long file alone at the end."""
    long_files = {item.path for item in items if item.get_closest_marker("pypto") or item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in long_files)

"""Shared pytest setup: hypothesis profiles (CI runs the same example counts as a developer)."""
from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile("default", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", deadline=None, max_examples=2000, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(os.environ.get("DSPARK_HYPOTHESIS_PROFILE", "default"))

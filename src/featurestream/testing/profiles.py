"""Hypothesis profiles for the stateful kit: ``ci`` (the project's CI budget) and ``deep`` (nightly).

Importing ``featurestream.testing`` registers both; when the ``HYPOTHESIS_PROFILE``
environment variable names one of them it is loaded too, so a project that runs
the kit in its own CI gets the same budgets without copying them::

    HYPOTHESIS_PROFILE=ci pytest tests/   # 200 examples of 40 steps per machine
    HYPOTHESIS_PROFILE=deep pytest tests/ # 5000 examples of 120 steps

Any other value (or none) leaves Hypothesis' settings alone.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

__all__ = ["PROFILES", "register_profiles"]

PROFILES: dict[str, dict[str, object]] = {
    "ci": {"max_examples": 200, "stateful_step_count": 40},
    "deep": {"max_examples": 5000, "stateful_step_count": 120},
}


def register_profiles() -> str | None:
    """Register ``ci`` and ``deep``; load the one ``HYPOTHESIS_PROFILE`` names, if any. Return the loaded name."""
    for name, budget in PROFILES.items():
        settings.register_profile(
            name, deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True, **budget
        )
    wanted = os.environ.get("HYPOTHESIS_PROFILE")
    if wanted in PROFILES:
        settings.load_profile(wanted)
        return wanted
    return None

"""Hypothesis profiles for the stateful kit: ``ci`` (the project's CI budget) and ``deep`` (nightly).

Importing ``featurestream.testing`` registers both; when the ``HYPOTHESIS_PROFILE``
environment variable names one of them it is loaded too, so a project that runs
the kit in its own CI gets the same budgets without copying them::

    HYPOTHESIS_PROFILE=ci pytest tests/   # 200 examples of 40 steps per machine
    HYPOTHESIS_PROFILE=deep pytest tests/ # 5000 examples of 120 steps

``ci`` extends Hypothesis' own ``ci`` profile (derandomized, no example database)
with the kit's budget. Hypothesis loads its ``ci`` profile by itself on a machine it
detects as CI (the ``CI`` environment variable and the like); there, importing the
kit raises that profile's budget too. Anywhere else, a ``HYPOTHESIS_PROFILE`` that
names neither profile (or none) leaves Hypothesis' settings alone.
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

__all__ = ["PROFILES", "register_profiles"]

# Taken at import, before ``register_profiles`` replaces the name ``ci``. ``deep`` names its
# parent too: without one it would inherit whatever profile is loaded (derandomized on CI).
_PARENTS = {"ci": settings.get_profile("ci"), "deep": settings.get_profile("default")}

PROFILES: dict[str, dict[str, object]] = {
    "ci": {"max_examples": 200, "stateful_step_count": 40},
    "deep": {"max_examples": 5000, "stateful_step_count": 120},
}


def register_profiles() -> str | None:
    """Register ``ci`` and ``deep``; load the one ``HYPOTHESIS_PROFILE`` names, if any. Return the loaded name."""
    for name, budget in PROFILES.items():
        settings.register_profile(
            name,
            _PARENTS[name],
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
            print_blob=True,
            **budget,
        )
    wanted = os.environ.get("HYPOTHESIS_PROFILE")
    if wanted in PROFILES:
        settings.load_profile(wanted)
        return wanted
    return None

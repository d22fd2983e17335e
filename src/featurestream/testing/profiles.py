"""Hypothesis profiles for the stateful kit: ``ci`` (the project's CI budget) and ``deep`` (nightly).

Importing the kit changes no Hypothesis setting. A project that wants the kit's
budgets loads one, typically in its ``conftest.py``::

    from featurestream.testing import load_profile
    load_profile()  # the profile HYPOTHESIS_PROFILE names, else ``ci``

    HYPOTHESIS_PROFILE=ci pytest tests/   # 200 examples of 40 steps per machine
    HYPOTHESIS_PROFILE=deep pytest tests/ # 5000 examples of 120 steps

``ci`` extends Hypothesis' own ``ci`` profile (derandomized, no example database)
with the kit's budget; ``deep`` extends Hypothesis' defaults (randomized).
``load_profile`` registers both under those names, replacing Hypothesis' own
``ci``, then loads the one asked for, which may be any profile registered with
Hypothesis (a project's own ``dev``, say).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

__all__ = ["PROFILES", "load_profile"]

# Taken at import, before ``load_profile`` replaces the name ``ci``. ``deep`` names its
# parent too: without one it would inherit whatever profile is loaded (derandomized on CI).
_PARENTS = {"ci": settings.get_profile("ci"), "deep": settings.get_profile("default")}

PROFILES: dict[str, dict[str, object]] = {
    "ci": {"max_examples": 200, "stateful_step_count": 40},
    "deep": {"max_examples": 5000, "stateful_step_count": 120},
}


def load_profile(name: str | None = None) -> str:
    """Register ``ci`` and ``deep`` and load ``name``: by default ``HYPOTHESIS_PROFILE``, else ``ci``.

    ``name`` may be any profile registered with Hypothesis; an unknown one raises
    Hypothesis' ``InvalidArgument`` naming it. Returns the name loaded.
    """
    for profile, budget in PROFILES.items():
        settings.register_profile(
            profile,
            _PARENTS[profile],
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
            print_blob=True,
            **budget,
        )
    wanted = name or os.environ.get("HYPOTHESIS_PROFILE") or "ci"
    settings.load_profile(wanted)
    return wanted

"""The Hypothesis profiles ship with featurestream.testing: importing it is enough to get the project's budgets."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis._settings import _CI_VARS  # the variables by which Hypothesis decides it runs on CI

PROBE = (
    "import featurestream.testing; from hypothesis import settings; d = settings.default; "
    "print(d.max_examples, d.stateful_step_count, d.derandomize)"
)


def _probe(profile: str, *, on_ci: bool) -> list[str]:
    env = {k: v for k, v in os.environ.items() if k not in _CI_VARS}
    env["HYPOTHESIS_PROFILE"] = profile
    if on_ci:
        env["CI"] = "true"
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    return out.stdout.split()


@pytest.mark.parametrize(
    ("profile", "on_ci", "expected"),
    [
        ("ci", False, "200 40 True"),  # the kit's budget on Hypothesis' own ci profile
        ("deep", False, "5000 120 False"),
        ("deep", True, "5000 120 False"),
        ("someone-elses", False, "100 50 False"),  # Hypothesis' defaults, untouched
        ("someone-elses", True, "200 40 True"),  # Hypothesis loaded its ci profile; the kit raised its budget
    ],
)
def test_importing_the_kit_registers_and_loads_the_named_profile(profile: str, on_ci: bool, expected: str) -> None:
    assert _probe(profile, on_ci=on_ci) == expected.split()

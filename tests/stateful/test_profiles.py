"""The Hypothesis profiles ship with featurestream.testing: importing it is enough to get the project's budgets."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

PROBE = (
    "import featurestream.testing; from hypothesis import settings; d = settings.default; "
    "print(d.max_examples, d.stateful_step_count)"
)


@pytest.mark.parametrize(("profile", "expected"), [("deep", "5000 120"), ("someone-elses", "100 50")])
def test_importing_the_kit_registers_and_loads_the_named_profile(profile: str, expected: str) -> None:
    env = {**os.environ, "HYPOTHESIS_PROFILE": profile}
    out = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split() == expected.split(), out.stderr

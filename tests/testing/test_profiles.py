"""The Hypothesis profiles ship with featurestream.testing; importing it changes nothing until one is loaded."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from hypothesis._settings import _CI_VARS  # the variables by which Hypothesis decides it runs on CI

SETTINGS = (
    "from hypothesis import settings; d = settings.default; "
    "print(d.max_examples, d.stateful_step_count, d.derandomize, settings._current_profile, "
    "settings.get_profile('ci').max_examples)"
)


def _run(code: str, profile: str | None, *, on_ci: bool) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in _CI_VARS and k != "HYPOTHESIS_PROFILE"}
    if profile is not None:
        env["HYPOTHESIS_PROFILE"] = profile
    if on_ci:
        env["CI"] = "true"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def _probe(code: str, profile: str | None, *, on_ci: bool) -> list[str]:
    done = _run(code, profile, on_ci=on_ci)
    assert done.returncode == 0, done.stderr
    return done.stdout.split()


@pytest.mark.parametrize("on_ci", [False, True])
@pytest.mark.parametrize("profile", ["ci", "deep", None])
def test_importing_the_kit_changes_no_hypothesis_setting(profile: str | None, on_ci: bool) -> None:
    untouched = _probe(f"import hypothesis; {SETTINGS}", profile, on_ci=on_ci)
    assert _probe(f"import featurestream.testing; {SETTINGS}", profile, on_ci=on_ci) == untouched


@pytest.mark.parametrize(
    ("profile", "on_ci", "expected"),
    [
        ("ci", False, "200 40 True ci"),  # the kit's budget on Hypothesis' own ci profile
        (None, False, "200 40 True ci"),  # no HYPOTHESIS_PROFILE: ci
        ("deep", False, "5000 120 False deep"),
        ("deep", True, "5000 120 False deep"),
        (None, True, "200 40 True ci"),  # Hypothesis loaded its ci profile; loading the kit's raised its budget
    ],
)
def test_load_profile_registers_and_loads_the_named_profile(profile: str | None, on_ci: bool, expected: str) -> None:
    code = f"from featurestream.testing import load_profile; load_profile(); {SETTINGS}"
    assert _probe(code, profile, on_ci=on_ci)[:4] == expected.split()


def test_load_profile_loads_a_project_profile_by_name_and_refuses_an_unknown_one() -> None:
    code = (
        "from hypothesis import settings; from featurestream.testing import load_profile; "
        "settings.register_profile('dev', max_examples=7); print(load_profile('dev'), settings.default.max_examples); "
        "load_profile('nosuch')"
    )
    done = _run(code, None, on_ci=False)
    assert done.stdout.split() == ["dev", "7"]
    assert "InvalidArgument" in done.stderr and "nosuch" in done.stderr


def test_without_hypothesis_the_package_imports_and_the_kit_says_what_to_install() -> None:
    code = (
        "import sys; sys.modules['hypothesis'] = None\n"  # as if Hypothesis were not installed
        "import featurestream, featurestream.queue\n"
        "try:\n    import featurestream.testing\nexcept ImportError as e:\n    print(e)\n"
    )
    done = _run(code, None, on_ci=False)
    assert done.returncode == 0, done.stderr
    assert "pip install 'featurestream[testing]'" in done.stdout

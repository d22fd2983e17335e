"""The package runs on the oldest Python ``pyproject.toml`` declares: vermin (a static minimum-version finder)
reads every module and names anything newer (``typing.Unpack`` imported at runtime needs 3.11, for one). No older
interpreter is installed here, so this is the check that stands in for running the suite on it."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).parents[1]
# vermin reads ``sentinel.open_client`` (our backends/redis/sentinel module) as Python 3.15's ``sentinel`` builtin.
NOT_STDLIB = ("--exclude", "sentinel")


def declared_minimum() -> str:
    """``3.10`` from ``requires-python = ">=3.10"``."""
    found = re.search(r'^requires-python = ">=(\d+\.\d+)"$', (ROOT / "pyproject.toml").read_text(), flags=re.M)
    assert found, "pyproject.toml declares no requires-python lower bound"
    return found.group(1)


def vermin(target: str, *paths: pathlib.Path) -> subprocess.CompletedProcess[str]:
    script = pathlib.Path(sys.executable).with_name("vermin")
    if not script.exists():
        pytest.skip(f"vermin is not installed beside {sys.executable} (pip install vermin)")
    command = [str(script), "--no-tips", "--violations", f"-t={target}-", *NOT_STDLIB]
    command += ["--backport", "typing_extensions", *map(str, paths)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)


def test_nothing_in_the_package_needs_a_newer_python_than_declared() -> None:
    result = vermin(declared_minimum(), ROOT / "src" / "featurestream")
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_check_catches_a_runtime_import_of_a_newer_typing_name(tmp_path: pathlib.Path) -> None:
    # The defect this guards against: stores/*.py once imported typing.Unpack outside TYPE_CHECKING.
    (tmp_path / "store.py").write_text("from __future__ import annotations\n\nfrom typing import Unpack\n")
    result = vermin("3.10", tmp_path)
    assert result.returncode != 0 and "typing.Unpack" in result.stdout, result.stdout

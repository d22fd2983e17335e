"""A plain ``pytest`` collects every test folder: pytest skips folders matching ``norecursedirs``, whose default
names ``dist``, so ``tests/dist`` (the multi-rank tests) once ran only when named."""

from __future__ import annotations

import fnmatch
import pathlib

import pytest

TESTS = pathlib.Path(__file__).parent


def test_no_test_folder_matches_norecursedirs(request: pytest.FixtureRequest) -> None:
    patterns = request.config.getini("norecursedirs")
    # Caches (__pycache__, .hypothesis, .pytest_cache where pytest ran from tests/) hold no tests.
    folders = [
        path
        for path in TESTS.rglob("*")
        if path.is_dir()
        and path.name != "__pycache__"
        and not any(part.startswith(".") for part in path.relative_to(TESTS).parts)
    ]
    assert any(folder.name == "dist" for folder in folders)
    skipped = [
        str(folder.relative_to(TESTS))
        for folder in folders
        if any(fnmatch.fnmatch(folder.name, pattern) for pattern in patterns)
    ]
    assert skipped == [], f"pytest would never collect {skipped} (norecursedirs {patterns})"

"""The real reference package (``nemo-automodel``, installed by ``scripts/test.sh``) for the side-by-side tests.

``reference`` skips when it is not importable; under ``FEATURESTREAM_REQUIRE_TOOLS=1`` that skip is a failure
(tests/conftest.py). featurestream itself never imports it: only these fixtures do.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import types
from collections.abc import Callable
from typing import Any

import pytest

INSTALL_HINT = (
    "the reference package is not installed: pip install --no-deps nemo-automodel==0.7.0 datasets pillow pyyaml "
    "(scripts/test.sh does)"
)
PREFIX = "nemo_automodel.components.speculative"


@dataclasses.dataclass(frozen=True)
class Reference:
    """The reference's modules a recipe imports: its streaming package and its EAGLE-3 backend and target."""

    streaming: types.ModuleType
    backend: types.ModuleType
    target: types.ModuleType

    def module(self, name: str) -> types.ModuleType:
        """``streaming.<name>`` (``queue``, ``stores.local``, ...)."""
        return importlib.import_module(f"{PREFIX}.streaming.{name}")


@pytest.fixture(scope="session")
def reference() -> Reference:
    try:
        return Reference(
            streaming=importlib.import_module(f"{PREFIX}.streaming"),
            backend=importlib.import_module(f"{PREFIX}.eagle.backend"),
            target=importlib.import_module(f"{PREFIX}.eagle.target"),
        )
    except ImportError as exc:
        pytest.skip(f"{INSTALL_HINT} ({exc})")


def assert_takes_the_references_parameters(ours: Callable[..., Any], theirs: Callable[..., Any]) -> None:
    """``ours`` takes the reference's parameters, in its order, and beyond them only keyword-only ones with a
    default (featurestream's opt-ins), so every call written for the reference means the same."""
    mine, expected = list(inspect.signature(ours).parameters.values()), list(inspect.signature(theirs).parameters)
    assert [parameter.name for parameter in mine[: len(expected)]] == expected
    extra = mine[len(expected) :]
    assert all(p.kind is p.KEYWORD_ONLY and p.default is not p.empty for p in extra), extra

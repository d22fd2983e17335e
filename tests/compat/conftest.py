"""The real reference package (``nemo-automodel``, installed by ``scripts/test.sh``) for the side-by-side tests.

``reference`` skips when it is not importable; under ``FEATURESTREAM_REQUIRE_TOOLS=1`` that skip is a failure
(tests/conftest.py). featurestream itself never imports it: only these fixtures do.
"""

from __future__ import annotations

import dataclasses
import importlib
import types

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

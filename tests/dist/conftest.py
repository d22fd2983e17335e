"""A real ``redis-server`` for the multi-rank tests, started exactly as ``tests/backends/redis/conftest.py`` starts it.

That module is loaded by path (``tests/backends/redis`` is not a package), so there is
one way to start a server; it skips (or fails under
``FEATURESTREAM_REQUIRE_TOOLS=1``) without redis-py or ``redis-server`` 7+.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

REDIS_CONFTEST = Path(__file__).resolve().parent.parent / "backends" / "redis" / "conftest.py"


def _redis_helpers() -> Any:
    spec = importlib.util.spec_from_file_location("featurestream_tests_redis_server", REDIS_CONFTEST)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # skips the test when redis-py is missing
    return module


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One in-memory server shared by the tests of this directory; each test uses its own queue name."""
    with _redis_helpers().RedisServer(tmp_path_factory.mktemp("redis"), appendonly=False) as server:
        yield server

"""A real ``redis-server`` for the operator commands' tests: the Redis suite's launcher, loaded from its conftest."""

from __future__ import annotations

import importlib.util
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest


def _redis_launcher() -> ModuleType:
    # tests/backends/redis/conftest.py is the suite's one redis-server launcher (skips without redis-py or redis-server
    # 7+); it is not importable as a package module, so load it by path under a name of its own.
    path = Path(__file__).parent.parent / "backends" / "redis" / "conftest.py"
    spec = importlib.util.spec_from_file_location("featurestream_tests_redis_launcher", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """One in-memory server shared by the tests of this directory; each test uses its own queue name."""
    with _redis_launcher().RedisServer(tmp_path_factory.mktemp("redis"), appendonly=False) as server:
        yield server


@pytest.fixture
def queue_name() -> str:
    return f"ops-{uuid.uuid4().hex}"


@pytest.fixture
def not_redis_url() -> Iterator[str]:
    with _redis_launcher().http_server() as url:
        yield url

"""The operator commands' tests: a queue name of their own and a server that does not speak Redis (the real
``redis-server`` is the suite's session fixture, ``redis_server`` in tests/conftest.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest


@pytest.fixture
def queue_name() -> str:
    return f"ops-{uuid.uuid4().hex}"


@pytest.fixture
def not_redis_url() -> Iterator[str]:
    from support.redis_server import http_server

    with http_server() as url:
        yield url

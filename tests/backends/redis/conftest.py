"""A real ``redis-server`` for the Redis backend's tests (no fakes): started on 127.0.0.1, a free port, a temp dir."""

from __future__ import annotations

import contextlib
import itertools
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

redis = pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")

from featurestream import FeatureStore, LocalFeatureStore  # noqa: E402 - after the redis-py skip, like the backend
from featurestream import VisibilityTimeout as VT  # noqa: E402
from featurestream.backends.redis.queue import RedisSampleRefQueue  # noqa: E402 - needs redis-py
from featurestream.testing import FakeClock  # noqa: E402
from featurestream.tools.redis_servers import ReplicatedRedis  # noqa: E402 - needs redis-py
from featurestream.tools.servers import free_port  # noqa: E402
from support.redis_server import RedisServer, http_server  # noqa: E402


@pytest.fixture
def not_redis_url() -> Iterator[str]:
    with http_server() as url:
        yield url


@pytest.fixture
def closed_port_url() -> str:
    """A redis:// URL of a port bound on 127.0.0.1 and closed again: connections to it are refused."""
    return f"redis://127.0.0.1:{free_port()}/0"


def replicated(directory: Path, **options: Any) -> Iterator[ReplicatedRedis]:
    """A started ``ReplicatedRedis(directory, **options)``, stopped after; skipped where redis-server is missing."""
    try:
        servers = ReplicatedRedis(directory, **options)
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    with servers:
        yield servers


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ReplicatedRedis]:
    """A primary, a replica and three sentinels (``ReplicatedRedis``), for one test module."""
    yield from replicated(tmp_path_factory.mktemp("ha"))


@pytest.fixture
def start_cluster(tmp_path: Path) -> Iterator[Callable[..., ReplicatedRedis]]:
    """Starts a ``ReplicatedRedis`` of the test's own with the options given; stopped after the test."""
    numbers = itertools.count()
    with contextlib.ExitStack() as stack:

        def start(**options: Any) -> ReplicatedRedis:
            directory = tmp_path / f"cluster{next(numbers)}"
            return stack.enter_context(contextlib.contextmanager(replicated)(directory, **options))

        yield start


@pytest.fixture
def durable_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A server of this test's own, with AOF and ``appendfsync always`` (survives SIGKILL + restart)."""
    directory = tmp_path / "redis"
    directory.mkdir()
    with RedisServer(directory, appendonly=True) as server:
        yield server


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


@pytest.fixture
def queue_name() -> str:
    return f"test-{uuid.uuid4().hex}"


@pytest.fixture
def store() -> FeatureStore:
    """The store the test's queues front (a module overrides it, e.g. with a ``FaultyStore``)."""
    return LocalFeatureStore(max_samples=64)


@pytest.fixture
def clock() -> FakeClock:
    """The injected clock of a module whose ``queue_defaults`` give it to its queues."""
    return FakeClock(1000.0)


@pytest.fixture
def queue_defaults() -> dict[str, Any]:
    """The keywords ``make`` gives every queue unless the test passes its own (a module may override them)."""
    return {"visibility_timeout": VT(10.0)}


@pytest.fixture
def make(
    redis_server: RedisServer, queue_name: str, queue_defaults: dict[str, Any]
) -> Iterator[Callable[..., RedisSampleRefQueue]]:
    """A factory of instances of one queue (same name), each with its own connection; all disconnected after."""
    made: list[RedisSampleRefQueue] = []

    def factory(
        store: FeatureStore, queue_class: type[RedisSampleRefQueue] = RedisSampleRefQueue, **kwargs: Any
    ) -> RedisSampleRefQueue:
        queue = queue_class(store, url=redis_server.url, name=queue_name, **{**queue_defaults, **kwargs})
        made.append(queue)
        return queue

    yield factory
    for queue in made:
        queue.disconnect()

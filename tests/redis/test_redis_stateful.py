"""The library's stateful suite (``featurestream.testing``) against the Redis backend on a real server."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from featurestream import LocalFeatureStore
from featurestream.testing import make_queue_machine

redis = pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")
from featurestream.backends.redis.queue import RedisSampleRefQueue  # noqa: E402 - needs redis-py


@pytest.fixture(scope="module")
def shared_client(redis_server: Any) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


def test_redis_queue_follows_the_spec(shared_client: redis.Redis) -> None:
    """Every rule of the spec machine, applied to RedisSampleRefQueue (fresh queue name per example)."""

    def queue_factory(store: LocalFeatureStore, **hooks: Any) -> RedisSampleRefQueue:
        return RedisSampleRefQueue(store, client=shared_client, name=f"stateful-{uuid.uuid4().hex}", **hooks)

    machine = make_queue_machine(lambda: LocalFeatureStore(max_samples=16), queue_factory, name="RedisQueueMachine")
    machine.TestCase().runTest()

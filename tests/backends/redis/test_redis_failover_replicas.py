"""The loss of the primary with the servers set as ``docs/redis.md`` recommends (``min-replicas-to-write 1``):
with two replicas the run goes on; with one the promoted replica has none left, which the queue warns about at
construction and names (``TooFewReplicas``: the server, how many replicas it has and needs, what to do) instead
of reporting the primary lost. Real servers and sentinels throughout."""

from __future__ import annotations

import time
import uuid
import warnings
from collections.abc import Callable

import pytest

redis = pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")

from featurestream import LocalFeatureStore  # noqa: E402
from featurestream import VisibilityTimeout as VT  # noqa: E402
from featurestream.backends.redis.link import NotReplicated  # noqa: E402
from featurestream.backends.redis.queue import RedisSampleRefQueue  # noqa: E402
from featurestream.backends.redis.replicas import TooFewReplicas  # noqa: E402
from featurestream.testing import sample_tensors  # noqa: E402
from featurestream.tools.redis_servers import ReplicatedRedis  # noqa: E402


@pytest.fixture
def one_replica(start_cluster: Callable[..., ReplicatedRedis]) -> ReplicatedRedis:
    return start_cluster(replicas=1, min_replicas_to_write=1)


@pytest.fixture
def two_replicas(start_cluster: Callable[..., ReplicatedRedis]) -> ReplicatedRedis:
    return start_cluster(replicas=2, min_replicas_to_write=1)


def _queue(cluster: ReplicatedRedis, store: LocalFeatureStore, **kwargs: float) -> RedisSampleRefQueue:
    return RedisSampleRefQueue(
        store,
        VT(30.0),
        name=f"replicas-{uuid.uuid4().hex}",
        sentinels=cluster.sentinel_addresses,
        service_name=cluster.service,
        **kwargs,
    )


def _lifecycle(queue: RedisSampleRefQueue, store: LocalFeatureStore, sample_id: str) -> None:
    queue.put(store.put(sample_id, sample_tensors(0)))
    lease = queue.acquire(timeout=5.0)
    assert lease is not None and lease.ref.sample_id == sample_id
    assert queue.ack(lease)


def test_two_replicas_run_on_through_the_loss_of_the_primary(two_replicas: ReplicatedRedis) -> None:
    store = LocalFeatureStore()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # a spare replica: no warning
        queue = _queue(two_replicas, store)
    try:
        _lifecycle(queue, store, "before")
        killed = time.monotonic()
        two_replicas.kill_primary()
        _lifecycle(queue, store, "after")  # retried onto the promoted replica, which keeps one replica
        assert time.monotonic() - killed < 20.0, "the loss of the primary stalled the run past its bound"
        assert (queue.pending_count(), queue.outstanding_count(), queue.stats().acked) == (0, 0, 2)
    finally:
        queue.disconnect()


def test_one_replica_is_warned_about_and_its_loss_named(one_replica: ReplicatedRedis) -> None:
    store = LocalFeatureStore()
    with pytest.warns(RuntimeWarning, match=r"has 1 replica\(s\), and writes need 1 .* Run two replicas"):
        queue = _queue(one_replica, store, reconnect_timeout=3.0)
    try:
        _lifecycle(queue, store, "before")
        old = one_replica.kill_primary()
        promoted = one_replica.wait_failover(old)
        ref = store.put("after", sample_tensors(1))
        started = time.monotonic()
        with pytest.raises(TooFewReplicas) as refused:
            queue.put(ref)
        assert time.monotonic() - started < 3.0 + 2.0, "reconnect_timeout bounds a refused write"
        message = str(refused.value)
        assert f"Sentinel service {one_replica.service!r}" in message
        assert "it has 0 replica(s) connected and its min-replicas-to-write needs 1; nothing ran" in message
        assert "restart the lost primary as one" in message and "run two replicas" in message
        assert "PrimaryLost" not in message and "cannot reach" not in message
        # without min-replicas-to-write the queue's own min_replicas=1 is short too: named the same way
        admin = promoted.client()
        admin.config_set("min-replicas-to-write", 0)
        admin.close()
        with pytest.raises(NotReplicated, match=r"it has 0 replica\(s\) connected\. To go on, start a replica"):
            queue.put(ref)
        one_replica.restart(old)  # the lost primary back as a replica: the queue goes on
        queue.put(store.put("back", sample_tensors(2)))
        assert queue.pending_count() in (1, 2)  # the unreplicated put of "after" may or may not stand
    finally:
        queue.disconnect()

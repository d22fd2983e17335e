"""Retried calls are exact: a call whose reply is lost, retried after another instance changed the queue, has the
effect on the queue and on every store's accounting that one call that got its reply has.

Against a real redis-server: the first attempt runs on the server, its reply is dropped (the connection error a
client sees when the network loses it), a concurrent consumer -- another instance with its own connection and
store -- acts, and only then does the client retry, through the same path a real lost reply takes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from featurestream import LocalFeatureStore, SampleRef
from featurestream import VisibilityTimeout as VT
from featurestream.stores.base import FeatureStore
from featurestream.testing import FakeClock, sample_tensors

redis = pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")
from featurestream.backends.redis.queue import RedisSampleRefQueue  # noqa: E402 - needs redis-py

Factory = Callable[..., RedisSampleRefQueue]


@pytest.fixture
def queue_defaults(clock: FakeClock) -> dict[str, Any]:
    return {"visibility_timeout": VT(10.0), "clock": clock}


def lose_reply(queue: RedisSampleRefQueue, function: str, meanwhile: Callable[[], object]) -> list[str]:
    """Make the next call of server function ``function`` run but lose its reply; ``meanwhile`` runs before the
    retry. Returns a list that holds ``function`` once the reply was lost (so a test knows it was)."""
    link = queue._link
    real = link._request
    name = queue._library.function(function)
    lost: list[str] = []

    def losing(conn: Any, called: str, header: str, args: tuple[Any, ...]) -> Any:
        if called != name or lost:
            return real(conn, called, header, args)
        real(conn, called, header, args)
        lost.append(function)
        meanwhile()
        raise redis.ConnectionError("the reply was lost")

    link._request = losing  # type: ignore[method-assign]
    return lost


def one_store_twice() -> tuple[LocalFeatureStore, LocalFeatureStore]:
    """Two instances of one store, each keeping its own accounting, as two processes' SharedDirFeatureStore
    instances over one mount do: the queue pins one store URI, so the second takes the first's."""
    store, other = LocalFeatureStore(max_samples=64), LocalFeatureStore(max_samples=64)
    other.store_uri = store.store_uri
    return store, other


def stored(store: LocalFeatureStore, *indices: int) -> list[SampleRef]:
    return [store.put(f"s{i}", sample_tensors(i)) for i in indices]


def consume_one(consumer: RedisSampleRefQueue, how: str = "ack") -> str:
    lease = consumer.acquire(timeout=0)
    assert lease is not None
    getattr(consumer, how)(lease)
    return lease.ref.sample_id


def settled_everywhere(*stores: FeatureStore) -> None:
    for store in stores:
        health = store.health()
        assert (health.sample_count, health.resident_bytes) == (0, 0), f"{store.store_uri} still holds {health}"


@pytest.mark.parametrize("batch", [False, True], ids=["put", "put_many"])
def test_a_retried_put_that_was_consumed_meanwhile_is_scrubbed(make: Factory, batch: bool) -> None:
    store, other = one_store_twice()
    producer, consumer = make(store), make(other)
    refs = stored(store, 0, 1)
    lost = lose_reply(producer, "put_many" if batch else "put", lambda: consume_one(consumer))
    if batch:
        producer.put_many(refs)
    else:
        producer.put(refs[0])
        producer.put(refs[1])
    assert lost
    assert not store.is_resident("s0"), "the producer's store still counts the sample consumed before the retry"
    assert consume_one(consumer) == "s1"
    producer.reclaim_expired()  # the settle feed tells the producer about s1
    settled_everywhere(store, other)
    stats = producer.stats()
    assert (stats.put, stats.acked, stats.pending, stats.outstanding) == (2, 2, 0, 0)


@pytest.mark.parametrize("batch", [False, True], ids=["ack", "ack_many"])
def test_a_retried_ack_scrubs_once(make: Factory, batch: bool) -> None:
    store, other = one_store_twice()
    queue, consumer = make(store), make(other)
    queue.put_many(stored(store, 0, 1, 2))
    leases = queue.acquire_many(2, timeout=0)
    lost = lose_reply(queue, "ack", lambda: consume_one(consumer))
    if batch:
        queue.ack_many(leases)
    else:
        queue.ack(leases[0])
        queue.ack(leases[1])
    assert lost
    queue.reclaim_expired()
    settled_everywhere(store, other)
    stats = queue.stats()
    assert (stats.acked, stats.stale_rejected, stats.pending, stats.outstanding) == (3, 0, 0, 0)


def test_a_retried_fail_that_dead_lettered_scrubs_once(make: Factory) -> None:
    store, other = one_store_twice()
    queue, consumer = make(store, max_deliveries=1), make(other, max_deliveries=1)
    queue.put_many(stored(store, 0, 1))
    lease = queue.acquire(timeout=0)
    assert lease is not None
    lost = lose_reply(queue, "fail", lambda: consume_one(consumer))
    queue.fail(lease)
    assert lost
    queue.reclaim_expired()
    settled_everywhere(store, other)
    assert [letter.ref.sample_id for letter in queue.dead_letters()] == ["s0"]
    stats = queue.stats()
    assert (stats.failed, stats.dead_lettered, stats.acked, stats.stale_rejected) == (1, 1, 1, 0)


def test_a_retried_fail_that_redelivered_leaves_the_redelivery(make: Factory) -> None:
    store, other = one_store_twice()
    queue, consumer = make(store), make(other)
    queue.put(stored(store, 0)[0])
    lease = queue.acquire(timeout=0)
    assert lease is not None
    lost = lose_reply(queue, "fail", lambda: consume_one(consumer))  # the consumer acks the redelivery
    assert queue.fail(lease) is True
    assert lost
    queue.reclaim_expired()
    settled_everywhere(store, other)
    stats = queue.stats()
    assert (stats.failed, stats.acked, stats.pending, stats.outstanding, stats.stale_rejected) == (1, 1, 0, 0, 0)


def test_a_retried_extend_extends_once(make: Factory, clock: FakeClock) -> None:
    store, other = one_store_twice()
    queue, consumer = make(store), make(other)
    queue.put_many(stored(store, 0, 1))
    lease = queue.acquire(timeout=0)
    assert lease is not None
    clock.advance(5.0)
    lost = lose_reply(queue, "extend", lambda: consume_one(consumer))
    queue.extend(lease, 20.0)
    assert lost and lease.deadline == 1025.0
    clock.advance(19.0)
    assert queue.reclaim_expired() == 0  # extended to 1025: still live
    queue.ack(lease)
    queue.reclaim_expired()
    settled_everywhere(store, other)
    stats = queue.stats()
    assert (stats.acked, stats.reclaimed) == (2, 0)


def test_a_retried_extend_counts_once(make: Factory) -> None:
    store, other = one_store_twice()
    queue, consumer = make(store), make(other)
    queue.put_many(stored(store, 0, 1))
    lease = queue.acquire(timeout=0)
    assert lease is not None
    lost = lose_reply(queue, "extend", lambda: consume_one(consumer))
    queue.extend(lease, 20.0)
    assert lost
    assert queue.stats().extended == 1


def dead_and_kept(make: Factory) -> tuple[RedisSampleRefQueue, RedisSampleRefQueue]:
    store, other = one_store_twice()
    queue = make(store, max_deliveries=1, keep_dead_letter_bytes=1 << 20)
    consumer = make(other, max_deliveries=1, keep_dead_letter_bytes=1 << 20)
    queue.put_many(stored(store, 0, 1))
    lease = queue.acquire(timeout=0)
    assert lease is not None
    queue.fail(lease)  # s0: a dead letter whose bytes stay retained in the producer's store
    return queue, consumer


def test_a_retried_requeue_requeues_once(make: Factory) -> None:
    queue, consumer = dead_and_kept(make)
    lost = lose_reply(queue, "requeue", lambda: consume_one(consumer))
    assert queue.requeue_dead_letters(["s0"]) == ["s0"]
    assert lost
    assert queue.dead_letters() == [] and queue.pending_count() == 1  # s0, queued once
    assert consume_one(consumer) == "s0"
    queue.reclaim_expired()
    settled_everywhere(queue._store, consumer._store)


def test_a_retried_purge_purges_once(make: Factory) -> None:
    queue, consumer = dead_and_kept(make)
    lost = lose_reply(queue, "purge", lambda: consume_one(consumer))
    assert queue.purge_dead_letters(["s0"]) == ["s0"]
    assert lost
    assert queue.dead_letters() == [] and queue.pending_count() == 0
    queue.reclaim_expired()  # the settle feed tells the producer about s1
    settled_everywhere(queue._store, consumer._store)  # the purge released s0's bytes


def test_a_retried_stale_ack_counts_once(make: Factory) -> None:
    store, _ = one_store_twice()
    queue = make(store)
    queue.put(stored(store, 0)[0])
    lease = queue.acquire(timeout=0)
    assert lease is not None
    assert queue.ack(lease) is True
    lost = lose_reply(queue, "ack", lambda: None)
    assert queue.ack(lease) is False
    assert lost and queue.stats().stale_rejected == 1


def test_a_retried_refused_put_counts_once(make: Factory) -> None:
    store, _ = one_store_twice()
    queue = make(store)
    ref = stored(store, 0)[0]
    queue.put(ref)
    consume_one(queue)
    lost = lose_reply(queue, "put_many", lambda: None)  # the re-put's check call
    with pytest.raises(ValueError):
        queue.put(ref)
    assert lost and queue.stats().dedup_refused == 1

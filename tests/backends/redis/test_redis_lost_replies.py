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

from featurestream import DeadLetter, LocalFeatureStore, SampleRef
from featurestream import VisibilityTimeout as VT
from featurestream.core import events
from featurestream.stores.base import FeatureStore
from featurestream.testing import FakeClock, sample_tensors

redis = pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")
from featurestream.backends.redis import functions  # noqa: E402 - needs redis-py
from featurestream.backends.redis.queue import RedisSampleRefQueue  # noqa: E402

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


@pytest.mark.parametrize("traced", [False, True], ids=["untraced", "traced"])
@pytest.mark.parametrize("batch", [False, True], ids=["put", "put_many"])
def test_a_retried_put_that_was_consumed_meanwhile_is_scrubbed(make: Factory, batch: bool, traced: bool) -> None:
    """Traced, the retry's reply is the first run's (remembered), told afresh whether the sample settled since;
    untraced, the retry finds its put by the put token. Either way the producer's store lets the sample go."""
    store, other = one_store_twice()
    trace: list[tuple[str, dict[str, object]]] = []
    tracer = (lambda action, fields: trace.append((action, fields))) if traced else None
    producer, consumer = make(store, tracer=tracer), make(other)
    refs = stored(store, 0, 1)
    lost = lose_reply(producer, "put_many" if batch else "put", lambda: consume_one(consumer))
    if batch:
        producer.put_many(refs)
    else:
        producer.put(refs[0])
        producer.put(refs[1])
    assert lost
    assert not store.is_resident("s0"), "the producer's store still counts the sample consumed before the retry"
    if traced:  # the Puts report the queue as their runs left it: s0's, the first run's
        puts = [(fields["sample_id"], fields["pending"]) for action, fields in trace if action == events.PUT]
        assert puts == [("s0", 1), ("s1", 2 if batch else 1)]
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


@pytest.mark.parametrize("function", ["lose", "reject"])
def test_a_retried_lose_or_reject_dead_letters_once(make: Factory, function: str) -> None:
    store, other = one_store_twice()
    dead: list[DeadLetter] = []
    queue, consumer = make(store, on_dead_letter=dead.append), make(other)
    queue.put_many(stored(store, 0, 1))
    lease = queue.acquire(timeout=0)
    assert lease is not None
    lost = lose_reply(queue, function, lambda: consume_one(consumer))
    assert (queue.lose(lease) if function == "lose" else queue.reject(lease, "sample 's0': bad feature")) is True
    assert lost
    assert [(letter.ref.sample_id, letter.deliveries) for letter in dead] == [("s0", 1)]
    assert [letter.ref.sample_id for letter in queue.dead_letters()] == ["s0"]
    queue.reclaim_expired()
    settled_everywhere(store, other)
    stats = queue.stats()
    assert (stats.failed, stats.dead_lettered, stats.acked, stats.pending) == (1, 1, 1, 0)


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


def test_a_retried_traced_ack_traces_what_its_first_run_reported(make: Factory) -> None:
    """The retry's trace is the first run's: its Ack carries the counts that run left, not the retry's."""
    store, other = one_store_twice()
    trace: list[tuple[str, dict[str, object]]] = []
    queue, consumer = make(store, tracer=lambda action, fields: trace.append((action, fields))), make(other)
    queue.put_many(stored(store, 0, 1, 2))
    leases = queue.acquire_many(2, timeout=0)
    lost = lose_reply(queue, "ack", lambda: consume_one(consumer))  # s2: pending 1 -> 0 before the retry
    assert queue.ack(leases[0]) is True
    assert lost
    acks = [fields for action, fields in trace if action == events.ACK]
    assert acks == [
        {"sample_id": "s0", "lease_id": leases[0].lease_id, "n": 0, "pending": 1, "outstanding": 1, "now": 1000.0}
    ]


def test_a_retried_traced_acquire_hands_out_its_first_runs_leases(make: Factory) -> None:
    store, other = one_store_twice()
    queue = make(store, tracer=lambda action, fields: None)
    consumer = make(other)
    queue.put_many(stored(store, 0, 1))
    lost = lose_reply(queue, "acquire", lambda: consume_one(consumer))
    lease = queue.acquire(timeout=0)
    assert lost and lease is not None and lease.ref.sample_id == "s0"
    assert queue.ack(lease) is True
    stats = queue.stats()
    assert (stats.leased, stats.acked, stats.outstanding, stats.pending) == (2, 2, 0, 0)


class Scrubs:
    """Counts each sample's scrubs in ``store`` (and still scrubs)."""

    def __init__(self, store: LocalFeatureStore) -> None:
        self.counts: dict[str, int] = {}
        real = store.scrub

        def scrub(ref: SampleRef) -> None:
            self.counts[ref.sample_id] = self.counts.get(ref.sample_id, 0) + 1
            real(ref)

        store.scrub = scrub  # type: ignore[method-assign]


@pytest.mark.parametrize("reaper", ["reclaim", "put", "ack"])
def test_a_lost_reply_of_a_call_that_dead_lettered_a_reaped_lease_is_applied_once(
    make: Factory, clock: FakeClock, reaper: str
) -> None:
    """The reap events of a call whose reply was lost (a reclaim's, or a put's or an ack's that reaped on the way)
    reach the caller with the retry: the dead letter is scrubbed once and its callback runs once."""
    store, other = one_store_twice()
    scrubs = Scrubs(store)
    dead: list[DeadLetter] = []
    producer = make(store, max_deliveries=1, on_dead_letter=dead.append)
    consumer = make(other, max_deliveries=1)
    producer.put_many(stored(store, 0, 1, 2))
    crashed = consumer.acquire(timeout=0)  # leased, never settled: its holder crashed
    held = producer.acquire(timeout=0)
    assert crashed is not None and held is not None and (crashed.ref.sample_id, held.ref.sample_id) == ("s0", "s1")
    producer.extend(held, 100.0)
    clock.advance(11.0)
    lost = lose_reply(producer, reaper, lambda: consume_one(consumer))  # s2 is acked meanwhile
    if reaper == "reclaim":
        producer.reclaim_expired()
    elif reaper == "put":
        producer.put(stored(store, 3)[0])
        assert consume_one(consumer) == "s3"
    else:
        assert producer.ack(held) is True
    assert lost
    assert [letter.ref.sample_id for letter in dead] == ["s0"]
    if reaper != "ack":
        assert producer.ack(held) is True
    producer.reclaim_expired()  # the settle feed: s2 (and s3)
    assert scrubs.counts == {"s0": 1, "s1": 1, "s2": 1} | ({"s3": 1} if reaper == "put" else {})
    settled_everywhere(store, other)
    assert [letter.ref.sample_id for letter in producer.dead_letters()] == ["s0"]
    assert producer.stats().dead_lettered == 1


def remembered(queue: RedisSampleRefQueue) -> dict[str, str]:
    """The ``calls`` hash: instance id -> its remembered call."""
    return {key.decode(): value.decode() for key, value in queue._redis.hgetall(queue._key["calls"]).items()}


def test_a_disconnecting_instance_drops_its_remembered_reply(make: Factory) -> None:
    store, other = one_store_twice()
    queue, consumer = make(store), make(other)
    queue.put(stored(store, 0)[0])
    lease = queue.acquire(timeout=0)
    assert lease is not None
    queue.fail(lease)  # a fail's reply is always remembered
    assert len(remembered(consumer)) == 1
    queue.disconnect()
    assert remembered(consumer) == {}
    assert consumer._redis.zcard(consumer._key["calls_due"]) == 0


def test_remembered_replies_are_dropped_by_the_reaper_once_no_retry_can_come(make: Factory, clock: FakeClock) -> None:
    """Kept ``functions.MEMO_SECONDS`` of the queue's clock (at least twice the instance's reconnect_timeout),
    then dropped by the next reaper call of any instance; a younger one stays."""
    store, other = one_store_twice()
    old, young, reaper = make(store), make(other), make(other)
    old.put_many(stored(store, 0, 1))
    lease = old.acquire(timeout=0)
    assert lease is not None
    old.extend(lease)  # remembered at 1000
    clock.advance(functions.MEMO_SECONDS / 2)
    lease = young.acquire(timeout=0)
    assert lease is not None
    young.fail(lease)  # remembered at 1300
    assert len(remembered(reaper)) == 2
    clock.advance(functions.MEMO_SECONDS / 2 + 1)
    reaper.reclaim_expired()
    assert list(remembered(reaper).values()) == list(remembered(young).values())
    assert len(remembered(reaper)) == 1
    clock.advance(functions.MEMO_SECONDS)
    reaper.reclaim_expired()
    assert remembered(reaper) == {}

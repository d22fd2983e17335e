"""Store faults and blocked producers on the Redis backend: the in-process queue's contract, over a real server.

A queue operation takes effect completely or changes nothing; a settle that took effect on the server stands
whatever the store raises afterwards (the scrub is owed, retried, counted); a store fault of one sample never
surfaces from an unrelated caller; producers paused by backpressure never wait forever on an empty queue.
"""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from featurestream import DeadLetter, FeatureStore, LocalFeatureStore
from featurestream import VisibilityTimeout as VT
from featurestream.common.refs import SampleRef
from featurestream.testing import UNTIL_CLEARED, FakeClock, FaultyStore, sample_tensors

redis = pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")
from featurestream.backends.redis.queue import RedisSampleRefQueue  # noqa: E402 - needs redis-py

Factory = Callable[..., RedisSampleRefQueue]
BOUND = 30.0  # seconds a blocked call may take before the test calls it a hang


@pytest.fixture
def store() -> FaultyStore:
    return FaultyStore(LocalFeatureStore(max_samples=64))


def stored(store: FeatureStore, index: int) -> SampleRef:
    return store.put(f"s{index}", sample_tensors(index))


def test_an_ack_whose_scrub_fails_stands_and_the_scrub_is_retried(make: Factory, store: FaultyStore) -> None:
    queue = make(store)
    ref = stored(store, 0)
    queue.put(ref)
    lease = queue.acquire(timeout=0)
    assert lease is not None
    store.arm("scrub", 2)
    queue.ack(lease)  # returns normally: the ack took effect on the server
    stats = queue.stats()  # retries the owed scrub first: it fails once more
    assert (stats.acked, stats.store_errors, stats.scrub_backlog) == (1, 2, 1)
    assert store.is_resident("s0")  # the bytes are still owed
    with pytest.raises(ValueError, match="s0"):
        queue.put(ref)  # settled for good: never accepted (nor delivered) again; this call paid the scrub
    assert queue.acquire(timeout=0) is None
    stats = queue.stats()
    assert not store.is_resident("s0") and stats.scrub_backlog == 0 and stats.put == 1
    assert queue.lifecycle_state == "open" and queue.pending_count() == 0


def test_a_scrub_that_keeps_failing_is_retried_until_the_bytes_leave(make: Factory, store: FaultyStore) -> None:
    queue = make(store)
    queue.put(stored(store, 0))
    store.arm("scrub", UNTIL_CLEARED)
    queue.ack(queue.acquire(timeout=0))  # type: ignore[arg-type]
    for _ in range(3):
        assert queue.acquire(timeout=0) is None
    assert store.is_resident("s0") and queue.stats().store_errors == 5  # the ack's, 3 acquires', stats' own
    store.clear()
    queue.reclaim_expired()
    assert not store.is_resident("s0") and queue.stats().scrub_backlog == 0


def test_a_failed_retain_refuses_the_put_and_changes_nothing(make: Factory, store: FaultyStore) -> None:
    queue = make(store)
    ref = stored(store, 0)
    before = store.health()
    store.arm("retain")
    with pytest.raises(OSError, match="s0") as raised:
        queue.put(ref)
    assert raised.value.errno == errno.EIO
    stats = queue.stats()
    assert (stats.put, stats.pending, stats.store_errors) == (0, 0, 1)
    assert store.health() == before
    queue.put(ref)  # the id is not burnt: a retry once the store recovers is accepted
    assert queue.pending_count() == 1


def test_a_failed_retain_refuses_a_whole_batch(make: Factory, store: FaultyStore) -> None:
    queue = make(store)
    refs = [stored(store, i) for i in range(3)]
    before = store.health()
    store.arm("retain")
    with pytest.raises(OSError, match="s0"):
        queue.put_many(refs)
    assert queue.stats().put == 0 and store.health() == before
    queue.put_many(refs)
    assert [lease.ref.sample_id for lease in queue.acquire_many(5, timeout=0)] == ["s0", "s1", "s2"]


def test_an_unretain_that_fails_is_retried(make: Factory, store: FaultyStore) -> None:
    queue = make(store)
    ref = stored(store, 0)
    queue.put(ref)
    queue.ack(queue.acquire(timeout=0))  # type: ignore[arg-type]
    again = stored(store, 0)
    other = make(store)  # another instance: it has not seen s0 settled, so it retains before the server refuses
    store.arm("unretain", 2)
    with pytest.raises(ValueError, match="already acked"):
        other.put(again)  # refused; the un-retain that restores the store raised and is owed
    assert other.stats().scrub_backlog == 1  # its retry failed once more
    assert other.stats().scrub_backlog == 0 and store.health().sample_count == 1  # paid: plain residency again
    store.scrub(again)
    assert store.health().sample_count == 0


def test_health_failure_in_a_blocking_put_raises_and_enqueues_nothing(make: Factory, store: FaultyStore) -> None:
    queue = make(store)
    store.arm("health")
    with pytest.raises(OSError, match="s0"):
        queue.put_blocks_until_below(stored(store, 0), poll_interval=0.01)
    assert queue.stats().put == 0 and queue.stats().store_errors == 1


def test_gc_failures_are_logged_and_ignored(make: Factory, store: FaultyStore) -> None:
    queue = make(store)
    store.arm("gc", UNTIL_CLEARED)
    queue.put(stored(store, 0))
    queue.ack(queue.acquire(timeout=0))  # type: ignore[arg-type]
    assert queue.stats().acked == 1 and queue.stats().store_errors >= 2 and not store.is_resident("s0")


def test_a_reaped_dead_letter_whose_scrub_fails_never_surfaces_from_another_caller(
    redis_server: Any, queue_name: str, store: FaultyStore
) -> None:
    clock = FakeClock(1000.0)
    dead: list[DeadLetter] = []
    queue = RedisSampleRefQueue(
        store, VT(1.0), url=redis_server.url, name=queue_name, clock=clock, max_deliveries=1, on_dead_letter=dead.append
    )
    try:
        for i in range(2):
            queue.put(stored(store, i))
        assert queue.acquire(timeout=0) is not None  # s0's consumer crashes
        clock.advance(2.0)
        store.arm("scrub", UNTIL_CLEARED)
        lease = queue.acquire(timeout=0)  # reaps s0 into the dead letters; its scrub raises, not this call
        assert lease is not None and lease.ref.sample_id == "s1"
        assert [letter.ref.sample_id for letter in dead] == ["s0"]  # exactly once
        assert queue.stats().dead_lettered == 1 and queue.stats().scrub_backlog == 1
        store.clear()
        queue.ack(lease)  # pays the owed scrub of s0 too
        assert dead == dead[:1] and store.health().sample_count == 0
    finally:
        queue.disconnect()


def test_the_reaper_survives_store_errors(redis_server: Any, queue_name: str, store: FaultyStore) -> None:
    dead: list[DeadLetter] = []
    queue = RedisSampleRefQueue(
        store, VT(0.05), url=redis_server.url, name=queue_name, max_deliveries=1, reaper_interval=0.01,
        on_dead_letter=dead.append,
    )  # fmt: skip
    try:
        queue.put(stored(store, 0))
        store.arm("scrub", UNTIL_CLEARED)
        assert queue.acquire(timeout=0) is not None  # never settled: the reaper dead-letters it
        assert _eventually(lambda: store.raised["scrub"] >= 3)  # the reaper keeps retrying, and lives on
        store.clear()
        assert _eventually(lambda: not store.is_resident("s0"))
        assert len(dead) == 1 and queue.stats().dead_lettered == 1
    finally:
        queue.disconnect()


def test_paused_producers_never_wait_forever_on_an_empty_queue(make: Factory) -> None:
    """The issue's scenario: two producers each store a sample, high = 2 samples, low = 1, nothing queued."""
    store = LocalFeatureStore(max_samples=64)
    size = _nbytes(0)
    queue = make(store, high_watermark_bytes=2 * size, low_watermark_bytes=size)
    refs = [store.put(f"s{i}", sample_tensors(0)) for i in range(2)]
    errors: list[BaseException] = []
    threads = [threading.Thread(target=_producing, args=(queue, ref, errors), daemon=True) for ref in refs]
    for thread in threads:
        thread.start()
    consumed = []
    while len(consumed) < 2:
        lease = queue.acquire(timeout=BOUND)
        assert lease is not None, "a paused producer waited forever while the queue could progress"
        consumed.append(lease.ref.sample_id)
        queue.ack(lease)
    for thread in threads:
        thread.join(timeout=BOUND)
        assert not thread.is_alive()
    assert not errors and sorted(consumed) == ["s0", "s1"] and queue.stats().producer_pauses >= 1


def test_close_wakes_a_blocked_producer(make: Factory) -> None:
    store = LocalFeatureStore(max_samples=64)
    queue = make(store, high_watermark_bytes=1, low_watermark_bytes=0)
    queue.put(stored(store, 0))  # the queue holds a sample: the paused producer must wait
    errors: list[BaseException] = []
    thread = threading.Thread(target=_producing, args=(queue, stored(store, 1), errors, 60.0), daemon=True)
    thread.start()
    assert _eventually(lambda: queue.backpressure_state == "paused")
    queue.close()
    thread.join(timeout=BOUND)
    assert not thread.is_alive() and len(errors) == 1 and "closed" in str(errors[0])
    assert queue.stats().put == 1


def _producing(queue: RedisSampleRefQueue, ref: SampleRef, errors: list[BaseException], poll: float = 0.01) -> None:
    try:
        queue.put_blocks_until_below(ref, poll_interval=poll)
    except BaseException as exc:  # handed to the test thread
        errors.append(exc)


def _nbytes(index: int) -> int:
    return sum(t.numel() * t.element_size() for t in sample_tensors(index).values())


def _eventually(condition: Callable[[], bool]) -> bool:
    give_up = time.monotonic() + BOUND
    while not condition():
        if time.monotonic() > give_up:
            return False
        time.sleep(0.01)
    return True

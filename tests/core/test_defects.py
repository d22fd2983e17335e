"""The reference's known defects A-F (docs/design.md), each replayed against featurestream.

G (O(n) hot paths) is measured by ``benchmarks/bench_queue.py``, not timed here.
"""

from __future__ import annotations

import threading
import time

from featurestream import LocalFeatureStore, SampleRefQueue, VisibilityTimeout
from featurestream.testing import FakeClock
from support.samples import put_sample


def make_queue(**kwargs: object) -> tuple[LocalFeatureStore, SampleRefQueue, FakeClock]:
    store = LocalFeatureStore()
    clock = FakeClock(1000.0)
    return store, SampleRefQueue(store, VisibilityTimeout(5.0), clock=clock, **kwargs), clock  # type: ignore[arg-type]


def test_a_redelivered_sample_survives_a_slow_consumers_release() -> None:
    store, queue, clock = make_queue()
    queue.put(put_sample(store, "S"))
    slow = queue.acquire(poll_interval=0)
    assert slow is not None
    _, slow_handle = store.get(slow.ref)
    clock.advance(5.0)
    assert queue.reclaim_expired() == 1
    store.release(slow_handle)  # the slow (not dead) consumer finally lets go
    retry = queue.acquire(poll_interval=0)
    assert retry is not None and retry.redelivery_count == 1
    tensors, handle = store.get(retry.ref)  # the reference raised KeyError here
    assert set(tensors) == set(retry.ref.feature_names())
    store.release(handle)
    queue.ack(retry)
    assert store.health().sample_count == 0


def test_b_a_crashed_consumers_handle_does_not_leak_residency() -> None:
    store, queue, clock = make_queue()
    queue.put(put_sample(store, "S"))
    crashed = queue.acquire(poll_interval=0)
    assert crashed is not None
    store.get(crashed.ref)  # then the consumer dies: its handle is never released
    clock.advance(5.0)
    survivor = queue.acquire(poll_interval=0)
    assert survivor is not None
    _, handle = store.get(survivor.ref)
    store.release(handle)
    queue.ack(survivor)
    health = store.health()
    assert (health.resident_bytes, health.sample_count) == (0, 0)
    assert health.low_watermark_hit and not health.high_watermark_hit
    # The queue ran store.gc() after the ack: the crashed consumer's handle bookkeeping is gone too.
    assert not store._handles and store.gc() == 0


def test_c_a_producer_retry_of_an_acked_sample_is_never_delivered_again() -> None:
    store, queue, _ = make_queue()
    ref = put_sample(store, "S")
    queue.put(ref)
    lease = queue.acquire(poll_interval=0)
    assert lease is not None
    queue.ack(lease)
    retried = put_sample(store, "S")  # the producer's retry re-stores the same id
    try:
        queue.put(retried)
    except ValueError as exc:
        assert "already acked" in str(exc)
    else:
        raise AssertionError("the re-put of an acked sample was accepted")
    assert queue.acquire(poll_interval=0) is None
    assert queue.stats().acked == 1 and queue.stats().dedup_refused == 1


def test_d_a_poison_ref_is_dead_lettered_after_max_deliveries() -> None:
    store, queue, _ = make_queue(max_deliveries=3)
    queue.put(put_sample(store, "poison"))
    deliveries = 0
    while (lease := queue.acquire(poll_interval=0)) is not None:
        deliveries += 1
        queue.fail(lease)
    assert deliveries == 3
    [dead] = queue.dead_letters()
    assert (dead.ref.sample_id, dead.deliveries) == ("poison", 3) and "failed" in dead.reason
    assert store.health().sample_count == 0


def test_e_a_crashed_lease_is_redelivered_without_calling_reclaim_expired() -> None:
    store, queue, clock = make_queue()
    queue.put(put_sample(store, "S"))
    assert queue.acquire(poll_interval=0) is not None  # this consumer crashes
    clock.advance(5.0)
    retry = queue.acquire(poll_interval=0)  # nobody called reclaim_expired
    assert retry is not None and retry.ref.sample_id == "S" and retry.redelivery_count == 1


def test_e_the_reaper_thread_redelivers_to_a_consumer_already_waiting() -> None:
    store = LocalFeatureStore()
    queue = SampleRefQueue(store, VisibilityTimeout(0.05))
    queue.put(put_sample(store, "S"))
    assert queue.acquire(poll_interval=0) is not None  # crashes
    retry = queue.acquire(timeout=30)  # wakes at the deadline, not after 30 s
    assert retry is not None and retry.redelivery_count == 1


def _acquire_in_thread(queue: SampleRefQueue, timeout: float) -> tuple[threading.Thread, list[object]]:
    got: list[object] = []
    waiting = threading.Event()

    def consume() -> None:
        waiting.set()
        got.append(queue.acquire(timeout=timeout))
        got.append(time.monotonic())

    thread = threading.Thread(target=consume)
    thread.start()
    waiting.wait()
    return thread, got


def test_f_put_and_fail_wake_a_waiting_acquire() -> None:
    store = LocalFeatureStore()
    queue = SampleRefQueue(store)
    thread, got = _acquire_in_thread(queue, timeout=60)
    time.sleep(0.02)  # let it block
    put_at = time.monotonic()
    queue.put(put_sample(store, "S"))
    thread.join(30)
    lease = got[0]
    assert lease is not None and not thread.is_alive()
    assert got[1] - put_at < 30, "acquire slept instead of waking on put"  # type: ignore[operator]
    holder = queue.acquire(poll_interval=0)
    assert holder is None
    thread, got = _acquire_in_thread(queue, timeout=60)
    time.sleep(0.02)
    queue.fail(lease)  # type: ignore[arg-type]
    thread.join(30)
    assert not thread.is_alive() and got[0] is not None


def test_f_close_wakes_waiters_of_an_empty_queue() -> None:
    queue = SampleRefQueue(LocalFeatureStore())
    thread, got = _acquire_in_thread(queue, timeout=60)
    time.sleep(0.02)
    queue.close()
    thread.join(30)
    assert not thread.is_alive() and got[0] is None and queue.lifecycle_state == "drained"

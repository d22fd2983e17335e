"""Batch operations, dead-letter repair and ``oldest_lease_age`` on the in-process queue."""

from __future__ import annotations

import errno
import threading

import pytest

from featurestream import LocalFeatureStore, SampleRef, SampleRefQueue, VisibilityTimeout
from featurestream.spec.recording import TraceRecorder
from featurestream.testing import FakeClock
from support.samples import put_sample


def make_queue(**kwargs: object) -> tuple[LocalFeatureStore, SampleRefQueue, FakeClock, TraceRecorder]:
    store = LocalFeatureStore(max_samples=None, max_bytes=1 << 30)
    clock = FakeClock(1000.0)
    recorder = TraceRecorder()
    queue = SampleRefQueue(store, VisibilityTimeout(10.0), clock=clock, tracer=recorder, **kwargs)  # type: ignore[arg-type]
    return store, queue, clock, recorder


def actions(recorder: TraceRecorder) -> list[str]:
    return [action for action, _ in recorder.events]


# -- batches ---------------------------------------------------------------------------


def test_put_many_enqueues_all_in_order_or_none() -> None:
    store, queue, _, recorder = make_queue()
    old = put_sample(store, "old")
    queue.put(old)
    lease = queue.acquire(poll_interval=0)
    assert lease is not None
    queue.ack(lease)
    batch = [put_sample(store, "a"), put_sample(store, "b")]
    with pytest.raises(ValueError, match="'old' was already acked"):
        queue.put_many([*batch, old])
    with pytest.raises(ValueError, match="'a' appears twice"):
        queue.put_many([batch[0], batch[0]])
    assert queue.pending_count() == 0 and queue.stats().put == 1
    queue.put_many(batch)
    assert [queue.acquire(poll_interval=0).ref.sample_id for _ in batch] == ["a", "b"]  # type: ignore[union-attr]
    assert actions(recorder).count("Put") == 3


def test_put_many_refused_by_a_retain_fault_lets_the_others_go() -> None:
    class RetainFailsForB(LocalFeatureStore):
        def retain(self, ref: SampleRef) -> None:
            if ref.sample_id == "b":
                raise OSError(errno.EIO, "Input/output error")
            super().retain(ref)

    store = RetainFailsForB(max_samples=None, max_bytes=1 << 30)
    queue = SampleRefQueue(store)
    first, second = put_sample(store, "a"), put_sample(store, "b")
    with pytest.raises(OSError, match="'b'"):
        queue.put_many([first, second])
    assert queue.pending_count() == 0 and queue.stats().put == 0 and queue.stats().scrub_backlog == 0
    store.release(store.get(first)[1])  # a was let go again: its last release frees it
    assert not store.is_resident("a")


def test_acquire_many_returns_what_is_there_up_to_n_and_wakes_on_put() -> None:
    store, queue, _, recorder = make_queue()
    assert queue.acquire_many(3, timeout=0) == []
    queue.put_many([put_sample(store, f"s{i}") for i in range(3)])
    leases = queue.acquire_many(2)
    assert [lease.ref.sample_id for lease in leases] == ["s0", "s1"]
    assert [lease.ref.sample_id for lease in queue.acquire_many(5)] == ["s2"]
    got: list[list[object]] = []
    waiter = threading.Thread(target=lambda: got.append(queue.acquire_many(4, timeout=30)))  # type: ignore[arg-type]
    waiter.start()
    queue.put(put_sample(store, "late"))
    waiter.join(10)
    assert not waiter.is_alive() and [lease.ref.sample_id for lease in got[0]] == ["late"]  # type: ignore[attr-defined]
    assert actions(recorder).count("Acquire") == 4
    with pytest.raises(ValueError, match="n must be an int >= 1"):
        queue.acquire_many(0)


def test_ack_many_and_fail_many_reject_stale_leases_one_by_one() -> None:
    store, queue, clock, recorder = make_queue(max_deliveries=3)
    queue.put_many([put_sample(store, f"s{i}") for i in range(3)])
    first = queue.acquire_many(3)
    clock.advance(10.0)  # all three expire
    second = queue.acquire_many(3)  # reaps, then leases the redeliveries
    queue.ack_many([first[0], second[0], second[1]])  # the first is stale: rejected alone
    stats = queue.stats()
    assert (stats.acked, stats.stale_rejected, stats.outstanding) == (2, 1, 1)
    queue.fail_many([first[2], second[2]])
    stats = queue.stats()
    assert (stats.failed, stats.stale_rejected, stats.pending) == (1, 2, 1)
    assert actions(recorder)[-2:] == ["StaleRejected", "Fail"]


# -- dead-letter repair ---------------------------------------------------------------------


def dead_letter(queue: SampleRefQueue, store: LocalFeatureStore, sample_id: str) -> None:
    queue.put(put_sample(store, sample_id))
    for _ in range(queue.max_deliveries):
        lease = queue.acquire(poll_interval=0)
        assert lease is not None and lease.ref.sample_id == sample_id
        queue.fail(lease)


def test_without_kept_bytes_a_requeue_is_refused_naming_the_id() -> None:
    store, queue, _, _ = make_queue(max_deliveries=1)
    dead_letter(queue, store, "s0")
    assert not store.is_resident("s0")
    with pytest.raises(ValueError, match="'s0' cannot be requeued: its bytes were not kept"):
        queue.requeue_dead_letters(["s0"])
    with pytest.raises(LookupError, match="'nope' is not a dead letter"):
        queue.purge_dead_letters(["s0", "nope"])
    assert [d.ref.sample_id for d in queue.dead_letters()] == ["s0"]
    assert queue.purge_dead_letters() == ["s0"] and queue.dead_letters() == []
    assert queue.stats().purged == 1


def test_kept_dead_letters_count_in_residency_and_come_back_with_a_fresh_budget() -> None:
    size = put_sample(LocalFeatureStore(), "probe").estimated_bytes
    store, queue, _, recorder = make_queue(max_deliveries=2, keep_dead_letter_bytes=size)
    dead_letter(queue, store, "kept")
    dead_letter(queue, store, "over-cap")
    assert store.is_resident("kept") and not store.is_resident("over-cap")
    assert store.health().resident_bytes == size  # counted in residency, so in backpressure
    with pytest.raises(ValueError, match="'over-cap' cannot be requeued"):
        queue.requeue_dead_letters()  # all or nothing
    assert len(queue.dead_letters()) == 2
    assert queue.requeue_dead_letters(["kept"]) == ["kept"]
    lease = queue.acquire(poll_interval=0)
    assert lease is not None and lease.ref.sample_id == "kept" and lease.redelivery_count == 0
    queue.ack(lease)
    assert not store.is_resident("kept") and queue.stats().requeued == 1
    assert "RequeueDeadLetter" in actions(recorder)
    with pytest.raises(ValueError, match="already acked"):
        queue.put(lease.ref)  # acked after its requeue: settled for good


def test_purging_a_kept_dead_letter_frees_its_bytes() -> None:
    store, queue, _, _ = make_queue(max_deliveries=1, keep_dead_letter_bytes=1 << 20)
    dead_letter(queue, store, "s0")
    assert store.is_resident("s0")
    assert queue.purge_dead_letters(["s0"]) == ["s0"]
    assert not store.is_resident("s0") and store.health().resident_bytes == 0
    with pytest.raises(LookupError):
        queue.requeue_dead_letters(["s0"])


def test_no_requeue_into_a_drained_queue() -> None:
    store, queue, _, _ = make_queue(max_deliveries=1, keep_dead_letter_bytes=1 << 20)
    dead_letter(queue, store, "s0")
    queue.close()
    assert queue.lifecycle_state == "drained"
    with pytest.raises(ValueError, match="drained"):
        queue.requeue_dead_letters()
    assert store.is_resident("s0") and queue.purge_dead_letters() == ["s0"] and not store.is_resident("s0")


def test_oldest_lease_age_follows_the_queue_clock() -> None:
    store, queue, clock, _ = make_queue()
    assert queue.oldest_lease_age() is None
    queue.put_many([put_sample(store, "a"), put_sample(store, "b")])
    first = queue.acquire(poll_interval=0)
    clock.advance(3.0)
    second = queue.acquire(poll_interval=0)
    clock.advance(1.5)
    assert queue.oldest_lease_age() == 4.5
    queue.ack(first)  # type: ignore[arg-type]
    assert queue.oldest_lease_age() == 1.5
    queue.ack(second)  # type: ignore[arg-type]
    assert queue.oldest_lease_age() is None


def test_a_kept_dead_letter_the_dedup_window_forgot_is_not_re_put() -> None:
    # Found by the spec's keep model: a re-put accepted here let a later purge scrub a pending sample's bytes.
    store, queue, _, _ = make_queue(max_deliveries=1, dedup_window=1, keep_dead_letter_bytes=1 << 30)
    queue.put(put_sample(store, "a"))
    dead = queue.acquire(poll_interval=0)
    assert dead is not None
    queue.fail(dead)
    queue.put(put_sample(store, "b"))
    acked = queue.acquire(poll_interval=0)
    assert acked is not None
    queue.ack(acked)  # the window of one now remembers only b
    with pytest.raises(ValueError, match="'a' is a dead letter whose bytes are kept"):
        queue.put(dead.ref)
    assert store.is_resident("a") and queue.pending_count() == 0
    assert queue.purge_dead_letters(["a"]) == ["a"]
    assert not store.is_resident("a") and queue.acquire(poll_interval=0) is None

"""The world around the queue (issue 9): blocked producers never deadlock, store faults are survivable."""

from __future__ import annotations

import errno
import os
import threading
from typing import Any

import pytest

from featurestream import FeatureStore, Lease, LocalFeatureStore, SampleRef, SampleRefQueue, VisibilityTimeout
from featurestream.stores.shared_dir import SharedDirFeatureStore
from featurestream.testing import UNTIL_CLEARED, FakeClock, FaultyStore, InjectedFault
from support.samples import put_sample

BOUND = 10.0  # seconds a thread gets to finish once it can: a hang fails the test instead of the suite


def sample_size() -> int:
    return put_sample(LocalFeatureStore(), "probe").estimated_bytes


def leased(store: FeatureStore, queue: SampleRefQueue, sample_id: str = "s0") -> tuple[SampleRef, Lease]:
    """Store a sample, queue its ref and lease it: the starting point of a settle under a store fault."""
    ref = put_sample(store, sample_id)
    queue.put(ref)
    lease = queue.acquire(poll_interval=0)
    assert lease is not None and lease.ref == ref
    return ref, lease


def faulty_queue(**kwargs: object) -> tuple[FaultyStore, SampleRefQueue, FakeClock]:
    store = FaultyStore(LocalFeatureStore(max_samples=None, max_bytes=1 << 30))
    clock = FakeClock(1000.0)
    queue = SampleRefQueue(store, VisibilityTimeout(10.0), clock=clock, **kwargs)  # type: ignore[arg-type]
    return store, queue, clock


def run_threads(targets: list[threading.Thread]) -> None:
    for thread in targets:
        thread.start()
    for thread in targets:
        thread.join(BOUND)
    assert not [t.name for t in targets if t.is_alive()], "threads still blocked"


# -- producers ---------------------------------------------------------------------------


@pytest.mark.parametrize("producers", [2, 3, 5])
def test_producers_holding_their_own_samples_all_enqueue(producers: int) -> None:
    """Issue 9's scenario: each producer stores a sample, then blocks; high = 2 samples, low = 1, nothing queued."""
    size = sample_size()
    store = LocalFeatureStore(max_samples=None, max_bytes=1 << 30)
    pauses: list[int] = []
    queue = SampleRefQueue(
        store, high_watermark_bytes=2 * size, low_watermark_bytes=size, on_pause=lambda h: pauses.append(1)
    )
    refs = [put_sample(store, f"p{i}") for i in range(producers)]  # every producer's bytes land first
    errors: list[BaseException] = []
    acked: list[str] = []

    def produce(index: int) -> None:
        try:
            queue.put_blocks_until_below(refs[index], poll_interval=60)  # only a wake-up can move it on in time
        except BaseException as exc:
            errors.append(exc)

    def consume() -> None:
        while len(acked) < producers:
            lease = queue.acquire(timeout=BOUND)
            if lease is None:
                return
            acked.append(lease.ref.sample_id)
            queue.ack(lease)

    threads = [threading.Thread(target=produce, args=(i,), name=f"producer-{i}") for i in range(producers)]
    run_threads([*threads, threading.Thread(target=consume, name="consumer")])
    assert not errors, errors
    assert sorted(acked) == sorted(r.sample_id for r in refs)
    stats = queue.stats()
    assert stats.put == stats.acked == producers and pauses, stats
    assert store.health().resident_bytes == 0


def test_a_paused_producer_enqueues_into_an_empty_queue_without_resuming() -> None:
    size = sample_size()
    store = LocalFeatureStore(max_samples=None, max_bytes=1 << 30)
    queue = SampleRefQueue(store, high_watermark_bytes=2 * size, low_watermark_bytes=size)
    first, second = put_sample(store, "a"), put_sample(store, "b")
    queue.put_blocks_until_below(first, poll_interval=0)  # 2 samples resident: pauses, but the queue was empty
    assert queue.backpressure_state == "paused" and queue.pending_count() == 1
    with pytest.raises(RuntimeError, match="abort_when"):  # now the queue holds a: b waits for it
        queue.put_blocks_until_below(second, poll_interval=0, abort_when=iter((False, True)).__next__)
    assert queue.pending_count() == 1 and queue.stats().put == 1


def test_close_wakes_every_blocked_producer() -> None:
    size = sample_size()
    store = LocalFeatureStore(max_samples=None, max_bytes=1 << 30)
    queue = SampleRefQueue(store, high_watermark_bytes=size, low_watermark_bytes=0)
    queue.put(put_sample(store, "held"))
    waiting = threading.Barrier(4)
    outcomes: list[str] = []

    def produce(index: int) -> None:
        ref = put_sample(store, f"p{index}")
        arrived = []

        def ready() -> bool:
            if queue.backpressure_state == "paused" and not arrived:
                arrived.append(waiting.wait(BOUND))
            return False

        try:
            queue.put_blocks_until_below(ref, poll_interval=60, abort_when=ready)
        except RuntimeError as exc:
            outcomes.append(str(exc))

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    waiting.wait(BOUND)  # every producer is past its first check and about to block for a minute
    queue.close()
    for thread in threads:
        thread.join(BOUND)
    assert not any(t.is_alive() for t in threads)
    assert len(outcomes) == 3 and all("closed" in o for o in outcomes), outcomes
    assert queue.stats().put == 1


def test_callbacks_may_call_the_queue() -> None:
    """Callbacks run outside the queue's lock: one that calls the queue back does not deadlock."""
    size = sample_size()
    store = LocalFeatureStore(max_samples=None, max_bytes=1 << 30)
    seen: list[object] = []
    queue: SampleRefQueue

    def reenter(argument: object) -> None:
        seen.append((argument, queue.stats().pending, queue.pending_count(), queue.reclaim_expired()))

    clock = FakeClock()
    queue = SampleRefQueue(
        store,
        VisibilityTimeout(1.0),
        high_watermark_bytes=size,
        low_watermark_bytes=0,
        on_pause=reenter,
        on_dead_letter=reenter,
        max_deliveries=1,
        clock=clock,
    )
    done = threading.Event()

    def scenario() -> None:
        queue.put_blocks_until_below(put_sample(store, "s0"), poll_interval=0)
        lease = queue.acquire(poll_interval=0)
        assert lease is not None
        queue.fail(lease)
        done.set()

    thread = threading.Thread(target=scenario, daemon=True)
    thread.start()
    assert done.wait(BOUND), "a callback that calls the queue deadlocked it"
    assert len(seen) == 2 and queue.dead_letters()[0].ref.sample_id == "s0"


# -- store faults -----------------------------------------------------------------------


def test_a_failing_retain_refuses_the_put_and_changes_nothing() -> None:
    store, queue, _ = faulty_queue()
    ref = put_sample(store, "s0")
    store.arm("retain")
    with pytest.raises(OSError, match="s0") as caught:
        queue.put(ref)
    assert caught.value.errno == errno.EIO and isinstance(caught.value.__cause__, InjectedFault)
    stats = queue.stats()
    assert (stats.put, stats.pending, stats.store_errors, stats.scrub_backlog) == (0, 0, 1, 0)
    store.release(store.get(ref)[1])  # not retained: the last release frees it, as before the put
    assert not store.is_resident("s0")


def test_a_put_refused_after_retain_retries_its_unretain() -> None:
    store, queue, _ = faulty_queue()
    ref = put_sample(store, "s0")
    store.arm("retain")
    store.arm("unretain", times=UNTIL_CLEARED)
    with pytest.raises(OSError):
        queue.put(ref)
    assert queue.stats().scrub_backlog == 1 and queue.stats().store_errors >= 2
    store.clear()
    queue.put(ref)  # the retry after the fault is accepted, and keeps its retain
    assert queue.stats().scrub_backlog == 0
    store.release(store.get(ref)[1])
    assert store.is_resident("s0")


def test_an_ack_whose_scrub_fails_stands_and_the_scrub_is_retried() -> None:
    store, queue, _ = faulty_queue()
    ref, lease = leased(store, queue)
    store.arm("scrub", times=UNTIL_CLEARED)
    queue.ack(lease)  # returns normally
    stats = queue.stats()
    assert (stats.acked, stats.scrub_backlog, stats.pending, stats.outstanding) == (1, 1, 0, 0)
    assert stats.store_errors >= 1 and store.is_resident("s0")
    with pytest.raises(ValueError, match="already acked"):
        queue.put(ref)  # settled for good: the id is in the dedup window
    queue.ack(lease)  # and the lease stays settled
    assert queue.stats().stale_rejected == 1 and queue.acquire(poll_interval=0) is None
    queue.close()
    assert queue.lifecycle_state == "drained"  # drain does not wait for the scrub backlog
    store.clear()
    assert queue.stats().scrub_backlog == 0  # any call pays the backlog
    assert not store.is_resident("s0") and store.health().resident_bytes == 0


def test_a_refused_reput_while_the_scrub_is_owed_even_without_dedup() -> None:
    store, queue, _ = faulty_queue(dedup_window=0)
    ref, lease = leased(store, queue)
    store.arm("scrub", times=UNTIL_CLEARED)
    queue.ack(lease)
    with pytest.raises(ValueError, match="scrub"):
        queue.put(ref)
    assert queue.stats().put == 1


def test_a_dead_letter_whose_scrub_fails_is_reported_once() -> None:
    dead: list[str] = []
    store, queue, _ = faulty_queue(max_deliveries=1, on_dead_letter=lambda d: dead.append(d.ref.sample_id))
    _, lease = leased(store, queue)
    store.arm("scrub")
    queue.fail(lease)
    assert dead == ["s0"] and [d.ref.sample_id for d in queue.dead_letters()] == ["s0"]
    assert queue.stats().scrub_backlog == 0 and not store.is_resident("s0")  # the one-shot fault was retried


def test_a_reap_fault_never_surfaces_from_an_unrelated_consumer() -> None:
    store, queue, clock = faulty_queue(max_deliveries=1)
    queue.put(put_sample(store, "expiring"))
    assert queue.acquire(poll_interval=0) is not None
    queue.put(put_sample(store, "mine"))
    clock.advance(10.0)
    store.arm("scrub", times=UNTIL_CLEARED)
    lease = queue.acquire(poll_interval=0)  # reaps "expiring" into the dead letters; its scrub fails
    assert lease is not None and lease.ref.sample_id == "mine"
    queue.ack(lease)
    assert queue.stats().acked == 1 and queue.stats().scrub_backlog == 2
    queue.put(put_sample(store, "later"))  # a producer's put is not refused for someone else's owed scrub
    assert queue.pending_count() == 1


def test_the_reaper_thread_survives_store_faults_and_pays_the_backlog() -> None:
    inner = LocalFeatureStore(max_samples=None, max_bytes=1 << 30)
    store = FaultyStore(inner)
    queue = SampleRefQueue(store, VisibilityTimeout(0.01), max_deliveries=1, reaper_interval=0.005)
    queue.put(put_sample(store, "s0"))
    store.arm("scrub", times=UNTIL_CLEARED)
    store.arm("gc", times=UNTIL_CLEARED)
    assert queue.acquire(poll_interval=0) is not None
    queue.close()
    gone = threading.Event()

    def watch() -> None:
        while not gone.is_set():
            if store.raised["scrub"] >= 3:  # the reaper reaped the lease and kept retrying the scrub
                store.clear()
            if not inner.is_resident("s0"):
                gone.set()
            threading.Event().wait(0.005)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    assert gone.wait(BOUND), "the reaper stopped before the bytes left the store"
    assert [d.ref.sample_id for d in queue.dead_letters()] == ["s0"] and queue.lifecycle_state == "drained"


def test_a_failing_health_raises_from_the_blocked_put_naming_the_sample() -> None:
    store, queue, _ = faulty_queue(high_watermark_bytes=10, low_watermark_bytes=1)
    ref = put_sample(store, "s0")
    store.arm("health")
    with pytest.raises(OSError, match="'s0'"):
        queue.put_blocks_until_below(ref, poll_interval=0)
    stats = queue.stats()
    assert (stats.put, stats.producer_pauses, stats.store_errors) == (0, 0, 1)
    assert queue.backpressure_state == "flowing"
    queue.put_blocks_until_below(ref, poll_interval=0)  # once the fault is gone, the same put goes through
    assert queue.pending_count() == 1


def fail_removal(monkeypatch: pytest.MonkeyPatch, path: str, error: OSError) -> dict[str, bool]:
    """Make taking the data file ``path`` out of its directory raise ``error`` while the returned flag is on.

    The store removes a data name by renaming it aside (the unlink follows in the background) or, for a name
    linked to a reusable slot, by unlinking it at once: both calls fail.
    """
    failing = {"on": True}
    for name in ("rename", "unlink"):
        real = getattr(os, name)

        def remove(source: str, *args: object, _real: Any = real, **kwargs: object) -> None:
            if failing["on"] and os.fspath(source) == path:
                raise error
            _real(source, *args, **kwargs)

        monkeypatch.setattr(os, name, remove)
    return failing


def test_the_shared_dir_store_retries_an_unlink_that_failed(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SharedDirFeatureStore(tmp_path, max_samples=None)
    queue = SampleRefQueue(store)
    ref, lease = leased(store, queue)
    path = store.data_path(ref)
    failing = fail_removal(monkeypatch, path, PermissionError(errno.EPERM, "LockedCall not permitted", path))
    queue.ack(lease)
    assert os.path.exists(path) and store.is_resident("s0")
    assert store.health().resident_bytes == ref.estimated_bytes  # still counted until it is really gone
    assert queue.stats().scrub_backlog == 1
    failing["on"] = False
    assert queue.stats().scrub_backlog == 0
    assert not os.path.exists(path) and store.health().resident_bytes == 0


def test_the_shared_dir_store_retries_a_failed_release_unlink_on_gc(
    tmp_path: os.PathLike[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SharedDirFeatureStore(tmp_path, max_samples=None)
    path = store.data_path(put_sample(store, "s0"))
    ref = put_sample(store, "s1")
    _, handle = store.get(ref)
    failing = fail_removal(monkeypatch, store.data_path(ref), OSError(errno.EIO, "Input/output error"))
    store.release(handle)  # the last handle: the file should go, but taking it out of the directory fails
    assert os.path.exists(store.data_path(ref))
    failing["on"] = False
    assert store.gc() >= 1
    assert not os.path.exists(store.data_path(ref)) and os.path.exists(path)


def test_every_traced_event_carries_the_state_it_left() -> None:
    """Trace fields for TLC's value checks: n, pending/outstanding after the step, the clock, lease deadlines."""
    from featurestream.spec.recording import TraceRecorder

    recorder = TraceRecorder()
    store = FaultyStore(LocalFeatureStore(max_samples=None, max_bytes=1 << 30))
    clock = FakeClock(100.0)
    queue = SampleRefQueue(store, VisibilityTimeout(10.0), clock=clock, tracer=recorder, max_deliveries=2)
    queue.put_many([put_sample(store, "a"), put_sample(store, "b")])
    first = queue.acquire(poll_interval=0)
    assert first is not None
    clock.advance(4.0)
    queue.extend(first, 20.0)
    queue.fail(first)
    clock.advance(1.0)
    second = queue.acquire(poll_interval=0)
    store.arm("scrub")
    queue.ack(second)  # type: ignore[arg-type]
    queue.ack(first)  # stale; the call first pays the owed scrub
    got = [
        (action, {k: v for k, v in fields.items() if k not in ("error", "lease_id")})
        for action, fields in recorder.events
    ]
    assert got == [
        ("Put", {"sample_id": "a", "n": 0, "pending": 1, "outstanding": 0, "now": 100.0}),
        ("Put", {"sample_id": "b", "n": 0, "pending": 2, "outstanding": 0, "now": 100.0}),
        ("Acquire", {"sample_id": "a", "n": 0, "deadline": 110.0, "pending": 1, "outstanding": 1, "now": 100.0}),
        ("Extend", {"sample_id": "a", "n": 0, "deadline": 124.0, "pending": 1, "outstanding": 1, "now": 104.0}),
        ("Fail", {"sample_id": "a", "n": 0, "pending": 2, "outstanding": 0, "now": 104.0}),
        ("Acquire", {"sample_id": "b", "n": 0, "deadline": 115.0, "pending": 1, "outstanding": 1, "now": 105.0}),
        ("Ack", {"sample_id": "b", "n": 0, "pending": 1, "outstanding": 0, "now": 105.0}),
        ("StoreFault", {"call": "scrub", "sample_id": "b", "pending": 1, "outstanding": 0, "now": 105.0}),
        ("ScrubRetried", {"sample_id": "b", "call": "scrub", "pending": 1, "outstanding": 0, "now": 105.0}),
        (
            "StaleRejected",
            {"op": "ack", "sample_id": "a", "n": 0, "forged": False, "pending": 1, "outstanding": 0, "now": 105.0},
        ),
    ]

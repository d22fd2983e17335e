from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time

import pytest
import torch

from featurestream import (
    Lease,
    LeaseLost,
    LocalFeatureStore,
    SampleRef,
    SampleRefQueue,
    StoreHealth,
    VisibilityTimeout,
)
from featurestream.backends.memory.queue import DEFAULT_MAX_DELIVERIES
from featurestream.core.lease import _next_lease_id
from featurestream.testing import FakeClock
from support.samples import eagle3_tensors, put_sample


def make_queue(**kwargs: object) -> tuple[LocalFeatureStore, SampleRefQueue, FakeClock]:
    store = LocalFeatureStore(max_samples=None, max_bytes=1 << 30)
    clock = FakeClock(1000.0)
    queue = SampleRefQueue(store, VisibilityTimeout(10.0), clock=clock, **kwargs)  # type: ignore[arg-type]
    return store, queue, clock


@pytest.mark.parametrize("seconds", [0, -1.0, math.nan, math.inf, "3"])
def test_visibility_timeout_rejects_bad_values(seconds: object) -> None:
    with pytest.raises(ValueError, match="VisibilityTimeout"):
        VisibilityTimeout(seconds)  # type: ignore[arg-type]


def test_visibility_timeout_default() -> None:
    assert VisibilityTimeout().seconds == 30.0
    assert SampleRefQueue(LocalFeatureStore())._vt == VisibilityTimeout(30.0)


def test_lease_ids_are_unique_and_lease_is_a_copyable_dataclass() -> None:
    assert _next_lease_id() != _next_lease_id()
    store, queue, clock = make_queue()
    queue.put(put_sample(store, "s0"))
    lease = queue.acquire(poll_interval=0)
    assert lease is not None
    assert lease.deadline == clock.now + 10.0 and lease.redelivery_count == 0
    assert lease.visibility_timeout == VisibilityTimeout(10.0)
    copy = dataclasses.replace(lease)
    assert copy == lease and copy is not lease


def test_fifo_order_and_counts() -> None:
    store, queue, _ = make_queue()
    for i in range(3):
        queue.put(put_sample(store, f"s{i}"))
    assert (queue.pending_count(), queue.outstanding_count()) == (3, 0)
    leases = [queue.acquire(poll_interval=0) for _ in range(3)]
    assert [lease.ref.sample_id for lease in leases if lease] == ["s0", "s1", "s2"]
    assert (queue.pending_count(), queue.outstanding_count()) == (0, 3)
    assert queue.acquire(poll_interval=0) is None and not queue.is_closed


def test_fail_redelivers_from_the_tail_with_a_new_lease() -> None:
    store, queue, _ = make_queue()
    queue.put(put_sample(store, "a"))
    queue.put(put_sample(store, "b"))
    first = queue.acquire(poll_interval=0)
    assert first is not None
    queue.fail(first)
    nxt = queue.acquire(poll_interval=0)
    again = queue.acquire(poll_interval=0)
    assert nxt is not None and again is not None
    assert (nxt.ref.sample_id, again.ref.sample_id) == ("b", "a")
    assert again.redelivery_count == 1 and again.lease_id != first.lease_id
    assert store.is_resident("a"), "fail must not drop the tensors"


@pytest.mark.parametrize("make_stale", ["settled", "copy", "forged", "other_queue"])
def test_stale_leases_are_rejected_without_changes(make_stale: str) -> None:
    store, queue, _ = make_queue()
    queue.put(put_sample(store, "s0"))
    lease = queue.acquire(poll_interval=0)
    assert lease is not None
    if make_stale == "settled":
        queue.fail(lease)
        live = queue.acquire(poll_interval=0)
        stale: Lease = lease
    else:
        live = lease
        if make_stale == "copy":
            stale = dataclasses.replace(lease)
        elif make_stale == "forged":
            stale = dataclasses.replace(lease, lease_id=_next_lease_id())
        else:
            other = SampleRefQueue(store)
            stale = lease
            before_other = other.stats()
            other.ack(stale)
            assert other.stats().stale_rejected == before_other.stale_rejected + 1
            assert queue.outstanding_count() == 1
            return
    assert live is not None
    before = queue.stats()
    assert queue.ack(stale) is False and queue.fail(stale) is False
    with pytest.raises(LeaseLost, match="not live"):
        queue.extend(stale)
    after = queue.stats()
    assert after.stale_rejected == before.stale_rejected + 3
    assert dataclasses.replace(after, stale_rejected=0) == dataclasses.replace(before, stale_rejected=0)
    assert queue.outstanding_count() == 1 and store.is_resident("s0")
    queue.ack(live)
    assert queue.stats().acked == 1


def test_put_rejects_bad_input_and_changes_nothing() -> None:
    store, queue, _ = make_queue()
    with pytest.raises(TypeError, match="SampleRef"):
        queue.put("s0")  # type: ignore[arg-type]
    foreign = put_sample(LocalFeatureStore(), "f")
    with pytest.raises(ValueError, match="lives in"):
        queue.put(foreign)
    ref = put_sample(store, "s0")
    queue.put(ref)
    with pytest.raises(ValueError, match="already queued"):
        queue.put(ref)
    assert queue.stats().put == 1 and queue.pending_count() == 1


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"high_watermark_bytes": 10, "low_watermark_bytes": 10}, ValueError, "strictly less than"),
        ({"high_watermark_bytes": -1}, ValueError, "high_watermark_bytes"),
        ({"low_watermark_bytes": 1.5}, ValueError, "low_watermark_bytes"),
        ({"max_deliveries": 0}, ValueError, "max_deliveries"),
        ({"dedup_window": -1}, ValueError, "dedup_window"),
        ({"reaper_interval": 0}, ValueError, "reaper_interval"),
        ({"visibility_timeout": 5}, TypeError, "VisibilityTimeout"),
    ],
)
def test_misconfiguration(kwargs: dict[str, object], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        SampleRefQueue(LocalFeatureStore(), **kwargs)  # type: ignore[arg-type]


def test_store_must_be_a_feature_store() -> None:
    with pytest.raises(TypeError, match="FeatureStore"):
        SampleRefQueue(object())  # type: ignore[arg-type]


def test_acquire_rejects_negative_waits() -> None:
    _, queue, _ = make_queue()
    with pytest.raises(ValueError, match="timeout"):
        queue.acquire(timeout=-1)
    with pytest.raises(ValueError, match="poll_interval"):
        queue.acquire(poll_interval=math.nan)


def test_expired_leases_are_reclaimed_by_ordinary_calls() -> None:
    store, queue, clock = make_queue()
    queue.put(put_sample(store, "s0"))
    lease = queue.acquire(poll_interval=0)
    assert lease is not None
    clock.advance(10.0)
    assert queue.pending_count() == 0, "counting does not mutate"
    again = queue.acquire(poll_interval=0)
    assert again is not None and again.redelivery_count == 1
    stats = queue.stats()
    assert (stats.reclaimed, stats.leased) == (1, 2)
    queue.ack(lease)
    assert queue.stats().stale_rejected == 1 and queue.outstanding_count() == 1


def test_reclaim_expired_returns_the_count() -> None:
    store, queue, clock = make_queue()
    for i in range(3):
        queue.put(put_sample(store, f"s{i}"))
    leases = [queue.acquire(poll_interval=0) for _ in range(3)]
    assert queue.reclaim_expired() == 0
    clock.advance(5)
    assert leases[0] is not None
    queue.extend(leases[0], 20)
    clock.advance(5)
    assert queue.reclaim_expired() == 2
    assert queue.outstanding_count() == 1 and queue.pending_count() == 2


def test_extend_pushes_the_deadline() -> None:
    store, queue, clock = make_queue()
    queue.put(put_sample(store, "s0"))
    lease = queue.acquire(poll_interval=0)
    assert lease is not None
    clock.advance(9)
    queue.extend(lease)
    assert lease.deadline == clock.now + 10
    clock.advance(9)
    assert queue.reclaim_expired() == 0
    with pytest.raises(ValueError, match="seconds"):
        queue.extend(lease, -1)
    with pytest.raises(ValueError, match="seconds"):
        queue.extend(lease, 0)
    assert queue.stats().extended == 1


def test_max_deliveries_dead_letters_and_scrubs() -> None:
    dead = []
    store, queue, clock = make_queue(max_deliveries=2, on_dead_letter=dead.append)
    ref = put_sample(store, "poison")
    queue.put(ref)
    first = queue.acquire(poll_interval=0)
    assert first is not None
    queue.fail(first)
    second = queue.acquire(poll_interval=0)
    assert second is not None and second.redelivery_count == 1
    clock.advance(11)
    assert queue.reclaim_expired() == 1
    assert queue.pending_count() == 0 and queue.outstanding_count() == 0
    letters = queue.dead_letters()
    assert [(d.ref.sample_id, d.deliveries) for d in letters] == [("poison", 2)]
    assert "expired" in letters[0].reason
    assert dead == letters
    assert not store.is_resident("poison") and store.health().resident_bytes == 0
    assert queue.stats().dead_lettered == 1
    with pytest.raises(ValueError, match="dead-lettered"):
        queue.put(ref)


def test_default_max_deliveries_is_finite() -> None:
    assert 1 < DEFAULT_MAX_DELIVERIES < 100
    assert SampleRefQueue(LocalFeatureStore()).max_deliveries == DEFAULT_MAX_DELIVERIES


def test_dead_letter_callback_errors_are_logged_and_the_dead_letter_still_stands(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def explode(_: object) -> None:
        raise RuntimeError("callback boom")

    store, queue, _ = make_queue(max_deliveries=1, on_dead_letter=explode)
    queue.put(put_sample(store, "s0"))
    lease = queue.acquire(poll_interval=0)
    assert lease is not None
    with caplog.at_level(logging.ERROR):
        queue.fail(lease)
    assert "callback boom" in caplog.text
    assert queue.stats().dead_lettered == 1 and len(queue.dead_letters()) == 1


def test_dedup_window_is_bounded() -> None:
    store, queue, _ = make_queue(dedup_window=2)
    refs = []
    for i in range(3):
        ref = put_sample(store, f"s{i}")
        refs.append(ref)
        queue.put(ref)
        lease = queue.acquire(poll_interval=0)
        assert lease is not None
        queue.ack(lease)
    assert len(queue._engine._recent_terminal) == 2
    for ref in refs[1:]:
        with pytest.raises(ValueError, match="already acked"):
            queue.put(ref)
    assert queue.stats().dedup_refused == 2
    fresh = put_sample(store, "s0")
    queue.put(fresh)
    assert queue.pending_count() == 1, "ids older than the window are accepted again"


def test_close_drains_then_returns_none_for_good() -> None:
    store, queue, _ = make_queue()
    queue.put(put_sample(store, "a"))
    queue.put(put_sample(store, "b"))
    held = queue.acquire(poll_interval=0)
    queue.close()
    queue.close()
    assert queue.is_closed and queue.lifecycle_state == "draining"
    with pytest.raises(RuntimeError, match="closed"):
        queue.put(put_sample(store, "c"))
    assert store.is_resident("c"), "a refused put leaves the store alone"
    nxt = queue.acquire(poll_interval=0)
    assert nxt is not None and nxt.ref.sample_id == "b"
    assert held is not None
    queue.fail(held)
    last = queue.acquire(poll_interval=0)
    assert last is not None and last.ref.sample_id == "a"
    queue.ack(nxt)
    assert queue.lifecycle_state == "draining"
    queue.ack(last)
    assert queue.lifecycle_state == "drained"
    assert queue.acquire(poll_interval=10) is None


def test_explicit_watermarks_override_store_flags_with_hysteresis() -> None:
    events: list[tuple[str, int]] = []
    paused, resumed = threading.Event(), threading.Event()

    def on_pause(health: StoreHealth) -> None:
        events.append(("pause", health.resident_bytes))
        paused.set()

    def on_resume(health: StoreHealth) -> None:
        events.append(("resume", health.resident_bytes))
        resumed.set()

    # The store's own watermarks would never trigger: the queue's explicit ones must win.
    store = LocalFeatureStore(max_samples=None, max_bytes=1 << 30)
    size = put_sample(LocalFeatureStore(), "probe").estimated_bytes
    queue = SampleRefQueue(
        store, high_watermark_bytes=4 * size, low_watermark_bytes=size, on_pause=on_pause, on_resume=on_resume
    )
    for i in range(3):
        queue.put_blocks_until_below(put_sample(store, f"s{i}"))
    blocked = put_sample(store, "s3")
    producer = threading.Thread(target=queue.put_blocks_until_below, args=(blocked,), kwargs={"poll_interval": 5})
    producer.start()
    assert paused.wait(5)
    assert queue.backpressure_state == "paused"
    leases = [queue.acquire(poll_interval=0) for _ in range(3)]
    assert all(leases)
    queue.ack(leases[0])  # resident 3*size: inside the band, so it stays paused
    assert not resumed.wait(0.05) and queue.pending_count() == 0
    queue.ack(leases[1])  # resident 2*size: still inside the band
    assert not resumed.wait(0.05)
    queue.ack(leases[2])  # only s3 remains resident: at the low watermark, resume
    producer.join(5)
    assert not producer.is_alive()
    assert events == [("pause", 4 * size), ("resume", size)]
    assert queue.pending_count() == 1 and queue.stats().producer_pauses == 1


def test_blocked_put_aborts_and_closes_cleanly() -> None:
    store = LocalFeatureStore(max_samples=None, max_bytes=1 << 30, high_watermark_bytes=1, low_watermark_bytes=0)
    queue = SampleRefQueue(store)
    queue.put(put_sample(store, "queued"))  # the queue holds a sample: a paused producer waits for it to settle
    ref = put_sample(store, "s0")
    with pytest.raises(RuntimeError, match="abort_when"):
        queue.put_blocks_until_below(ref, poll_interval=0.01, abort_when=lambda: queue.backpressure_state == "paused")
    assert queue.pending_count() == 1 and queue.stats().put == 1
    errors: list[BaseException] = []

    def produce() -> None:
        try:
            queue.put_blocks_until_below(ref, poll_interval=5)
        except RuntimeError as exc:
            errors.append(exc)

    producer = threading.Thread(target=produce)
    producer.start()
    queue.close()
    producer.join(5)
    assert not producer.is_alive() and "closed" in str(errors[0])


def test_callback_errors_never_break_the_queue(caplog: pytest.LogCaptureFixture) -> None:
    def explode(_: StoreHealth) -> None:
        raise RuntimeError("callback boom")

    store = LocalFeatureStore(max_samples=None, max_bytes=1 << 30, high_watermark_bytes=400, low_watermark_bytes=300)
    queue = SampleRefQueue(store, on_pause=explode, on_resume=explode)
    queue.put(put_sample(store, "queued"))
    first = put_sample(store, "s0")
    with caplog.at_level(logging.ERROR):
        with pytest.raises(RuntimeError, match="abort_when"):
            queue.put_blocks_until_below(
                first, poll_interval=0.01, abort_when=lambda: queue.backpressure_state == "paused"
            )
    assert "callback boom" in caplog.text
    lease = queue.acquire(poll_interval=0)
    assert lease is not None
    queue.ack(lease)
    store.release(store.get(first)[1])
    small = store.put("s1", eagle3_tensors(tokens=1, hidden=1), run_id="run")
    assert small.estimated_bytes <= 300
    queue.put_blocks_until_below(small, poll_interval=0.01)
    assert queue.pending_count() == 1 and queue.backpressure_state == "flowing"


def test_store_gc_runs_on_operations_and_its_errors_are_logged(caplog: pytest.LogCaptureFixture) -> None:
    class FlakyGcStore(LocalFeatureStore):
        calls = 0

        def gc(self) -> int:
            FlakyGcStore.calls += 1
            raise OSError("gc boom")

    store = FlakyGcStore()
    queue = SampleRefQueue(store)
    with caplog.at_level(logging.WARNING):
        queue.put(put_sample(store, "s0"))
        lease = queue.acquire(poll_interval=0)
        assert lease is not None
        queue.ack(lease)
        queue.reclaim_expired()
    assert FlakyGcStore.calls == 4 and "gc boom" in caplog.text
    assert queue.stats().acked == 1 and queue.stats().store_errors == 4


def test_reaper_thread_reclaims_for_a_queue_nobody_polls() -> None:
    store = LocalFeatureStore()
    queue = SampleRefQueue(store, VisibilityTimeout(0.02), reaper_interval=0.01)
    queue.put(put_sample(store, "s0"))
    assert queue.acquire(poll_interval=0) is not None
    deadline = time.monotonic() + 5
    while queue.stats().reclaimed == 0 and time.monotonic() < deadline:
        time.sleep(0.01)
    stats = queue.stats()
    assert (stats.reclaimed, stats.pending, stats.outstanding) == (1, 1, 0)


def test_a_consumer_cannot_make_its_lease_immortal() -> None:
    store, queue, clock = make_queue()
    queue.put(put_sample(store, "s0"))
    lease = queue.acquire(poll_interval=0)
    assert lease is not None
    lease.deadline = math.inf
    clock.advance(10.0)
    assert queue.reclaim_expired() == 1


def test_a_forged_lease_with_an_unhashable_id_is_stale() -> None:
    store, queue, _ = make_queue()
    queue.put(put_sample(store, "s0"))
    lease = queue.acquire(poll_interval=0)
    assert lease is not None
    queue.ack(dataclasses.replace(lease, lease_id=[lease.lease_id]))  # type: ignore[arg-type]
    assert queue.stats().stale_rejected == 1 and queue.outstanding_count() == 1


def test_callbacks_run_even_when_the_call_that_reaped_raises() -> None:
    dead: list[object] = []
    store, queue, clock = make_queue(max_deliveries=1, on_dead_letter=dead.append)
    queue.put(put_sample(store, "s0"))
    assert queue.acquire(poll_interval=0) is not None
    queue.close()
    clock.advance(10.0)
    with pytest.raises(RuntimeError, match="closed"):
        queue.put(put_sample(store, "s1"))  # reaps s0 into the dead letters, then refuses
    assert [letter.ref.sample_id for letter in dead] == ["s0"]  # type: ignore[attr-defined]


def test_put_blocks_at_the_stores_sample_count_cap() -> None:
    """Bytes far below every watermark, but the store at ``max_samples``: the producer waits instead of its next
    ``store.put`` raising ``MemoryError``, resumes once a sample left, and the store never refuses a put."""
    store = LocalFeatureStore(max_samples=2)
    seen: list[tuple[str, int]] = []
    paused = threading.Event()

    def on_pause(health: StoreHealth) -> None:
        seen.append(("pause", health.sample_count))
        paused.set()

    queue = SampleRefQueue(store, on_pause=on_pause, on_resume=lambda h: seen.append(("resume", h.sample_count)))
    queue.put_blocks_until_below(put_sample(store, "s0"))
    second = put_sample(store, "s1")  # the store is now at its cap
    assert store.health().sample_capacity == 2 and store.health().sample_count == 2
    thread = threading.Thread(target=queue.put_blocks_until_below, args=(second, 0.01), daemon=True)
    thread.start()
    assert paused.wait(30) and queue.backpressure_state == "paused" and queue.pending_count() == 1
    queue.ack(queue.acquire(timeout=0))  # type: ignore[arg-type]
    thread.join(timeout=30)
    assert not thread.is_alive() and queue.pending_count() == 1
    put_sample(store, "s2")  # room again
    assert seen == [("pause", 2), ("resume", 1)]


@pytest.mark.parametrize("bogus", [None, "not a lease", 3.5, ("s0", 0)])
def test_ack_fail_extend_of_a_non_lease_raise_type_error_and_change_nothing(bogus: object) -> None:
    store, queue, _ = make_queue()
    queue.put(put_sample(store, "s0"))
    live = queue.acquire(poll_interval=0)
    assert live is not None
    before = queue.stats()
    calls = [queue.ack, queue.fail, queue.extend, lambda x: queue.ack_many([live, x]), lambda x: queue.fail_many([x])]
    for call in calls:
        with pytest.raises(TypeError, match=f"expects a Lease returned by acquire, got {type(bogus).__name__}"):
            call(bogus)
    assert queue.stats() == before and queue.outstanding_count() == 1
    with pytest.raises(TypeError, match="single Lease"):
        queue.ack_many(live)  # type: ignore[arg-type]
    assert queue.ack(live) is True and queue.ack(live) is False


def test_stale_rejections_are_logged_once_per_lease(caplog: pytest.LogCaptureFixture) -> None:
    store, queue, _ = make_queue()
    queue.put(put_sample(store, "s0"))
    queue.put(put_sample(store, "s1"))
    first, second = queue.acquire(poll_interval=0), queue.acquire(poll_interval=0)
    assert first is not None and second is not None
    queue.ack(first)
    with caplog.at_level(logging.WARNING, logger="featurestream.backends.memory.queue"):
        for _ in range(3):
            queue.ack(first)
        queue.ack(dataclasses.replace(second))  # a copy of a live lease: stale, logged on its own
    lines = [record.getMessage() for record in caplog.records]
    assert len(lines) == 2, lines
    assert f"stale ack of lease {first.lease_id} (sample 's0')" in lines[0] and "settled or reclaimed" in lines[0]
    assert f"lease {second.lease_id} (sample 's1')" in lines[1] and "copy of the live lease" in lines[1]


def test_put_refuses_a_ref_whose_bytes_are_gone_and_changes_nothing() -> None:
    store, queue, _ = make_queue()
    released = put_sample(store, "gone")
    _, handle = store.get(released)
    store.release(handle)  # no queue held it: its last handle freed it
    assert not store.is_resident("gone")
    before = queue.stats()
    with pytest.raises(ValueError, match=r"sample 'gone' is not resident in mem://local-.*nothing enqueued"):
        queue.put(released)
    fine = put_sample(store, "fine")
    with pytest.raises(ValueError, match="sample 'gone' is not resident"):
        queue.put_many([fine, released])
    with pytest.raises(ValueError, match="sample 'gone' is not resident"):
        queue.put_blocks_until_below(released)
    assert queue.stats() == before and queue.pending_count() == 0
    queue.put(fine)  # the batch retained nothing that stays pinned: the good ref still goes in
    assert queue.pending_count() == 1


def test_put_refuses_a_ref_subclass_carrying_a_tensor() -> None:
    store, queue, _ = make_queue()
    ref = put_sample(store, "s0")

    @dataclasses.dataclass(frozen=True, eq=False)
    class Carrying(SampleRef):
        payload: object = None

    carrying = Carrying(**{f.name: getattr(ref, f.name) for f in dataclasses.fields(SampleRef)}, payload=torch.ones(2))
    for call in (queue.put, lambda r: queue.put_many([r]), queue.put_blocks_until_below):
        with pytest.raises(TypeError, match=r"sample 's0' cannot travel as a ref: ref.payload holds a Tensor"):
            call(carrying)
    assert queue.stats().put == 0 and queue.pending_count() == 0

"""What the in-process hot path's shortcuts must keep: the events each call reports, a bounded deadline heap that
still reaps, and the same refusals of bad arguments."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from featurestream import Lease, LocalFeatureStore, SampleRefQueue, VisibilityTimeout
from featurestream.backends.memory.engine import MemoryEngine
from featurestream.core.engine import EngineContext, Event
from featurestream.testing import FakeClock, sample_tensors


class _RecordingEngine(MemoryEngine):
    """Records the type of every event the engine reports, then applies it as usual."""

    def __init__(self, context: EngineContext, **options: Any) -> None:
        self.reported: list[str] = []

        def recording(event: Event) -> None:
            self.reported.append(type(event).__name__)
            context.report(event)

        super().__init__(dataclasses.replace(context, report=recording), **options)


class _Queue(SampleRefQueue):
    _engine_class = _RecordingEngine
    _engine: _RecordingEngine


def _queue(clock: FakeClock, **options: Any) -> tuple[LocalFeatureStore, _Queue]:
    store = LocalFeatureStore(max_samples=None)
    return store, _Queue(store, VisibilityTimeout(10.0), clock=clock, **options)


def test_an_untraced_lifecycle_reports_the_lease_and_the_settle_and_a_traced_one_its_put_too() -> None:
    store, queue = _queue(FakeClock(100.0))
    queue.put(store.put("s0", sample_tensors(0)))
    lease = queue.acquire(timeout=0)
    assert lease is not None and queue.ack(lease)
    assert queue._engine.reported == ["Leased", "Settled"]  # an untraced Admitted would carry nothing to apply

    traced: list[str] = []
    store, queue = _queue(FakeClock(100.0), tracer=lambda action, fields: traced.append(action))
    queue.put(store.put("s0", sample_tensors(0)))
    lease = queue.acquire(timeout=0)
    assert lease is not None and queue.ack(lease)
    assert queue._engine.reported == ["Admitted", "Leased", "Settled"]
    assert traced == ["Put", "Acquire", "Ack"]


def test_the_deadline_heap_stays_bounded_by_the_live_leases_and_still_reaps() -> None:
    clock = FakeClock(100.0)
    store, queue = _queue(clock)
    for i in range(3):
        queue.put(store.put(f"s{i}", sample_tensors(i)))
    kept, extended = queue.acquire(timeout=0), queue.acquire(timeout=0)
    assert kept is not None and extended is not None
    for _ in range(3000):  # every extend leaves its old deadline in the heap
        queue.extend(extended, 20.0)
    heap = queue._engine._deadlines
    assert len(heap) <= 2 * queue.outstanding_count() + 1024 + 1

    clock.advance(12.0)  # past ``kept``'s deadline (10 s), before ``extended``'s (20 s)
    assert queue.reclaim_expired() == 1
    assert not queue.ack(kept) and queue.ack(extended)
    assert queue.outstanding_count() == 0 and queue._engine._deadlines == []  # no live lease: every entry was dead

    redelivered = queue.acquire(timeout=0)
    assert redelivered is not None and redelivered.ref.sample_id in ("s0", "s2")
    clock.advance(11.0)
    assert queue.reclaim_expired() == 1  # the heap still reaps after it was cleared
    assert queue.stats().reclaimed == 2


@pytest.mark.parametrize("wait", [True, -1, -0.5, math.nan, math.inf, "0"])
def test_acquire_refuses_what_is_no_number_of_seconds_naming_it(wait: object) -> None:
    store, queue = _queue(FakeClock(100.0))
    queue.put(store.put("s0", sample_tensors(0)))
    with pytest.raises(ValueError, match=rf"timeout must be a finite number of seconds >= 0, got {wait!r}"):
        queue.acquire(timeout=wait)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=rf"poll_interval must be a finite number of seconds >= 0, got {wait!r}"):
        queue.acquire(wait)  # type: ignore[arg-type]
    assert queue.pending_count() == 1 and queue._engine.reported == []


def test_a_lease_subclass_settles_and_a_non_lease_is_refused_naming_it() -> None:
    @dataclasses.dataclass(eq=False)
    class Tagged(Lease):
        tag: str = ""

    store, queue = _queue(FakeClock(100.0))
    queue.put(store.put("s0", sample_tensors(0)))
    lease = queue.acquire(timeout=0)
    assert lease is not None
    for settle in (queue.ack, queue.fail, queue.lose):
        with pytest.raises(TypeError, match="'not a lease'"):
            settle("not a lease")  # type: ignore[arg-type]
    copy = Tagged(lease.ref, lease.deadline, lease.visibility_timeout, lease.redelivery_count, lease.lease_id)
    assert not queue.ack(copy)  # a copy of the live lease, subclass or not, is stale
    assert queue.ack(lease) and queue.stats().stale_rejected == 1

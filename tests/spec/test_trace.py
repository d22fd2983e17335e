"""Trace validation: TLC admits the implementation's traces and rejects those of seeded-defect variants."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable

import pytest

from featurestream import FeatureStore, LeaseLost, LocalFeatureStore, SampleRefQueue, VisibilityTimeout
from featurestream.backends.memory.engine import _Record
from featurestream.spec.recording import STORE_GET, STORE_PUT, STORE_RELEASE, STORE_SCRUB, TraceRecorder
from featurestream.spec.trace import TraceConstants, TraceResult, validate_trace, validate_traces
from featurestream.testing import FakeClock, FaultyStore
from support.defects import NoDedupQueue, NoDeliveryLimitQueue, RetainIgnoringStore, UnretainingScrubStore
from support.samples import put_sample

pytestmark = pytest.mark.timeout(600)

MAX_DELIVERIES = 2
VT = 10.0
Scenario = Callable[[], list[tuple[str, dict[str, object]]]]


def _queue(
    queue_class: type[SampleRefQueue] = SampleRefQueue, store: FeatureStore | None = None, *, wrap: bool = False
) -> tuple[SampleRefQueue, FeatureStore, FakeClock, TraceRecorder]:
    """A traced queue on a fake clock; ``wrap``: its store's put/get/release/scrub are traced too."""
    store = store if store is not None else LocalFeatureStore()
    clock, recorder = FakeClock(1000.0), TraceRecorder()
    store = recorder.wrap(store) if wrap else store
    queue = queue_class(store, VisibilityTimeout(VT), max_deliveries=MAX_DELIVERIES, clock=clock, tracer=recorder)
    return queue, store, clock, recorder


def correct_run() -> list[tuple[str, dict[str, object]]]:
    """Every traced action: puts, FIFO, fail, reclaim, stale ack, extend, dead letter, dedup, close, drain;
    the store's put/get/release/scrub."""
    queue, store, clock, recorder = _queue(wrap=True)
    refs = [put_sample(store, f"x{i}") for i in range(3)]
    for ref in refs:
        queue.put(ref)
    recorder.observe_residency(store)
    first, second = queue.acquire(), queue.acquire()
    assert first is not None and second is not None
    _, handle = store.get(second.ref)
    queue.extend(first)
    queue.fail(first)
    clock.advance(11)
    assert queue.reclaim_expired() == 1
    store.release(handle)  # a stale consumer's release must not free the redelivered sample
    queue.ack(second)  # stale: rejected
    recorder.observe_residency(store)
    third = queue.acquire()
    assert third is not None
    queue.ack(third)
    recorder.observe_residency(store)
    with pytest.raises(ValueError, match="already"):
        queue.put(refs[2])
    again = queue.acquire()
    assert again is not None
    queue.fail(again)  # x0's second delivery: dead-lettered
    queue.close()
    while (lease := queue.acquire(timeout=0)) is not None:
        queue.ack(lease)
    recorder.observe_residency(store)
    assert queue.lifecycle_state == "drained" and [d.ref.sample_id for d in queue.dead_letters()] == ["x0"]
    return recorder.events


def backpressure_run() -> list[tuple[str, dict[str, object]]]:
    """A producer stores, pauses at the high watermark, and resumes once consumers ack down to the low one."""
    recorder = TraceRecorder()
    store = recorder.wrap(LocalFeatureStore(max_samples=None))
    refs = [put_sample(store, f"b{i}") for i in range(3)]
    size = refs[0].estimated_bytes
    queue = SampleRefQueue(
        store, VisibilityTimeout(VT), max_deliveries=MAX_DELIVERIES, high_watermark_bytes=2 * size,
        low_watermark_bytes=size, tracer=recorder,
    )  # fmt: skip
    queue.put(refs[0])
    queue.put(refs[1])
    producer = threading.Thread(target=queue.put_blocks_until_below, args=(refs[2], 0.005))
    producer.start()
    while queue.backpressure_state != "paused":
        producer.join(0.001)
    for _ in range(2):
        queue.ack(queue.acquire(timeout=1.0))  # type: ignore[arg-type]
    producer.join(timeout=10)
    assert not producer.is_alive() and queue.pending_count() == 1
    recorder.observe_residency(store)
    return recorder.events


def reject_run() -> list[tuple[str, dict[str, object]]]:
    """The loader's schema refuses r0: rejected at its first delivery (a delivery left), its scrub failing once
    and retried; a second reject of the same lease is stale; r1 trains and is acked."""
    faulty = FaultyStore(LocalFeatureStore())
    queue, store, _, recorder = _queue(store=faulty, wrap=True)
    for sample_id in ("r0", "r1"):
        queue.put(put_sample(store, sample_id))
    rejected = queue.acquire()
    assert rejected is not None and rejected.redelivery_count + 1 < MAX_DELIVERIES
    faulty.arm("scrub")
    assert queue.reject(rejected, "sample r0: hidden_states dtype torch.int8")
    assert not queue.reject(rejected, "sample r0: again")
    trained = queue.acquire()
    assert trained is not None
    queue.ack(trained)
    recorder.observe_residency(store)
    assert [d.ref.sample_id for d in queue.dead_letters()] == ["r0"] and queue.stats().acked == 1
    return recorder.events


def rejected_then_trained() -> list[tuple[str, dict[str, object]]]:
    """A patched queue whose reject hands the refused sample out again, and a consumer acks it."""

    class RedeliveringQueue(SampleRefQueue):
        def reject(self, lease: object, why: str) -> bool:
            rejected = super().reject(lease, why)  # type: ignore[arg-type]
            with self._lock:
                self._engine._push_pending(_Record(lease.ref, 0))  # type: ignore[attr-defined]
            return rejected

    queue, store, _, recorder = _queue(RedeliveringQueue)
    queue.put(put_sample(store, "r0"))
    queue.reject(queue.acquire(), "sample r0: no supervision")  # type: ignore[arg-type]
    queue.ack(queue.acquire())  # type: ignore[arg-type]
    return recorder.events


def redelivered_after_ack() -> list[tuple[str, dict[str, object]]]:
    """A patched queue that hands an acked sample out again."""

    class RedeliveringQueue(SampleRefQueue):
        def ack(self, lease: object) -> None:
            super().ack(lease)  # type: ignore[arg-type]
            with self._lock:
                self._engine._push_pending(_Record(lease.ref, 0))  # type: ignore[attr-defined]

    queue, store, _, recorder = _queue(RedeliveringQueue)
    queue.put(put_sample(store, "x0"))
    queue.ack(queue.acquire())  # type: ignore[arg-type]
    queue.acquire()
    return recorder.events


def dedup_accepted() -> list[tuple[str, dict[str, object]]]:
    """C: a re-put of an acked id is accepted."""
    queue, store, _, recorder = _queue(NoDedupQueue)
    ref = put_sample(store, "x0")
    queue.put(ref)
    queue.ack(queue.acquire())  # type: ignore[arg-type]
    queue.put(ref)
    return recorder.events


def no_delivery_limit() -> list[tuple[str, dict[str, object]]]:
    """D: a poison sample failed past max_deliveries is redelivered instead of dead-lettered."""
    queue, store, _, recorder = _queue(NoDeliveryLimitQueue)
    queue.put(put_sample(store, "x0"))
    for _ in range(MAX_DELIVERIES + 1):
        queue.fail(queue.acquire())  # type: ignore[arg-type]
    return recorder.events


def stale_release_frees() -> list[tuple[str, dict[str, object]]]:
    """A: the store ignores retain, so a stale consumer's release frees the redelivered sample."""
    queue, store, clock, recorder = _queue(store=RetainIgnoringStore())
    queue.put(put_sample(store, "x0"))
    lease = queue.acquire()
    assert lease is not None
    _, handle = store.get(lease.ref)
    clock.advance(11)
    queue.reclaim_expired()
    store.release(handle)
    recorder.observe_residency(store)
    return recorder.events


def scrub_skipped() -> list[tuple[str, dict[str, object]]]:
    """B: a settled sample is only un-retained; the crashed consumer's handle keeps its bytes."""
    queue, store, _, recorder = _queue(store=UnretainingScrubStore())
    queue.put(put_sample(store, "x0"))
    lease = queue.acquire()
    assert lease is not None
    store.get(lease.ref)  # the consumer crashes holding this handle
    queue.ack(lease)
    recorder.observe_residency(store)
    return recorder.events


DEFECTS: dict[str, tuple[Scenario, str]] = {
    "redelivered after ack": (redelivered_after_ack, "Acquire"),
    "rejected, then handed out and acked": (rejected_then_trained, "Acquire"),
    "C: dedup re-put accepted": (dedup_accepted, "Put"),
    "D: no delivery limit": (no_delivery_limit, "Fail"),
    "A: stale release frees a queued sample": (stale_release_frees, "Resident"),
    "B: scrub skipped": (scrub_skipped, "Resident"),
}


def test_correct_trace_is_admitted_and_defect_traces_are_rejected(tlc_available: None) -> None:
    size = put_sample(LocalFeatureStore(), "probe").estimated_bytes
    traces = [correct_run(), backpressure_run(), reject_run()] + [scenario() for scenario, _ in DEFECTS.values()]
    constants = TraceConstants(
        MAX_DELIVERIES, sample_bytes=size, high_watermark=2 * size, low_watermark=size, visibility_timeout=VT
    )
    results = validate_traces(traces, constants)
    print(f"one TLC run for {len(traces)} traces: {results[0].tlc.seconds:.1f} s")
    for result in results[:3]:
        assert result.admitted, result.explain()
    assert results[0].total_steps >= 20
    assert {STORE_PUT, STORE_GET, STORE_RELEASE, STORE_SCRUB} <= {a for a, _ in traces[0]}
    assert [a for a, _ in traces[1]].count("Pause") == 1 and [a for a, _ in traces[1]].count("Resume") == 1
    # The values the validator checked were there to check.
    assert all({"n", "pending", "outstanding", "now", "deadline"} <= f.keys() for a, f in traces[0] if a == "Acquire")
    assert any("resident_bytes" in f for a, f in traces[1] if a == "Pause")
    assert [a for a, _ in traces[2]].count("StaleRejected") == 1 and "ScrubRetried" in [a for a, _ in traces[2]]
    for (name, (_, stuck_action)), result in zip(DEFECTS.items(), results[3:], strict=True):
        print(f"{name}: {result.explain()}")
        assert not result.admitted, name
        assert result.stuck_at is not None and result.stuck_at["action"] == stuck_action, (name, result.explain())


def test_thread_stress_trace_is_admitted(tlc_available: None) -> None:
    """Real threads, a real clock, the reaper, and a producer blocked by reachable watermarks: the spec admits
    whatever interleaving happened, values included (counts, resident bytes, deadlines), with Pause and Resume.

    One producer stores and puts (``put_blocks_until_below``) on its own: its health reads then see exactly the
    store writes traced before them. The consumers start once it has paused.
    """
    recorder = TraceRecorder()
    store = recorder.wrap(LocalFeatureStore(max_samples=None))
    size = put_sample(LocalFeatureStore(), "probe").estimated_bytes
    vt = 0.02
    queue = SampleRefQueue(
        store, VisibilityTimeout(vt), high_watermark_bytes=4 * size, low_watermark_bytes=2 * size,
        max_deliveries=3, reaper_interval=0.005, tracer=recorder,
    )  # fmt: skip
    samples = 25

    def produce() -> None:
        for i in range(samples):
            queue.put_blocks_until_below(put_sample(store, f"t{i}"), poll_interval=0.002)

    def consume(seed: int) -> None:
        rng = random.Random(seed)
        while (lease := queue.acquire(timeout=1.0)) is not None:
            roll = rng.random()
            if roll < 0.6:
                queue.ack(lease)
            elif roll < 0.8:
                queue.fail(lease)
            elif roll < 0.9:
                try:
                    queue.extend(lease)
                    queue.ack(lease)
                except LeaseLost:  # the reaper was faster
                    queue.ack(lease)
            # else: this consumer "crashes" on the lease and the reaper reclaims it

    producer = threading.Thread(target=produce)
    consumers = [threading.Thread(target=consume, args=(k,)) for k in range(3)]
    producer.start()
    while queue.backpressure_state != "paused" and producer.is_alive():
        producer.join(0.001)
    for thread in consumers:
        thread.start()
    producer.join(timeout=30)
    queue.close()
    for thread in consumers:
        thread.join(timeout=30)
    assert not producer.is_alive() and queue.lifecycle_state == "drained"
    actions = [action for action, _ in recorder.events]
    assert actions.count("Pause") >= 1 and actions.count("Resume") >= 1
    constants = TraceConstants(
        max_deliveries=3, sample_bytes=size, high_watermark=4 * size, low_watermark=2 * size, visibility_timeout=vt
    )
    result: TraceResult = validate_trace(recorder.events, constants)
    print(f"{len(recorder.events)} events: {result.explain()} ({result.tlc.seconds:.1f} s)")
    assert result.admitted, result.explain()


def test_unknown_events_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="Teleport"):
        validate_traces([[("Teleport", {})]], TraceConstants(max_deliveries=1))


def test_wrapped_store_records_the_calls_that_took_effect_and_forwards_the_rest() -> None:
    recorder = TraceRecorder()
    inner = LocalFeatureStore()
    store = recorder.wrap(inner)
    ref = put_sample(store, "w0")
    _, handle = store.get(ref)
    store.release(handle)
    store.retain(ref)
    store.scrub(ref)
    with pytest.raises(KeyError):
        store.get(ref)  # scrubbed: the failed get is not a step
    assert [action for action, _ in recorder.events] == [STORE_PUT, STORE_GET, STORE_RELEASE, STORE_SCRUB]
    assert recorder.events[1][1] == {"sample_id": "w0", "handle_id": handle.handle_id}
    assert store.store_uri == inner.store_uri and store.health() == inner.health() and not store.is_resident("w0")
    recorder.observe_residency(store)
    assert recorder.events[-1] == ("Resident", {"samples": [], "resident_bytes": 0})
    with pytest.raises(TypeError, match="FeatureStore"):
        recorder.wrap(object())  # type: ignore[arg-type]


def test_a_dead_letter_repair_trace_of_the_real_queue_is_admitted(tlc_available: None) -> None:
    """keep_dead_letter_bytes: a kept dead letter requeued and acked, another purged (its scrub fails once and is
    retried by the next queue call); the store wrapped, residency observed throughout. (Every dead letter fits
    the cap: the spec does not model it.)"""
    size = put_sample(LocalFeatureStore(), "probe").estimated_bytes
    clock, recorder = FakeClock(1000.0), TraceRecorder()
    faulty = FaultyStore(LocalFeatureStore())
    store = recorder.wrap(faulty)
    queue = SampleRefQueue(
        store, VisibilityTimeout(VT), max_deliveries=1, clock=clock, tracer=recorder, keep_dead_letter_bytes=2 * size
    )
    for sample_id in ("k0", "k1"):
        queue.put(put_sample(store, sample_id))
    for _ in range(2):
        lease = queue.acquire()
        assert lease is not None
        queue.fail(lease)  # max_deliveries 1: dead, its bytes kept
    recorder.observe_residency(store)
    assert queue.requeue_dead_letters(["k0"]) == ["k0"]
    again = queue.acquire()
    assert again is not None and again.ref.sample_id == "k0" and again.redelivery_count == 0
    queue.ack(again)
    faulty.arm("scrub")
    assert queue.purge_dead_letters() == ["k1"]
    recorder.observe_residency(store)
    assert queue.acquire(timeout=0) is None  # a later queue call retries the owed scrub
    recorder.observe_residency(store)
    assert not any(store.is_resident(s) for s in ("k0", "k1"))
    actions = [action for action, _ in recorder.events]
    assert actions.count("RequeueDeadLetter") == 1 and actions.count("PurgeDeadLetter") == 1
    assert "ScrubRetried" in actions
    constants = TraceConstants(1, sample_bytes=size, visibility_timeout=VT, keep_dead_letters=True)
    result = validate_trace(recorder.events, constants)
    assert result.admitted, result.explain()

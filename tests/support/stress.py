"""Real threads on one queue: producers, and consumers that ack, fail, crash, stall past their lease, extend."""

from __future__ import annotations

import dataclasses
import random
import threading

from featurestream import LocalFeatureStore, SampleRefQueue, VisibilityTimeout
from featurestream.spec.recording import TracedStore, TraceRecorder
from featurestream.testing import sample_tensors

TOKENS = 2  # every sample 80 bytes (one size, as trace validation needs)
SAMPLE_BYTES = 40 * TOKENS
VISIBILITY = 0.05
JOIN_TIMEOUT = 30.0


@dataclasses.dataclass
class StressRun:
    queue: SampleRefQueue
    store: TracedStore
    recorder: TraceRecorder
    sample_ids: list[str]
    errors: list[BaseException]
    hung: list[str]


def _producer(queue: SampleRefQueue, store: TracedStore, ids: list[str], stop: threading.Event) -> None:
    for sample_id in ids:
        ref = store.put(sample_id, sample_tensors(0, TOKENS))
        queue.put_blocks_until_below(ref, poll_interval=0.01, abort_when=stop.is_set)


def _consumer(queue: SampleRefQueue, store: TracedStore, seed: int, stop: threading.Event) -> None:
    rng = random.Random(seed)
    while not stop.is_set():
        lease = queue.acquire(timeout=0.05)
        if lease is None:
            if queue.lifecycle_state == "drained":
                return
            continue
        try:
            _, handle = store.get(lease.ref)
        except KeyError:  # only a stale lease (reclaimed, then settled) finds its sample gone
            queue.ack(lease)
            continue
        roll = rng.random()
        if roll < 0.08:  # crash: forget the lease and the handle
            continue
        if roll < 0.15:  # stall past the visibility timeout, then ack late (usually rejected as stale)
            stop.wait(VISIBILITY * 1.5)
            queue.ack(lease)
            store.release(handle)
        elif roll < 0.30:
            store.release(handle)
            queue.fail(lease)
        elif roll < 0.40:  # heartbeat, then ack while still holding the handle
            try:
                queue.extend(lease, VISIBILITY)
            except RuntimeError:  # LeaseLost: reclaimed meanwhile
                pass
            queue.ack(lease)
            store.release(handle)
        else:
            store.release(handle)
            queue.ack(lease)


def run_stress(
    seed: int,
    producers: int = 3,
    consumers: int = 4,
    per_producer: int = 60,
    watermarks: tuple[int, int] = (20 * SAMPLE_BYTES, 5 * SAMPLE_BYTES),
    max_deliveries: int = 3,
) -> StressRun:
    """Run the threads to completion (or ``JOIN_TIMEOUT``) and return what to check.

    ``watermarks`` are the queue's (high, low) in bytes.
    """
    recorder = TraceRecorder()
    # Wrapped: its puts are traced, so trace validation knows the bytes producers hold before they put.
    store = recorder.wrap(
        LocalFeatureStore(max_samples=10_000, max_bytes=None, high_watermark_bytes=None, low_watermark_bytes=None)
    )
    queue = SampleRefQueue(
        store,
        VisibilityTimeout(VISIBILITY),
        high_watermark_bytes=watermarks[0],
        low_watermark_bytes=watermarks[1],
        max_deliveries=max_deliveries,
        reaper_interval=0.01,
        tracer=recorder,
    )
    stop = threading.Event()
    errors: list[BaseException] = []

    def guarded(target, *args):  # type: ignore[no-untyped-def]
        def run() -> None:
            try:
                target(*args)
            except BaseException as exc:  # reported by the test, not lost in a thread
                errors.append(exc)

        return run

    ids = [[f"p{p}-{n}" for n in range(per_producer)] for p in range(producers)]
    producer_threads = [
        threading.Thread(target=guarded(_producer, queue, store, ids[p], stop), name=f"producer-{p}")
        for p in range(producers)
    ]
    consumer_threads = [
        threading.Thread(target=guarded(_consumer, queue, store, seed * 100 + c, stop), name=f"consumer-{c}")
        for c in range(consumers)
    ]
    for thread in producer_threads + consumer_threads:
        thread.start()
    hung = []
    for thread in producer_threads:
        thread.join(JOIN_TIMEOUT)
    queue.close()
    for thread in consumer_threads:
        thread.join(JOIN_TIMEOUT)
    stop.set()  # unblocks anything still running, so a hang fails the test instead of the suite
    for thread in producer_threads + consumer_threads:
        thread.join(1.0)
        if thread.is_alive():
            hung.append(thread.name)
    return StressRun(queue, store, recorder, [i for group in ids for i in group], errors, hung)

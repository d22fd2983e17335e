"""FeatureDataLoader with prefetch: read-ahead, heartbeats, give-back on close/error/crash, nothing lost or doubled.

Each test runs over the in-process ``LocalFeatureStore`` and over a
``SharedDirFeatureStore``. Deadlines run on a ``FakeClock``; a test waits for
an observable state (a count of leases or extends) with a generous limit,
never for a fixed time.
"""

from __future__ import annotations

import gc
import random
import re
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from featurestream import (
    FeatureDataLoader,
    FeatureStore,
    LocalFeatureStore,
    SampleRefQueue,
    SharedDirFeatureStore,
    VisibilityTimeout,
)
from featurestream.pipeline.prefetch import LeaseBook
from featurestream.testing import FakeClock
from support.helpers import assert_is_sample, put_eagle3, untrainable_eagle3_sample

WAIT_LIMIT_S = 30.0


def wait_for(what: str, condition: Callable[[], bool]) -> None:
    """Poll ``condition`` until true; fail after ``WAIT_LIMIT_S`` (a hang, not a timing assertion)."""
    give_up = time.monotonic() + WAIT_LIMIT_S
    while not condition():
        if time.monotonic() > give_up:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.002)


def index_of(batch: Any) -> int:
    """The sample index a one-sample batch was built from (``eagle3_sample`` ids start at 100 * index)."""
    return int(batch.input_ids[0, 0].item()) // 100


@pytest.fixture(params=["local", "shared_dir"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[], FeatureStore]:
    """A factory of the store under test (the shared-dir one: another instance on the same directory each call)."""
    if request.param == "local":
        store = LocalFeatureStore()
        return lambda: store
    return lambda: SharedDirFeatureStore(tmp_path / "shared")


def filled_queue(store: FeatureStore, count: int, *, close: bool = True, **kwargs: Any) -> SampleRefQueue:
    queue = SampleRefQueue(store, **kwargs)
    for index in range(count):
        queue.put(put_eagle3(store, index))
    if close:
        queue.close()
    return queue


def timed_queue(store: FeatureStore, count: int) -> tuple[SampleRefQueue, FakeClock]:
    """``filled_queue`` with a 10 s visibility timeout on a ``FakeClock``: the test decides when leases expire."""
    clock = FakeClock()
    return filled_queue(store, count, visibility_timeout=VisibilityTimeout(10.0), clock=clock), clock


class Severable:
    """A queue seen through a connection that ``sever()`` cuts, as if the consumer's process died.

    Calls are serialised, so once ``sever`` returns no call is still running
    (no late ``extend`` can move a deadline after the test advanced the clock).
    """

    def __init__(self, queue: SampleRefQueue) -> None:
        self._queue = queue
        self._lock = threading.Lock()
        self._severed = False

    def sever(self) -> None:
        with self._lock:
            self._severed = True

    def __getattr__(self, name: str) -> Any:
        target = getattr(self._queue, name)
        if not callable(target):
            return target

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                if self._severed:
                    raise ConnectionError(f"{name}: the consumer's process is gone")
                return target(*args, **kwargs)

        return call


class TestPrefetch:
    def test_reads_ahead_in_fifo_order_and_settles_each_sample_once(
        self, make_store: Callable[[], FeatureStore]
    ) -> None:
        store = make_store()
        queue = filled_queue(store, 6)
        loader = FeatureDataLoader(queue, make_store(), prefetch=2)
        first = next(loader)
        assert_is_sample(first.tensors(), 0)
        wait_for("two samples leased ahead of the held one", lambda: queue.outstanding_count() == 3)
        assert queue.stats().acked == 0, "the held batch is valid through the step"
        rest = [index_of(batch) for batch in loader]
        assert rest == [1, 2, 3, 4, 5], "FIFO per loader"
        stats = queue.stats()
        assert (stats.acked, stats.failed, stats.reclaimed, stats.leased) == (6, 0, 0, 6)
        assert queue.lifecycle_state == "drained" and store.health().sample_count == 0

    def test_every_sample_is_trained_once_while_a_producer_puts_and_the_trainer_fails_some(
        self, make_store: Callable[[], FeatureStore]
    ) -> None:
        store = make_store()
        queue = SampleRefQueue(store)
        count = 40

        def produce() -> None:
            for index in range(count):
                queue.put(put_eagle3(store, index))
            queue.close()

        producer = threading.Thread(target=produce)
        producer.start()
        rng = random.Random(7)
        trained: Counter[int] = Counter()
        with FeatureDataLoader(queue, make_store(), prefetch=3) as loader:
            for batch in loader:
                if rng.random() < 0.25:
                    loader.fail_current()
                else:
                    trained[index_of(batch)] += 1
        producer.join(WAIT_LIMIT_S)
        assert trained == Counter(range(count)), "each sample trained on exactly once"
        assert queue.stats().acked == count and queue.lifecycle_state == "drained"

    def test_close_gives_every_prefetched_lease_back(self, make_store: Callable[[], FeatureStore]) -> None:
        store = make_store()
        queue = filled_queue(store, 5, close=False)
        loader = FeatureDataLoader(queue, make_store(), prefetch=2)
        next(loader)
        wait_for("a full prefetch buffer", lambda: queue.outstanding_count() == 3)
        loader.close()
        stats = queue.stats()
        assert (stats.acked, stats.failed, stats.given_back, stats.pending, stats.outstanding) == (1, 0, 2, 4, 0)
        assert queue.is_closed
        redelivered = [index_of(batch) for batch in FeatureDataLoader(queue, make_store(), prefetch=0)]
        assert redelivered == [3, 4, 1, 2], "the given-back samples went to the tail, nothing lost"
        assert store.health().sample_count == 0

    def test_a_trainer_exception_fails_the_held_batch_and_gives_the_buffer_back(
        self, make_store: Callable[[], FeatureStore]
    ) -> None:
        store = make_store()
        queue = filled_queue(store, 4)
        with pytest.raises(RuntimeError, match="step blew up"):
            with FeatureDataLoader(queue, make_store(), prefetch=2) as loader:
                next(loader)
                wait_for("a full prefetch buffer", lambda: queue.outstanding_count() == 3)
                raise RuntimeError("step blew up")
        stats = queue.stats()
        assert (stats.acked, stats.failed, stats.given_back, stats.pending, stats.outstanding) == (0, 1, 2, 4, 0)
        assert store.health().sample_count == 4, "nothing lost"

    def test_heartbeats_keep_prefetched_leases_alive_through_a_slow_step(
        self, make_store: Callable[[], FeatureStore]
    ) -> None:
        store = make_store()
        queue, clock = timed_queue(store, 3)
        loader = FeatureDataLoader(queue, make_store(), prefetch=2, heartbeat_interval=0.005)
        next(loader)
        loader.consume_now()  # the held batch is the trainer's to extend; this test is about the buffer
        wait_for("a full prefetch buffer", lambda: queue.outstanding_count() == 2)
        for _ in range(4):  # 24 s of a slow step, far past the 10 s visibility timeout
            target = queue.stats().extended + 2
            clock.advance(6.0)
            wait_for("both buffered leases extended", lambda target=target: queue.stats().extended >= target)
        assert [index_of(batch) for batch in loader] == [1, 2]
        assert queue.stats().reclaimed == 0 and queue.stats().acked == 3

    def test_a_prefetched_batch_whose_lease_was_lost_is_not_handed_out(
        self, make_store: Callable[[], FeatureStore]
    ) -> None:
        store = make_store()
        queue, clock = timed_queue(store, 3)
        loader = FeatureDataLoader(queue, make_store(), prefetch=2, heartbeat_interval=0.005)
        assert index_of(next(loader)) == 0
        wait_for("a full prefetch buffer", lambda: queue.outstanding_count() == 3)
        clock.advance(11.0)  # every lease expires before a heartbeat reaches it: the next extend finds them lost
        wait_for("the expired leases reclaimed", lambda: queue.stats().reclaimed == 3)
        rest = []
        for batch in loader:
            rest.append((index_of(batch), loader.current_lease.redelivery_count))  # type: ignore[union-attr]
        assert rest == [(0, 1), (1, 1), (2, 1)], "the lost batches were skipped and their samples leased afresh"
        assert queue.stats().acked == 3 and queue.stats().stale_rejected >= 1

    def test_materialises_on_the_requested_device(self, make_store: Callable[[], FeatureStore]) -> None:
        store = make_store()
        queue = filled_queue(store, 2)
        loader = FeatureDataLoader(queue, make_store(), device="cpu", non_blocking=True)
        batches = list(loader)
        assert [b.logits.device.type for b in batches] == ["cpu", "cpu"]
        assert_is_sample(batches[1].tensors(), 1)

    def test_a_crashed_consumer_with_a_full_buffer_loses_nothing(self, make_store: Callable[[], FeatureStore]) -> None:
        store = make_store()
        queue, clock = timed_queue(store, 6)
        link = Severable(queue)
        crashed = FeatureDataLoader(link, make_store(), prefetch=3)  # type: ignore[arg-type]
        trained_before_crash = index_of(next(crashed))
        wait_for("a full prefetch buffer", lambda: queue.outstanding_count() == 4)
        link.sever()  # the process dies mid-step: no ack, no give-back, no more heartbeats
        clock.advance(11.0)
        survivor = FeatureDataLoader(queue, make_store(), prefetch=2)
        trained = Counter(index_of(batch) for batch in survivor)
        assert trained == Counter(range(6)), "every sample trained by the survivor exactly once"
        assert trained_before_crash == 0, "only the batch in the crashed step is trained twice (it was never acked)"
        stats = queue.stats()
        assert (stats.acked, stats.reclaimed, stats.dead_lettered) == (6, 4, 0)
        assert store.health().sample_count == 0
        del crashed

    def test_an_abandoned_loader_gives_its_buffer_back_when_collected(
        self, make_store: Callable[[], FeatureStore]
    ) -> None:
        store = make_store()
        queue = filled_queue(store, 4)
        loader = FeatureDataLoader(queue, make_store(), prefetch=2)
        next(loader)
        wait_for("a full prefetch buffer", lambda: queue.outstanding_count() == 3)
        del loader
        gc.collect()
        stats = queue.stats()
        assert (stats.given_back, stats.outstanding) == (2, 1), (
            "the buffer is back; the held batch waits for its deadline"
        )

    def test_a_prefetch_thread_error_is_raised_after_everything_went_back(
        self, make_store: Callable[[], FeatureStore]
    ) -> None:
        queue = BreakingQueue.of_four_samples(make_store(), break_on_acquire=3)
        loader = FeatureDataLoader(queue, make_store(), prefetch=2)
        assert index_of(next(loader)) == 0
        wait_for("the thread's crash", lambda: queue.raised is not None and queue.outstanding_count() == 1)
        with pytest.raises(OSError) as caught:
            next(loader)
        assert caught.value is queue.raised, "the original exception"
        assert queue.stats().given_back == 1 and queue.stats().acked == 1, "its buffered lease went back"
        assert [index_of(batch) for batch in loader] == [2, 3, 1], "the loader carries on with a fresh thread"

    def test_a_thread_crash_while_a_batch_is_handed_over_leaves_that_batch_and_its_lease_to_the_trainer(
        self, make_store: Callable[[], FeatureStore], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        queue = BreakingQueue.of_four_samples(make_store(), break_on_acquire=3)
        real_take = LeaseBook.take
        first = [True]

        def take_once_the_thread_crashed(book: LeaseBook, leases: Any) -> list[Any]:
            # The crash lands between the trainer's pull of batch 0 and its hand-over (a window a loaded
            # machine opens by chance): the thread's give-back must spare the batch being handed over.
            if first.pop() if first else False:
                wait_for("the thread's crash", lambda: queue.raised is not None and queue.stats().given_back >= 1)
            return real_take(book, leases)

        monkeypatch.setattr(LeaseBook, "take", take_once_the_thread_crashed)
        loader = FeatureDataLoader(queue, make_store(), prefetch=2)
        assert index_of(next(loader)) == 0
        assert queue.outstanding_count() == 1, "the batch handed over keeps its lease"
        assert queue.stats().given_back == 1, "only the buffered batch went back"
        with pytest.raises(OSError) as caught:
            next(loader)
        assert caught.value is queue.raised
        assert queue.stats().acked == 1, "batch 0 was acked, once"
        assert [index_of(batch) for batch in loader] == [2, 3, 1]
        assert queue.stats().acked == 4 and queue.stats().stale_rejected == 0

    def test_an_ack_that_fails_is_raised_by_the_next_pull_and_nothing_is_lost(
        self, make_store: Callable[[], FeatureStore]
    ) -> None:
        store = make_store()
        clock = FakeClock()
        queue = AckBreakingQueue(store, clock=clock)
        for index in range(3):
            queue.put(put_eagle3(store, index))
        queue.close()
        loader = FeatureDataLoader(queue, make_store(), prefetch=2)
        seen: list[int] = []
        with pytest.raises(OSError, match="ack lost"):
            for batch in loader:
                seen.append(index_of(batch))
        loader.close()  # gives back what it prefetched
        clock.advance(31.0)  # the unacked lease of s0 expires and is redelivered
        seen += [index_of(batch) for batch in FeatureDataLoader(queue, make_store(), prefetch=0)]
        assert sorted(seen) == [0, 0, 1, 2], "s0 was trained again: its ack never took effect"
        stats = queue.stats()
        assert (stats.acked, stats.reclaimed) == (3, 1)

    def test_per_sample_errors_come_out_in_stream_order(self, make_store: Callable[[], FeatureStore]) -> None:
        store = make_store()
        queue = SampleRefQueue(store)
        queue.put(put_eagle3(store, 0))
        queue.put(store.put("bad", untrainable_eagle3_sample(1)))
        queue.put(put_eagle3(store, 2))
        queue.close()
        loader = FeatureDataLoader(queue, make_store(), prefetch=2)
        assert index_of(next(loader)) == 0
        with pytest.raises(ValueError, match=r"dead-lettered \(reason schema"):
            next(loader)
        assert [index_of(batch) for batch in loader] == [2]
        stats = queue.stats()
        assert (stats.acked, stats.dead_lettered, stats.reclaimed) == (2, 1, 0)

    def test_close_from_another_thread_wakes_a_waiting_trainer(self, make_store: Callable[[], FeatureStore]) -> None:
        queue = SampleRefQueue(make_store())
        loader = FeatureDataLoader(queue, make_store(), prefetch=2, acquire_poll_interval=60.0)
        outcome: list[object] = []
        trainer = threading.Thread(target=lambda: outcome.append(next(loader, "stopped")))
        trainer.start()
        wait_for("the prefetch thread", lambda: loader._prefetcher is not None)
        loader.close()
        trainer.join(WAIT_LIMIT_S)
        assert outcome == ["stopped"] and queue.is_closed


class BreakingQueue(SampleRefQueue):
    """A queue whose ``break_on_acquire``-th ``acquire`` raises ``OSError`` (a lost connection, say)."""

    def __init__(self, store: FeatureStore, *, break_on_acquire: int) -> None:
        super().__init__(store)
        self._break_on = break_on_acquire
        self._acquires = 0
        self.raised: OSError | None = None

    @classmethod
    def of_four_samples(cls, store: FeatureStore, *, break_on_acquire: int) -> BreakingQueue:
        """A closed queue of samples 0..3 put in ``store``."""
        queue = cls(store, break_on_acquire=break_on_acquire)
        for index in range(4):
            queue.put(put_eagle3(store, index))
        queue.close()
        return queue

    def acquire(self, poll_interval: float = 0.05, *, timeout: float | None = None) -> Any:
        self._acquires += 1
        if self._acquires == self._break_on:
            self.raised = OSError("connection reset while acquiring")
            raise self.raised
        return super().acquire(poll_interval, timeout=timeout)


class AckBreakingQueue(SampleRefQueue):
    """A queue whose first ``ack`` raises ``OSError`` before reaching the queue (a lost connection, say)."""

    broken = True

    def ack(self, lease: Any) -> None:
        if self.broken:
            self.broken = False
            raise OSError("ack lost on the way to the queue")
        super().ack(lease)


def test_bad_arguments_are_refused() -> None:
    queue = SampleRefQueue(LocalFeatureStore())
    for kwargs, error, text in [
        ({"prefetch": -1}, ValueError, "prefetch must be an int >= 0, got -1"),
        ({"prefetch": True}, ValueError, "prefetch must be an int >= 0, got True"),
        ({"heartbeat_interval": 0}, ValueError, "heartbeat_interval must be > 0 seconds, got 0"),
        ({"non_blocking": 1}, TypeError, "non_blocking must be a bool, got 1"),
        ({"process_group": object()}, RuntimeError, "init_process_group"),
    ]:
        with pytest.raises(error, match=re.escape(text)):
            FeatureDataLoader(queue, queue.store, **kwargs)

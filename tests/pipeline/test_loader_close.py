"""``FeatureDataLoader.close`` with a prefetch thread stuck in a store or queue call: bounded, reported, lossless.

A store whose ``get`` blocks and a queue whose ``acquire`` blocks (ignoring
its timeout) stand in for a hung shared filesystem or network. ``close``
waits ``close_timeout`` for the thread, then finishes closing and raises
``LoaderCloseTimeout`` naming the call and the leases the thread held; once
the stuck call returns, whatever it obtained goes back to the queue.
"""

from __future__ import annotations

import re
import threading
from typing import Any

import pytest

from featurestream import FeatureDataLoader, LoaderCloseTimeout, LocalFeatureStore, SampleRef, SampleRefQueue
from featurestream.stores.base import StoreHandle
from support.helpers import put_eagle3

from .test_loader_prefetch import WAIT_LIMIT_S, wait_for


class HangingStore(LocalFeatureStore):
    """A store whose ``get`` of ``hang_on`` blocks until ``unblock`` is set (a hung shared filesystem, say)."""

    def __init__(self, hang_on: str) -> None:
        super().__init__()
        self.hang_on = hang_on
        self.entered = threading.Event()
        self.unblock = threading.Event()

    def get(self, ref: SampleRef, device: Any = None) -> tuple[dict[str, Any], StoreHandle]:
        if ref.sample_id == self.hang_on:
            self.entered.set()
            self.unblock.wait(WAIT_LIMIT_S)
        return super().get(ref, device)


class HangingQueue(SampleRefQueue):
    """A queue whose ``acquire`` blocks, whatever its timeout, until ``unblock`` is set (a hung connection)."""

    def __init__(self, store: LocalFeatureStore) -> None:
        super().__init__(store)
        self.entered = threading.Event()
        self.unblock = threading.Event()

    def acquire(self, poll_interval: float = 0.05, *, timeout: float | None = None) -> Any:
        self.entered.set()
        self.unblock.wait(WAIT_LIMIT_S)
        return super().acquire(poll_interval, timeout=timeout)


def prefetch_thread(loader: FeatureDataLoader) -> threading.Thread:
    prefetcher = loader._prefetcher
    assert prefetcher is not None
    return prefetcher._thread


def test_a_store_get_that_blocks_bounds_close_which_names_the_leases_and_loses_nothing() -> None:
    store = HangingStore(hang_on="s1")
    queue = SampleRefQueue(store)
    for index in range(3):
        queue.put(put_eagle3(store, index))
    loader = FeatureDataLoader(queue, store, prefetch=2, close_timeout=0.2)
    next(loader)  # sample 0, held by the trainer; the thread then reads s1 and hangs
    thread = prefetch_thread(loader)
    assert store.entered.wait(WAIT_LIMIT_S)
    stuck = queue.outstanding_count()
    with pytest.raises(LoaderCloseTimeout) as raised:
        loader.close()
    error = raised.value
    assert error.timeout == 0.2 and error.blocked_in == "store.get('s1')"
    assert [lease.ref.sample_id for lease in error.leases] == ["s1"]
    assert stuck == 2, "the trainer's batch and the one being read"
    message = str(error)
    assert "close_timeout=0.2 s" in message and "store.get('s1')" in message
    assert re.search(r"leases it held: 's1' \(lease \d+\)", message), message
    # close did everything else: the trainer's batch acked, the stuck lease given back (unspent), the queue closed.
    stats = queue.stats()
    assert (stats.acked, stats.failed, stats.given_back, stats.outstanding, stats.pending) == (1, 0, 1, 0, 2)
    assert queue.is_closed
    assert store.health().sample_count == 2
    store.unblock.set()
    thread.join(WAIT_LIMIT_S)
    assert not thread.is_alive()
    # The late get's handle was released: both samples are still resident and redelivered, bytes and all.
    store.hang_on = ""
    delivered = sorted(lease.ref.sample_id for lease in iter(lambda: queue.acquire(timeout=0), None))
    assert delivered == ["s1", "s2"]
    assert store.health().sample_count == 2


def test_a_queue_acquire_that_blocks_bounds_close_and_the_late_lease_goes_back() -> None:
    store = LocalFeatureStore()
    queue = HangingQueue(store)
    queue.put(put_eagle3(store, 0))
    loader = FeatureDataLoader(queue, store, prefetch=2, close_timeout=0.1)
    trainer = threading.Thread(target=lambda: next(loader, None))
    trainer.start()
    assert queue.entered.wait(WAIT_LIMIT_S)
    wait_for("the prefetch thread", lambda: loader._prefetcher is not None)
    thread = prefetch_thread(loader)
    with pytest.raises(LoaderCloseTimeout, match=re.escape("blocked in queue.acquire after close_timeout=0.1 s")):
        loader.close()
    trainer.join(WAIT_LIMIT_S)
    assert not trainer.is_alive(), "close woke the trainer waiting for a batch"
    queue.unblock.set()  # the acquire now returns a lease to a closed loader
    thread.join(WAIT_LIMIT_S)
    assert not thread.is_alive()
    stats = queue.stats()
    assert (stats.given_back, stats.outstanding, stats.pending) == (1, 0, 1), "the late lease was given back"
    assert queue.is_closed and store.health().sample_count == 1


def test_a_thread_that_stops_in_time_closes_silently_and_the_default_bound_is_five_seconds() -> None:
    store = LocalFeatureStore()
    queue = SampleRefQueue(store)
    queue.put(put_eagle3(store, 0))
    loader = FeatureDataLoader(queue, store, prefetch=2)
    assert loader.close_timeout == 5.0
    next(loader)
    loader.close()
    assert queue.stats().acked == 1 and queue.is_closed


@pytest.mark.parametrize("value", [-1, float("inf"), "5", True])
def test_a_bad_close_timeout_is_refused(value: object) -> None:
    queue = SampleRefQueue(LocalFeatureStore())
    with pytest.raises(
        ValueError, match=re.escape(f"close_timeout must be a finite number of seconds >= 0, got {value!r}")
    ):
        FeatureDataLoader(queue, queue.store, close_timeout=value)  # type: ignore[arg-type]

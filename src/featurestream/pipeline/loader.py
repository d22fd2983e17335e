"""``FeatureDataLoader``: lease refs from a queue, materialise them, hand out batches."""

from __future__ import annotations

import threading
from types import TracebackType
from typing import Any

from featurestream.core.checks import check_seconds
from featurestream.core.lease import Lease
from featurestream.core.refs import FeatureAlgorithm
from featurestream.pipeline import eagle3
from featurestream.stores.base import FeatureStore, StoreHandle

__all__ = ["FeatureDataLoader"]


class FeatureDataLoader:
    """An iterator of ``Eagle3TargetBatch``es, one leased sample per pull.

    Each pull blocks in ``queue.acquire(timeout=acquire_poll_interval)`` (it
    wakes as soon as a sample is put; no sleeping between polls), validates
    the ref, materialises it with ``store.get`` and returns the batch. The
    batch stays valid through one training step: its handle is released and
    its lease acked on the next pull, or earlier by ``consume_now()``;
    ``fail_current()`` hands it back for redelivery instead. Iteration ends
    when the queue is closed and drained. ``close()`` settles what it holds
    and closes the queue; the loader is a context manager.

    Errors, each leaving nothing leased: a ref of another algorithm -> its
    lease is failed (another consumer may take it) and ``ValueError``; a
    schema-invalid ref -> dropped (acked, never redelivered) and
    ``ValueError``; an error from ``store.get`` -> the lease is failed and the
    error re-raised.
    """

    def __init__(
        self,
        queue: Any,
        store: FeatureStore,
        *,
        algorithm: FeatureAlgorithm | None = None,
        acquire_poll_interval: float = 0.05,
    ) -> None:
        check_seconds("acquire_poll_interval", acquire_poll_interval)
        algorithm = eagle3.require_eagle3(algorithm, "FeatureDataLoader")
        self.queue = queue
        self.store = store
        self.algorithm = algorithm
        self.acquire_poll_interval = acquire_poll_interval
        self._lock = threading.Lock()
        self._held: tuple[Lease, StoreHandle] | None = None
        self._closed = False

    @property
    def current_lease(self) -> Lease | None:
        """The lease of the batch last handed out and not yet settled (e.g. to ``queue.extend`` it)."""
        with self._lock:
            return self._held[0] if self._held is not None else None

    def __iter__(self) -> FeatureDataLoader:
        return self

    def __next__(self) -> eagle3.Eagle3TargetBatch:
        self.consume_now()
        lease = self._acquire()
        ref = lease.ref
        if ref.algorithm is not self.algorithm:
            self.queue.fail(lease)
            raise ValueError(
                f"sample {ref.sample_id!r} is {ref.algorithm.value}, but this loader reads {self.algorithm.value}; "
                "its lease was failed so a matching consumer can take it"
            )
        try:
            eagle3.validate_ref(ref)
        except ValueError as exc:
            self.queue.ack(lease)
            raise ValueError(f"{exc}; the sample was dropped (acked, never redelivered)") from None
        try:
            tensors, handle = self.store.get(ref)
        except Exception:
            self.queue.fail(lease)
            raise
        with self._lock:
            if not self._closed:
                self._held = (lease, handle)
                return eagle3.Eagle3TargetBatch(**tensors)
        # Closed while this pull was in flight: give the sample back untouched.
        self.store.release(handle)
        self.queue.fail(lease)
        raise StopIteration

    def _acquire(self) -> Lease:
        while True:
            with self._lock:
                if self._closed:
                    raise StopIteration
            lease = self.queue.acquire(timeout=self.acquire_poll_interval)
            if lease is not None:
                return lease
            queue = self.queue
            if queue.is_closed and queue.pending_count() == 0 and queue.outstanding_count() == 0:
                raise StopIteration

    def consume_now(self) -> None:
        """Release and ack the batch last handed out now instead of on the next pull."""
        held = self._take_held()
        if held is not None:
            lease, handle = held
            self.store.release(handle)
            self.queue.ack(lease)

    def fail_current(self) -> None:
        """Give the batch last handed out back to the queue (redelivered, or dead once its deliveries are spent)."""
        held = self._take_held()
        if held is not None:
            lease, handle = held
            self.store.release(handle)
            self.queue.fail(lease)

    def close(self) -> None:
        """Settle (ack) what this loader holds and close the queue; idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.consume_now()
        self.queue.close()

    def _take_held(self) -> tuple[Lease, StoreHandle] | None:
        with self._lock:
            held, self._held = self._held, None
            return held

    def __enter__(self) -> FeatureDataLoader:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

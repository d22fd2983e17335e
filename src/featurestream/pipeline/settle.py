"""``Settler``: acks finished batches on a background thread, off the trainer's critical path.

With prefetch on, the batch a trainer stepped on is settled when it pulls the
next one: its store handles released and its leases acked — for a
shared-directory sample that ack scrubs (unlinks) the file, a millisecond or
more. The loader hands that work to a ``Settler`` and returns the next batch
at once; ``flush`` waits until everything handed over is settled.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Sequence

from featurestream.core.lease import Lease
from featurestream.core.protocol import LeaseQueue
from featurestream.pipeline.batching import ack_many
from featurestream.stores.base import FeatureStore, StoreHandle

__all__ = ["Settler"]


class Settler:
    """Releases handles and acks leases on a daemon thread, in submission order; thread-safe.

    An error of a settle is kept and raised (the original exception, once) by
    the next ``check`` or ``flush``; the leases of a failed ack stay out until
    their deadline and are then redelivered, as after any failed ack.
    """

    def __init__(self, queue: LeaseQueue, store: FeatureStore) -> None:
        self._queue = queue
        self._store = store
        self._cond = threading.Condition()
        self._todo: collections.deque[tuple[Sequence[Lease], Sequence[StoreHandle]]] = collections.deque()
        self._busy = False
        self._closed = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="featurestream-settle", daemon=True)
        self._thread.start()

    def submit(self, leases: Sequence[Lease], handles: Sequence[StoreHandle]) -> None:
        """Release ``handles`` and ack ``leases`` soon (at once if this settler is closed)."""
        with self._cond:
            if not self._closed:
                self._todo.append((leases, handles))
                self._cond.notify_all()
                return
        self._settle(leases, handles)

    def check(self) -> None:
        """Raise the error of a settle that failed since the last ``check``/``flush``, if any; never waits."""
        with self._cond:
            error, self._error = self._error, None
        if error is not None:
            raise error

    def flush(self) -> None:
        """Wait until everything submitted is settled, then ``check``."""
        with self._cond:
            while self._todo or self._busy:
                self._cond.wait()
        self.check()

    def close(self) -> None:
        """Settle what is left, stop the thread and raise a pending error; idempotent."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self.flush()

    def _run(self) -> None:
        while True:
            with self._cond:
                while not self._todo and not self._closed:
                    self._cond.wait()
                if not self._todo:
                    return
                leases, handles = self._todo.popleft()
                self._busy = True
            try:
                self._settle(leases, handles)
            except Exception as exc:
                with self._cond:
                    self._error = self._error or exc
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _settle(self, leases: Sequence[Lease], handles: Sequence[StoreHandle]) -> None:
        for handle in handles:
            self._store.release(handle)
        ack_many(self._queue, leases)

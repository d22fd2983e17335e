"""``Operation``: how both queue backends hold their lock around one public call."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Protocol

from featurestream.core.backlog import Outbox, Owed, finish_operation
from featurestream.stores.base import FeatureStore

__all__ = ["Operated", "Operation", "observing"]


class Operated(Protocol):
    """The queue state an ``Operation`` works on."""

    _store: FeatureStore
    _lock: threading.Lock
    _owed: Owed
    _outbox: Outbox

    def _pay_owed(self) -> None: ...

    def _store_fault(self, call: str, sample_id: str | None, exc: BaseException) -> None: ...


class Operation:
    """``with queue._op:`` -- hold the queue's lock for the body, after retrying owed store calls; then, even if
    the body (or that retry) raised, release it and run the callbacks queued meanwhile and the store's gc
    outside it (``backlog.finish_operation``).

    One reusable object per queue rather than a generator context manager: every queue call enters one, and
    this costs a fraction of ``contextlib.contextmanager``'s frame and generator. Thread-safe: it keeps no
    state of its own, and what it touches it touches under the queue's lock.
    """

    __slots__ = ("_queue",)

    def __init__(self, queue: Operated) -> None:
        self._queue = queue

    def __enter__(self) -> None:
        queue = self._queue
        queue._lock.acquire()
        if queue._owed:
            try:
                queue._pay_owed()
            except BaseException:
                self.__exit__()
                raise

    def __exit__(self, *exc_info: object) -> None:
        queue = self._queue
        outbox, queue._outbox = queue._outbox, []
        queue._lock.release()
        finish_operation(outbox, queue._store, queue._lock, queue._store_fault)


@contextlib.contextmanager
def observing(queue: Operated) -> Iterator[None]:
    """``with observing(queue):`` -- hold the queue's lock for a read-only body, after retrying owed store calls
    (as every call does); no callbacks and no gc, since a read queues none and frees nothing."""
    with queue._lock:
        if queue._owed:
            queue._pay_owed()
        yield

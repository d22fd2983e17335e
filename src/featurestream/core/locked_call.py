"""``LockedCall``: how the coordinator holds its lock around one public call."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator

from featurestream.core.backlog import Outbox, Owed, StoreFault, run_deferred
from featurestream.stores.base import FeatureStore

__all__ = ["LockedCall"]


class LockedCall:
    """``with queue._op:`` -- hold ``lock`` for the body, after retrying owed store calls (``pay_owed``, when
    ``owed`` is not empty); then, even if the body (or that retry) raised, release it and run the callbacks the
    body ``defer``red (``backlog.run_deferred``) and ``store``'s gc outside it; a ``gc`` that raises is reported
    to ``on_fault`` (under ``lock``) and ignored.

    One reusable object per queue rather than a generator context manager: every queue call enters one, and
    this costs a fraction of ``contextlib.contextmanager``'s frame and generator. Thread-safe: what it keeps
    (the deferred callbacks) it touches under ``lock``.
    """

    __slots__ = ("_lock", "_on_fault", "_outbox", "_owed", "_pay_owed", "_store")

    def __init__(
        self, lock: threading.Lock, store: FeatureStore, owed: Owed, pay_owed: Callable[[], None], on_fault: StoreFault
    ) -> None:
        self._lock = lock
        self._store = store
        self._owed = owed
        self._pay_owed = pay_owed
        self._on_fault = on_fault
        self._outbox: Outbox = []

    def __enter__(self) -> None:
        self._lock.acquire()
        if self._owed:
            try:
                self._pay_owed()
            except BaseException:
                self.__exit__()
                raise

    def __exit__(self, exc_type: object = None, exc: object = None, traceback: object = None) -> None:
        outbox = self._outbox
        if outbox:  # rarely: a dead letter's callback, a backpressure step
            self._outbox = []
            self._lock.release()
            run_deferred(outbox)
        else:
            self._lock.release()
        try:
            self._store.gc()
        except Exception as exc:
            with self._lock:
                self._on_fault("gc", None, exc)

    def defer(self, callback: Callable[..., None], argument: object) -> None:
        """Run ``callback(argument)`` once this operation has released the lock (lock held)."""
        self._outbox.append((callback, argument))

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """``with queue._op.reading():`` -- hold the lock for a read-only body, after retrying owed store calls
        (as every call does); no callbacks and no gc, since a read queues none and frees nothing."""
        with self._lock:
            if self._owed:
                self._pay_owed()
            yield

"""The loader's background machinery: a book of leases held for the trainer, and a prefetch thread.

``LeaseBook`` holds every lease a loader has leased but not yet handed to the
trainer (prefetched, being materialised, waiting for the other ranks), keeps
them alive with ``extend`` heartbeats, and fails them all back on ``close``.
``Prefetcher`` runs a pull function on a background thread into a bounded
FIFO; if the thread dies, everything it holds is failed back and the error
is raised to the consumer on its next ``get``. Its ``close`` waits a bounded
time for the thread and reports a thread that is still blocked
(``LoaderCloseTimeout``).
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from featurestream.backends.memory.queue import LeaseLost
from featurestream.common.errors import FeatureStreamError
from featurestream.core.lease import Lease
from featurestream.core.protocol import LeaseQueue
from featurestream.pipeline.batching import give_back_many
from featurestream.stores.base import FeatureStore, StoreHandle

__all__ = ["LeaseBook", "LoaderCloseTimeout", "Prefetcher", "Pulled", "Stuck", "give_back"]

# How leases go back to the queue: ``give_back_many`` (unused) or ``fail_many`` (tried, and failed).
Settle = Callable[[LeaseQueue, Sequence[Lease]], None]


class LoaderCloseTimeout(FeatureStreamError, TimeoutError):
    """``FeatureDataLoader.close`` gave up waiting for its prefetch thread, blocked in a queue or store call.

    Raised after everything else was closed. ``leases`` are the leases the
    thread held (failed back for redelivery; one the queue could not take
    back is reclaimed at its deadline), ``blocked_in`` the call it is stuck
    in, ``timeout`` the ``close_timeout`` it was given. Nothing is lost: a
    lease the blocked call still returns is failed back when it returns.
    """

    def __init__(self, timeout: float, blocked_in: str, leases: Sequence[Lease]) -> None:
        self.timeout = timeout
        self.blocked_in = blocked_in
        self.leases = tuple(leases)
        held = ", ".join(f"{lease.ref.sample_id!r} (lease {lease.lease_id})" for lease in self.leases) or "none"
        super().__init__(
            f"FeatureDataLoader.close: the prefetch thread is still blocked in {blocked_in} after "
            f"close_timeout={timeout} s; leases it held: {held} (failed back for redelivery; a lease the queue "
            "could not take back is reclaimed at its deadline, and one the blocked call still returns is failed "
            "back when it returns)"
        )


@dataclasses.dataclass(frozen=True)
class Stuck:
    """A prefetch thread ``close`` stopped waiting for: the call it is blocked in, the leases it held."""

    blocked_in: str
    leases: list[Lease]


@dataclasses.dataclass
class Pulled:
    """One pull: the batch built from ``leases`` (holding ``handles``), or the error the pull raised.

    ``ready`` is a CUDA event recorded after non-blocking copies, for the
    consumer's stream to wait on before the batch is used (``None`` otherwise).
    """

    leases: list[Lease]
    handles: list[StoreHandle]
    batch: Any = None
    error: BaseException | None = None
    ready: Any = None


@dataclasses.dataclass
class _Entry:
    lease: Lease
    handle: StoreHandle | None = None
    lost: bool = False


class LeaseBook:
    """Leases held on the trainer's behalf but not handed over yet; thread-safe.

    With ``heartbeat`` a daemon thread ``extend``s every booked lease each
    ``interval`` seconds (default: a third of the shortest visibility timeout
    among them), so a slow training step never gets them reclaimed; a lease
    found lost (``LeaseLost``) is marked and reported by ``take``/``any_lost``;
    any other heartbeat error goes to ``on_error`` (set it before the first
    ``add``). ``close`` refuses further entries, releases every handle and
    fails every lease back.
    """

    def __init__(
        self, queue: LeaseQueue, store: FeatureStore, *, heartbeat: bool, interval: float | None = None
    ) -> None:
        self._queue = queue
        self._store = store
        self._interval = interval
        self.on_error: Callable[[BaseException], None] | None = None
        self._cond = threading.Condition()
        self._entries: dict[int, _Entry] = {}
        self._closed = False
        # A reference-era queue has no extend(): its booked leases then live on their visibility timeout alone.
        self._heartbeat = heartbeat and callable(getattr(queue, "extend", None))
        self._thread: threading.Thread | None = None

    def add(self, lease: Lease) -> bool:
        """Book ``lease``; ``False`` once closed (the caller then fails it back itself)."""
        with self._cond:
            if self._closed:
                return False
            self._entries[id(lease)] = _Entry(lease)
            if self._heartbeat and self._thread is None:
                self._thread = threading.Thread(target=self._beat, name="featurestream-heartbeat", daemon=True)
                self._thread.start()
            self._cond.notify_all()
            return True

    def attach(self, lease: Lease, handle: StoreHandle) -> bool:
        """Record the store handle of a booked lease; ``False`` if it is gone (closed: the caller releases it)."""
        with self._cond:
            entry = self._entries.get(id(lease))
            if entry is None:
                return False
            entry.handle = handle
            return True

    def forget(self, lease: Lease) -> None:
        """Drop ``lease`` without settling it (the caller settles it and releases its handle)."""
        with self._cond:
            self._entries.pop(id(lease), None)

    def any_lost(self, leases: Sequence[Lease]) -> bool:
        """Whether a heartbeat found one of ``leases`` no longer live."""
        with self._cond:
            return any(self._entries[id(lease)].lost for lease in leases if id(lease) in self._entries)

    def take(self, leases: Sequence[Lease]) -> list[Lease]:
        """Hand ``leases`` over to the trainer (unbook them); return those a heartbeat found lost."""
        with self._cond:
            entries = [self._entries.pop(id(lease), None) for lease in leases]
        return [entry.lease for entry in entries if entry is not None and entry.lost]

    def give_back(
        self, leases: Sequence[Lease], handles: Sequence[StoreHandle], settle: Settle = give_back_many
    ) -> None:
        """Unbook ``leases``, release ``handles`` and hand the leases back unused (``settle``: how)."""
        with self._cond:
            for lease in leases:
                self._entries.pop(id(lease), None)
        give_back(self._queue, self._store, leases, handles, settle)

    def count(self) -> int:
        with self._cond:
            return len(self._entries)

    def close(self, keep: Sequence[Lease] = ()) -> list[Lease]:
        """Refuse new entries, stop the heartbeat, release every handle, give every lease back and return them.

        ``keep``: leases whose batch is on its way to the trainer; they stay booked (with their handles) for
        ``take``. Idempotent (a second call returns only what ``keep`` kept and was not taken since).
        """
        kept = {id(lease) for lease in keep}
        with self._cond:
            self._closed = True
            entries = [entry for key, entry in self._entries.items() if key not in kept]
            self._entries = {key: entry for key, entry in self._entries.items() if key in kept}
            self._cond.notify_all()
        handles = [entry.handle for entry in entries if entry.handle is not None]
        leases = [entry.lease for entry in entries]
        give_back(self._queue, self._store, leases, handles)
        return leases

    def _beat(self) -> None:
        while True:
            with self._cond:
                while not self._closed and not self._entries:
                    self._cond.wait()
                if self._closed:
                    return
                interval = self._interval
                if interval is None:
                    interval = min(e.lease.visibility_timeout.seconds for e in self._entries.values()) / 3
                due = time.monotonic() + interval
                while not self._closed and (remaining := due - time.monotonic()) > 0:
                    self._cond.wait(remaining)  # add() notifies too: only close() cuts the interval short
                if self._closed:
                    return
                leases = [entry.lease for entry in self._entries.values()]
            for lease in leases:
                try:
                    self._queue.extend(lease)
                except LeaseLost:
                    with self._cond:
                        entry = self._entries.get(id(lease))
                        if entry is not None:
                            entry.lost = True
                except Exception as exc:
                    if self.on_error is not None:
                        self.on_error(exc)
                    return


def give_back(
    queue: LeaseQueue,
    store: FeatureStore,
    leases: Sequence[Lease],
    handles: Sequence[StoreHandle],
    settle: Settle = give_back_many,
) -> None:
    """Release ``handles`` and hand ``leases`` back with ``settle`` (unused: no delivery counted), best effort.

    Called on close and crash paths: if the queue itself is what broke, the
    leases stay out until their deadline and the queue reclaims them, so
    nothing is lost either way.
    """
    for handle in handles:
        try:
            store.release(handle)
        except Exception:  # a store that cannot release still scrubs the sample once settled
            pass
    if leases:
        try:
            settle(queue, leases)
        except Exception:  # unsettled leases are reclaimed at their deadline
            pass


class Prefetcher:
    """Runs ``pull`` on a daemon thread, keeping up to ``depth`` pulled items ahead, in FIFO order.

    ``pull(stopping)`` returns the next ``Pulled`` (its leases booked in
    ``book``) or ``None`` at the end of the stream, and returns promptly once
    ``stopping()`` is true unless a queue or store call blocks it;
    ``activity()`` names the call the pull is in (for ``close`` to report).
    After an error item it pulls again only on the consumer's ``get`` that
    follows the one that took the error. ``get``
    blocks for the next item; it returns ``None`` at the end of the stream or
    once closed, and raises the thread's error after the thread died
    (everything it held already failed back).
    """

    def __init__(
        self,
        pull: Callable[[Callable[[], bool]], Pulled | None],
        book: LeaseBook,
        depth: int,
        activity: Callable[[], str],
    ) -> None:
        self._pull = pull
        self._activity = activity
        self._book = book
        self._depth = depth
        self._cond = threading.Condition()
        self._items: collections.deque[Pulled] = collections.deque()
        self._ended = False
        self._paused = False
        self._stopped = False
        self._error: BaseException | None = None
        # The leases of the batch ``get`` returned last: the trainer's from then on, not the thread's to give back.
        self._handing: Sequence[Lease] = ()
        book.on_error = self.crash  # a heartbeat that cannot reach the queue stops the thread like its own error
        self._thread = threading.Thread(target=self._run, name="featurestream-prefetch", daemon=True)
        self._thread.start()

    def get(self) -> Pulled | None:
        """The next item (its leases still booked: ``book.take`` them at hand-off), or ``None`` at the end."""
        with self._cond:
            self._handing = ()
            if self._paused and not any(queued.error is not None for queued in self._items):
                self._paused = False  # the error was taken by the previous get: pull on
                self._cond.notify_all()
            while not (self._items or self._ended or self._stopped or self._error is not None):
                self._cond.wait()
            if self._error is not None:
                raise self._error
            if self._items:
                item = self._items.popleft()
                self._handing = item.leases
                self._cond.notify_all()
                return item
            return None

    def crash(self, error: BaseException) -> None:
        """Stop with ``error`` (raised by the next ``get``) and fail back everything held but the batch the last
        ``get`` returned (the trainer is being handed it)."""
        with self._cond:
            if self._error is None and not self._stopped:
                self._error = error
            self._stop_locked()
            handing = self._handing
        self._book.close(keep=handing)

    def close(self, timeout: float) -> Stuck | None:
        """Stop the thread and fail back everything it holds; idempotent.

        Waits up to ``timeout`` seconds for the current pull to return; if it
        is still blocked then, returns what it is blocked in and the leases it
        held (failed back all the same), else ``None``.
        """
        with self._cond:
            self._stop_locked()
        blocked_in = None
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)
            if self._thread.is_alive():
                blocked_in = self._activity()
        leases = self._book.close()
        return None if blocked_in is None else Stuck(blocked_in, leases)

    def _stop_locked(self) -> None:
        self._stopped = True
        self._items.clear()  # their leases are booked: book.close() fails them back
        self._cond.notify_all()

    def _stopping(self) -> bool:
        with self._cond:
            return self._stopped

    def _run(self) -> None:
        try:
            while True:
                with self._cond:
                    # After an error it waits for the trainer's pull that follows the error, so a failing sample's
                    # redeliveries are not burnt ahead of the trainer (the settles of pulling on its own thread).
                    while (len(self._items) >= self._depth or self._paused) and not self._stopped:
                        self._cond.wait()
                    if self._stopped:
                        return
                item = self._pull(self._stopping)
                with self._cond:
                    if item is None:
                        self._ended = True
                    elif not self._stopped:
                        self._items.append(item)
                        self._paused = item.error is not None
                    self._cond.notify_all()
                    if item is None:
                        return
        except BaseException as exc:  # the trainer gets it on its next pull
            self.crash(exc)

"""The front end every queue backend shares: argument checks, the lock, owed store calls, backpressure, callbacks.

A backend is a subclass that implements the engine methods below (where its state lives and how it changes);
everything a caller of ``LeaseQueue`` sees besides those -- the checks and errors, the owed-call backlog and
its retries, the reaper, the backpressure loop of ``put_blocks_until_below``, callbacks and store-fault
tracing -- is written once here. ``docs/architecture.md`` shows the split.

Engine methods, each backend's own (called with the lock held unless noted):

- ``_admit(ref, health, *, if_idle) -> bool``: retain and enqueue one ref, or raise what ``put`` raises;
  ``if_idle``: only into a queue that holds nothing (``False``: it did not, nothing changed);
- ``_put_round(ref) -> bool``: a producer's round before it reads health: reap, raise ``QueueClosed`` when
  closed, and say whether the queue holds any sample;
- ``_lease_up_to(n, wait) -> list[Lease]`` (takes the lock itself: it waits);
- ``_trace_state(action, **fields)``: trace ``action`` with the queue state the engine last knew;
- ``_count_pause()``: count a producer pause in the queue's stats;
- ``lifecycle_state``, and the public calls whose body is the engine's: ``put``, ``put_many``, ``ack`` /
  ``fail`` (and their batches), ``extend``, ``reclaim_expired``, ``close``, the dead-letter repair, ``stats``
  and the counts.

Hooks with a default here, which a backend overrides where it differs: ``_require_store``, ``_put_flowing``,
``_after_health_fault``, ``_scrubbing`` and ``_all_paid``.
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from typing import Any

from featurestream.core import errors, events
from featurestream.core.arguments import check_queue_arguments, check_ref_for, check_resident
from featurestream.core.backlog import Outbox, Owed, call_or_owe, pay_owed
from featurestream.core.backpressure import Backpressure, HealthCallback
from featurestream.core.checks import check_count, check_seconds
from featurestream.core.lease import DeadLetter, Lease, VisibilityTimeout
from featurestream.core.operation import Operation
from featurestream.core.refs import SampleRef
from featurestream.stores.base import FeatureStore, StoreHealth

__all__ = ["FrontEnd", "Signal", "Tracer"]

logger = logging.getLogger(__name__)

Tracer = Callable[[str, dict[str, object]], None]


class Signal:
    """A condition of the queue's lock that notifies only when someone waits on it.

    ``threading.Condition.notify`` checks lock ownership and walks its waiters on every call, and the queue
    signals on every put and settle, nearly always with nobody waiting. ``_waiting`` is read and changed only
    under the queue's lock (``Condition.wait`` re-acquires it before returning or raising).
    """

    __slots__ = ("_condition", "_waiting")

    def __init__(self, lock: threading.Lock) -> None:
        self._condition = threading.Condition(lock)
        self._waiting = 0

    def wait(self, timeout: float) -> None:
        self._waiting += 1
        try:
            self._condition.wait(timeout)
        finally:
            self._waiting -= 1

    def notify(self) -> None:
        if self._waiting:
            self._condition.notify()

    def notify_all(self) -> None:
        if self._waiting:
            self._condition.notify_all()


class FrontEnd:
    """The shared half of every ``LeaseQueue`` backend (see the module docstring for the engine's half)."""

    # Most items one batch call takes (None: no cap); a backend whose batch is one server call caps it.
    _max_batch: int | None = None

    def _init_front_end(
        self,
        store: FeatureStore,
        visibility_timeout: VisibilityTimeout | None,
        high_watermark_bytes: int | None,
        low_watermark_bytes: int | None,
        on_pause: HealthCallback | None,
        on_resume: HealthCallback | None,
        *,
        max_deliveries: int,
        dedup_window: int,
        on_dead_letter: Callable[[DeadLetter], None] | None,
        tracer: Tracer | None,
        keep_dead_letter_bytes: int,
        reaper_interval: float | None,
    ) -> None:
        """Check the constructor's shared arguments (``TypeError`` / ``ValueError`` naming the first bad one) and
        set up the shared state; the backend starts its reaper once its engine is ready."""
        check_queue_arguments(
            store,
            visibility_timeout,
            high_watermark_bytes,
            low_watermark_bytes,
            max_deliveries=max_deliveries,
            dedup_window=dedup_window,
            keep_dead_letter_bytes=keep_dead_letter_bytes,
            reaper_interval=reaper_interval,
        )
        self._store = store
        self._vt = visibility_timeout or VisibilityTimeout()
        self._on_dead_letter = on_dead_letter
        self.max_deliveries = max_deliveries
        self.dedup_window = dedup_window
        self._tracer = tracer
        self._lock = threading.Lock()
        # Wakes producers blocked on backpressure: a settle, a paid scrub, a close.
        self._not_full = Signal(self._lock)
        self._outbox: Outbox = []
        self._backpressure = Backpressure(high_watermark_bytes, low_watermark_bytes, on_pause, on_resume)
        # sample id -> (store call, ref) the queue still owes its store: a scrub or unretain that raised.
        self._owed: Owed = collections.OrderedDict()
        self._store_errors = 0
        self._reaper_stop = threading.Event()
        self._op = Operation(self)  # every public call: ``with self._op:``

    # -- producer side ----------------------------------------------------
    def put_blocks_until_below(
        self,
        ref: SampleRef,
        poll_interval: float = 0.05,
        abort_when: Callable[[], bool] | None = None,
    ) -> None:
        """Enqueue ``ref``, first waiting while this producer is paused by its store's backpressure.

        Hysteresis on this instance's store ``health()``: pause at/above the high watermark, resume at/below
        the low one, keep the state inside the band (``on_pause``/``on_resume`` run on each transition); a store
        at its sample-count cap (``max_samples``) pauses too, until a sample leaves, so the producer's next
        ``store.put`` finds room. A paused producer still enqueues when the queue holds nothing (no sample
        pending or leased, by any instance): then nothing the queue does can lower residency, and waiting could
        last forever -- so any number of producers, whatever they hold unqueued, always make progress.
        Residency bound this keeps: the bytes the queue holds (pending + leased) stay below the high watermark,
        or are one sample when it was admitted into an empty queue; the store's resident bytes are at most that
        plus what producers hold unqueued plus settled samples whose scrub is still owed
        (``stats().scrub_backlog``). ``put`` (non-blocking) is not bounded by backpressure.

        Wakes on every settle this instance makes and every close it makes, and at least every
        ``poll_interval`` seconds to re-check the store and ``abort_when`` (settles and closes elsewhere show
        then). Raises ``QueueClosed`` when the queue is closed (also while waiting: ``close`` wakes every
        blocked producer), ``PutAborted`` when ``abort_when()`` is true (both ``RuntimeError``), and the store's
        error type, naming the sample, when ``health()`` raises; in every such case nothing was enqueued.
        """
        self._check_ref(ref)
        check_seconds("poll_interval", poll_interval)
        while True:
            if abort_when is not None and abort_when():
                raise errors.PutAborted(ref.sample_id)
            with self._op:
                if self._put_flowing(ref):
                    return
                holds_any = self._put_round(ref)
                health = self._read_health(ref)
                callback = self._update_backpressure(health)
                if callback is not None:
                    self._outbox.append((callback, health))
                    continue
                if self._backpressure.state == "flowing":
                    self._admit(ref, health)
                    return
                # Paused: an empty queue admits the sample all the same (the engine checks, atomically).
                if not holds_any and self._admit(ref, health, if_idle=True):
                    return
                self._not_full.wait(poll_interval)

    # -- consumer side ----------------------------------------------------
    def acquire(self, poll_interval: float = 0.05, *, timeout: float | None = None) -> Lease | None:
        """Lease the next ref, waiting up to ``timeout`` (default ``poll_interval``) seconds.

        Wakes as soon as a sample becomes available (put, fail, reclaim). Returns ``None`` when the wait ends
        empty-handed; ``is_closed`` tells a transient empty poll from a closed, drained queue (which returns at
        once).
        """
        wait = poll_interval if timeout is None else timeout
        check_seconds("timeout" if timeout is not None else "poll_interval", wait)
        leases = self._lease_up_to(1, wait)
        return leases[0] if leases else None

    def acquire_many(self, n: int, *, timeout: float | None = None) -> list[Lease]:
        """Lease up to ``n`` refs, FIFO, waiting up to ``timeout`` (default 0.05) seconds for the first.

        Returns as soon as at least one is available, with every one available then (up to ``n``); ``[]`` when
        the wait ends empty-handed or the queue is drained. Traced as one ``Acquire`` per lease.
        """
        check_count("n", n, minimum=1)
        if self._max_batch is not None and n > self._max_batch:
            raise ValueError(f"n must be at most {self._max_batch} (one server call), got {n!r}")
        wait = 0.05 if timeout is None else timeout
        check_seconds("timeout", wait)
        return self._lease_up_to(n, wait)

    # -- introspection ------------------------------------------------------
    @property
    def store(self) -> FeatureStore:
        """The store this instance retains and scrubs in."""
        return self._store

    @property
    def is_closed(self) -> bool:
        """Whether ``close`` was called (not whether the queue is drained yet)."""
        return self.lifecycle_state != "open"

    @property
    def backpressure_state(self) -> str:
        """This producer's ``flowing`` or ``paused``."""
        return self._backpressure.state

    # -- shared internals (lock held) -----------------------------------------
    def _check_ref(self, ref: object) -> None:
        self._require_store()
        check_ref_for(self._store, ref)

    def _check_resident(self, ref: SampleRef) -> None:
        """Refuse a ref whose bytes are gone (``NotResident``): a consumer's ``get`` would fail on it."""
        check_resident(self._store, ref)

    def _require_store(self) -> None:
        """Raise when this instance cannot produce or consume (a backend's handle without a store)."""

    def _put_flowing(self, ref: SampleRef) -> bool:
        """A backend whose put reaps on its own may admit a flowing producer's sample before the round; ``True``:
        it did."""
        return False

    def _read_health(self, ref: SampleRef) -> StoreHealth:
        try:
            return self._store.health()
        except Exception as exc:
            self._store_fault("health", ref.sample_id, exc)
            self._after_health_fault()
            doing = f"put_blocks_until_below of sample {ref.sample_id!r} enqueued nothing"
            raise errors.store_error(exc, doing) from exc

    def _after_health_fault(self) -> None:
        """What a round that read no health still owes the queue (a backend that reaps in its put reaps here)."""

    def _update_backpressure(self, health: StoreHealth) -> HealthCallback | None:
        """Apply the hysteresis; return the callback to run (outside the lock), if any."""
        step = self._backpressure.step(health)
        if step is None:
            return None
        event, callback = step
        if event == events.PAUSE:
            self._count_pause()
        self._trace_state(event, resident_bytes=health.resident_bytes)
        return callback

    def _scrub(self, ref: SampleRef) -> None:
        """The queue is done with ``ref`` for good: its store scrubs it now, or the scrub is owed."""
        self._scrubbing(ref)
        if self._owe("scrub", ref):
            self._not_full.notify_all()

    def _scrubbing(self, ref: SampleRef) -> None:
        """What a backend forgets about a sample its store is about to scrub."""

    def _owe(self, call: str, ref: SampleRef) -> bool:
        """Make the store call ``call(ref)``; if it raises, log, count and keep it owed. ``True``: done."""
        return call_or_owe(self._store, self._owed, call, ref, self._store_fault)

    def _pay_owed(self) -> None:
        """Retry owed scrubs/unretains (``backlog.pay_owed``)."""
        pay_owed(self._store, self._owed, self._store_fault, self._paid)
        if not self._owed:
            self._all_paid()

    def _all_paid(self) -> None:
        """Nothing is owed any more (a backend that knows it is drained stops its reaper here)."""

    def _paid(self, sample_id: str, call: str) -> None:
        self._trace_state(events.SCRUB_RETRIED, sample_id=sample_id, call=call)
        self._not_full.notify_all()

    def _store_fault(self, call: str, sample_id: str | None, exc: BaseException) -> None:
        self._store_errors += 1
        logger.warning("store %s(%r) raised %r; the queue carries on", call, sample_id, exc, exc_info=exc)
        self._trace_state(events.STORE_FAULT, call=call, sample_id=sample_id, error=repr(exc))

    def _reaper_finished(self) -> bool:
        """Whether the reaper thread has nothing left to do: drained, and no store call owed."""
        return self.lifecycle_state == "drained" and not self._owed

    # -- the engine's half (see the module docstring) ----------------------------
    @property
    def lifecycle_state(self) -> str:
        raise NotImplementedError

    def _admit(self, ref: SampleRef, health: StoreHealth | None = None, *, if_idle: bool = False) -> bool:
        raise NotImplementedError

    def _put_round(self, ref: SampleRef) -> bool:
        raise NotImplementedError

    def _lease_up_to(self, n: int, wait: float) -> list[Any]:
        raise NotImplementedError

    def _trace_state(self, action: str, **fields: object) -> None:
        raise NotImplementedError

    def _count_pause(self) -> None:
        raise NotImplementedError

"""What the coordinator does besides answering a call: the effects of the engine's events, the store calls it
owes, its own trace events (a store fault, a paid scrub, a backpressure step), and the reaper's round.

``Effects`` is the half of ``Coordinator`` (``core/coordinator.py``) that runs under the queue's lock while the
engine reports: for each event it fires the lease machine on the event's model (a trigger the table does not
allow raises ``IllegalTransition``), traces it, scrubs the bytes the queue is done with or owes the store that
call, queues ``on_dead_letter`` and wakes blocked producers.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from featurestream.common.refs import SampleRef
from featurestream.core import events
from featurestream.core.backlog import Owed, call_or_owe, pay_owed
from featurestream.core.backpressure import Backpressure, HealthCallback
from featurestream.core.engine import (
    Admitted,
    Closed,
    DeadLettered,
    DedupRefused,
    Drained,
    Engine,
    Event,
    Extended,
    Leased,
    Purged,
    Reclaimed,
    Released,
    Requeued,
    Settled,
    Stale,
)
from featurestream.core.lease import DeadLetter, StaleLog
from featurestream.core.locked_call import LockedCall
from featurestream.core.machines import LEASE_MACHINE, fire
from featurestream.core.signal import Signal
from featurestream.stores.base import FeatureStore, StoreHealth

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["Effects", "Tracer"]

logger = logging.getLogger(__name__)

Tracer = Callable[[str, dict[str, object]], None]


class Effects:
    """The coordinator's effects (lock held unless a method says otherwise); ``Coordinator`` sets the state."""

    _engine: Engine
    _backpressure: Backpressure
    _store: FeatureStore
    _lock: threading.Lock
    _op: LockedCall
    _owed: Owed
    _store_errors: int
    _tracer: Tracer | None
    _not_full: Signal
    _stale_log: StaleLog
    _on_dead_letter: Callable[[DeadLetter], None] | None
    _drained: bool
    _reaper_stop: threading.Event
    lifecycle_state: str
    reclaim_expired: Callable[[], int]

    def _scrub(self, ref: SampleRef) -> None:
        """The queue is done with ``ref`` for good: its store scrubs it now, or the scrub is owed. The event that
        asked for it wakes blocked producers."""
        call_or_owe(self._store, self._owed, "scrub", ref, self._store_fault)

    def _owe(self, call: str, ref: SampleRef) -> bool:
        """Make the store call ``call(ref)``; if it raises, log, count and keep it owed. ``True``: done."""
        return call_or_owe(self._store, self._owed, call, ref, self._store_fault)

    def _pay_owed(self) -> None:
        """Retry owed scrubs/unretains (``backlog.pay_owed``)."""
        pay_owed(self._store, self._owed, self._store_fault, self._paid)
        if not self._owed and self._drained:
            self._reaper_stop.set()

    def _paid(self, sample_id: str, call: str) -> None:
        self._trace_state(events.SCRUB_RETRIED, sample_id=sample_id, call=call)
        self._not_full.notify_all()

    def _store_fault(self, call: str, sample_id: str | None, exc: BaseException) -> None:
        self._store_errors += 1
        logger.warning("store %s(%r) raised %r; the queue carries on", call, sample_id, exc, exc_info=exc)
        self._trace_state(events.STORE_FAULT, call=call, sample_id=sample_id, error=repr(exc))

    def _reaper_round(self) -> bool:
        """One round of the reaper thread; ``False`` once it has nothing left to do (drained, nothing owed)."""
        try:
            self._reclaim_orphans()
        except Exception:  # a sweep that fails (the directory gone, the master unreachable) must not stop reaping
            logger.exception("the orphan sweep of %s raised; the reaper carries on", self._store.store_uri)
        if self.lifecycle_state == "drained" and not self._owed:
            self._sweep_drained()
            return False
        self.reclaim_expired()
        return True

    def _reclaim_orphans(self, *, force: bool = False) -> int:
        """Have the store free dead writers' bytes this queue does not hold (``FeatureStore.reclaim_orphans``)."""
        return self._store.reclaim_orphans(self._holds_or_dead, force=force)

    def _sweep_drained(self) -> None:
        """Once the queue is closed and drained no enqueue can land any more: the store then frees what writers no
        longer alive left, without the grace period (``FeatureStore.reclaim_orphans(drained=True)``). A failure
        (of the sweep, or of the read of the queue's state) is logged."""
        try:
            if self.lifecycle_state == "drained":
                self._store.reclaim_orphans(self._holds_or_dead, force=True, drained=True)
        except Exception:
            logger.exception("the drained sweep of %s raised; what it left waits for the orphan reclaim", self._store)

    def _holds_or_dead(self, sample_ids: Sequence[str]) -> set[str]:
        """Which of ``sample_ids`` this queue holds: pending, leased, or dead letters (whose bytes may be kept).
        Not ``_holds``, which the training ledger asks and which counts no dead letter."""
        with self._lock:
            held = self._engine.held(sample_ids)
            dead = {letter.ref.sample_id for letter in self._engine.dead_letters(None)}
        return held | (dead & set(sample_ids))

    def _update_backpressure(self, health: StoreHealth) -> HealthCallback | None:
        """Apply the hysteresis to ``health`` (counting and tracing a pause or resume); return the callback to run
        outside the lock, if any."""
        step = self._backpressure.step(health)
        if step is None:
            return None
        event, callback = step
        if event == events.PAUSE:
            self._engine.count_pause()
        self._trace_state(event, resident_bytes=health.resident_bytes)
        return callback

    def _trace_state(self, action: str, **fields: object) -> None:
        """Trace an event the coordinator makes itself (a store fault, a paid scrub, a pause or resume) with the
        queue state as the engine knows it."""
        if self._tracer is not None:
            self._tracer(action, {**fields, **self._engine.trace_state()})

    # -- applying the engine's events (lock held) --------------------------------------------
    def _report(self, event: Event) -> None:
        """Apply one event the engine reports (see ``core/engine.py``), as it happens.

        Every sample's lifecycle reports a ``Leased`` and a ``Settled``: those two are applied here, every other
        event by its ``_on_*`` handler through ``_APPLY``.
        """
        kind = type(event)
        if kind is Leased:
            fire(LEASE_MACHINE, "lease", event.model)
            if event.trace is not None:
                self._trace(events.ACQUIRE, event.trace)
        elif kind is Settled:
            fire(LEASE_MACHINE, event.trigger, event.model)
            if event.trace is not None:
                self._trace(events.TRIGGER_EVENTS[event.trigger], event.trace)
            if event.retried and event.trigger == "fail" and self._tracer is not None:
                self._tracer(events.DEAD_LETTER, {"sample_id": event.model.sample_id})
            if event.scrub is not None:
                self._scrub(event.scrub)
            if self._not_full.waiting:  # Signal's own test, read here as its docstring asks of hot paths
                self._not_full.notify_all()
        else:
            _APPLY[kind](self, event)

    def _trace(self, action: str, trace: object) -> None:
        if trace is not None and self._tracer is not None:
            self._tracer(action, trace)  # type: ignore[arg-type]

    def _on_admitted(self, event: Admitted) -> None:
        self._trace(events.PUT, event.trace)

    def _on_dedup_refused(self, event: DedupRefused) -> None:
        self._trace(events.DEDUP_REFUSED, event.trace)

    def _on_extended(self, event: Extended) -> None:
        fire(LEASE_MACHINE, "extend", event.model)
        self._trace(events.EXTEND, event.trace)

    def _on_reclaimed(self, event: Reclaimed) -> None:
        fire(LEASE_MACHINE, "reclaim", event.model)
        self._trace(events.RECLAIM, event.trace)

    def _on_dead_lettered(self, event: DeadLettered) -> None:
        self._trace(events.DEAD_LETTER, event.trace)
        if self._on_dead_letter is not None:
            self._op.defer(self._on_dead_letter, event.letter)
        if not event.kept:
            self._scrub(event.letter.ref)
        self._not_full.notify_all()

    def _on_stale(self, event: Stale) -> None:
        if event.lease is not None:
            self._stale_log.rejected(event.op, event.lease, event.why)
        self._trace(events.STALE_REJECTED, event.trace)

    def _on_released(self, event: Released) -> None:
        self._scrub(event.ref)
        self._not_full.notify_all()

    def _on_requeued(self, event: Requeued) -> None:
        self._trace(events.REQUEUE_DEAD_LETTER, event.trace)

    def _on_purged(self, event: Purged) -> None:
        self._trace(events.PURGE_DEAD_LETTER, event.trace)

    def _on_closed(self, event: Closed) -> None:
        self._trace(events.CLOSE, event.trace)
        self._not_full.notify_all()

    def _on_drained(self, event: Drained) -> None:
        self._trace(events.DRAIN, event.trace)
        self._drained = True
        if not self._owed:
            self._reaper_stop.set()


_APPLY: dict[type, Callable[[Effects, Any], None]] = {
    Admitted: Effects._on_admitted,
    DedupRefused: Effects._on_dedup_refused,
    Extended: Effects._on_extended,
    Reclaimed: Effects._on_reclaimed,
    DeadLettered: Effects._on_dead_lettered,
    Stale: Effects._on_stale,
    Released: Effects._on_released,
    Requeued: Effects._on_requeued,
    Purged: Effects._on_purged,
    Closed: Effects._on_closed,
    Drained: Effects._on_drained,
}

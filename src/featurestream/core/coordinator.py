"""The coordinator every queue backend shares: each public ``LeaseQueue`` call, written once over an engine.

``Coordinator(store, ..., engine=factory)`` is every backend's one constructor: it checks the shared options and
builds its ``Engine`` (``core/engine.py``: where the state lives and the few primitive changes) by calling
``factory`` with an ``EngineContext``. A backend class is that call with its factory. Everything else a caller
sees is here: argument checks and errors, the lock and ``LockedCall`` (one locked call: its owed store calls
retried first, its callbacks and the store's gc run after), retains, backpressure and
``put_blocks_until_below``, stats; the effects of the engine's events (the lease machines, tracing, scrubs and
owed store calls, callbacks, the reaper's round) are ``core/effects.py``. ``docs/architecture.md`` shows the
split.
"""

from __future__ import annotations

import collections
import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, NoReturn, TypedDict

from featurestream.common import errors
from featurestream.common.checks import check_count, check_seconds, check_text
from featurestream.common.periodic import start_periodic
from featurestream.common.refs import SampleRef
from featurestream.core.arguments import check_queue_arguments, check_ref_for
from featurestream.core.backlog import Owed
from featurestream.core.backpressure import Backpressure, HealthCallback
from featurestream.core.effects import Effects, Tracer
from featurestream.core.engine import EngineContext, EngineFactory
from featurestream.core.lease import (
    SCHEMA_REASON,
    DeadLetter,
    Lease,
    StaleLog,
    VisibilityTimeout,
    check_lease,
    check_leases,
)
from featurestream.core.locked_call import LockedCall
from featurestream.core.operator_store import NoStore
from featurestream.core.resume import TrainingLedger
from featurestream.core.signal import Signal
from featurestream.core.stats import DEFAULT_DEDUP_WINDOW, DEFAULT_MAX_DELIVERIES, STATS_FIELDS, QueueStats
from featurestream.stores.base import FeatureStore, StoreHealth

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["Coordinator", "QueueOptions", "Tracer"]

logger = logging.getLogger(__name__)

_NUMBERS = (int, float)  # the exact types of a plain number of seconds (``bool`` is no number here)


class QueueOptions(TypedDict, total=False):
    """The keyword options every backend takes and hands to ``Coordinator`` unchanged (``**options``)."""

    max_deliveries: int
    dedup_window: int
    on_dead_letter: Callable[[DeadLetter], None] | None
    reaper_interval: float | None
    tracer: Tracer | None
    keep_dead_letter_bytes: int


class Coordinator(Effects):
    """The shared half of every ``LeaseQueue`` backend; the contract is ``LeaseQueue``'s docstring."""

    # The reaper thread's name (in logs and thread dumps).
    _reaper_name = "featurestream-reaper"

    def __init__(
        self,
        store: FeatureStore,
        visibility_timeout: VisibilityTimeout | None = None,
        high_watermark_bytes: int | None = None,
        low_watermark_bytes: int | None = None,
        on_pause: HealthCallback | None = None,
        on_resume: HealthCallback | None = None,
        *,
        engine: EngineFactory,
        max_deliveries: int = DEFAULT_MAX_DELIVERIES,
        dedup_window: int = DEFAULT_DEDUP_WINDOW,
        on_dead_letter: Callable[[DeadLetter], None] | None = None,
        reaper_interval: float | None = None,
        tracer: Tracer | None = None,
        keep_dead_letter_bytes: int = 0,
    ) -> None:
        """A queue over ``store`` whose state the engine ``engine(context)`` returns keeps (see ``LeaseQueue`` for
        the options).

        ``TypeError`` / ``ValueError`` naming the first bad argument, before ``engine`` is called; whatever the
        factory raises (a server that refuses the settings ...) propagates, and no reaper thread was started.
        """
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
        # The store when this is an operator's handle (no feature store: it neither puts nor leases), else None.
        self._operator_store: NoStore | None = store if isinstance(store, NoStore) else None
        self._vt = visibility_timeout or VisibilityTimeout()
        self._on_dead_letter = on_dead_letter
        self.max_deliveries = max_deliveries
        self.dedup_window = dedup_window
        self.keep_dead_letter_bytes = keep_dead_letter_bytes
        self._tracer = tracer
        self._lock = threading.Lock()
        # Wakes producers blocked on backpressure: a settle, a paid scrub, a close.
        self._not_full = Signal(self._lock)
        self._backpressure = Backpressure(high_watermark_bytes, low_watermark_bytes, on_pause, on_resume)
        # sample id -> (store call, ref) the queue still owes its store: a scrub or unretain that raised.
        self._owed: Owed = collections.OrderedDict()
        self._store_errors = 0
        self._stale_log = StaleLog(logger)
        self._reaper_stop = threading.Event()
        self._drained = False  # seen drained (by an event or a read): the reaper stops once nothing is owed
        self._ledger: TrainingLedger | None = None
        self._op = LockedCall(self._lock, store, self._owed, self._pay_owed, self._store_fault)
        self._engine = engine(
            EngineContext(
                self._report,
                self._lock,
                traced=tracer is not None,
                visibility_timeout=self._vt,
                max_deliveries=max_deliveries,
                dedup_window=dedup_window,
                keep_dead_letter_bytes=keep_dead_letter_bytes,
                owes_scrub=self._owes_scrub,
            )
        )
        if reaper_interval is not None:
            start_periodic(self, Coordinator._reaper_round, reaper_interval, self._reaper_stop, name=self._reaper_name)

    # -- producer side ----------------------------------------------------
    def put(self, ref: SampleRef) -> None:
        """Enqueue ``ref`` at the tail; never blocks on backpressure.

        Raises ``TypeError`` for a non-ref, ``ValueError`` for a ref of another
        store, an id already queued, recently acked/dead (in any instance of a shared queue) or still owed a
        scrub, ``RuntimeError`` once closed, and the store's error type when
        its ``retain`` fails. A refused put changes nothing.
        """
        self._require_store()
        check_ref_for(self._store, ref)
        with self._op:
            self._admit([ref])

    def put_many(self, refs: Iterable[SampleRef]) -> None:
        """Enqueue every ref of ``refs``, in order: all of them or none.

        Refused as a whole (changing nothing) when any single ``put`` would be
        refused -- with the error ``put`` raises, naming the first offending
        sample -- and with ``ValueError`` when an id repeats. Traced as one
        ``Put`` per sample.
        """
        self._require_store()
        batch = self._batch("refs", refs)
        seen: set[str] = set()
        for ref in batch:
            check_ref_for(self._store, ref)
        for ref in batch:
            if ref.sample_id in seen:
                raise errors.RepeatedInBatch(ref.sample_id)
            seen.add(ref.sample_id)
        if not batch:
            return
        with self._op:
            self._admit(batch)

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
        self._require_store()
        check_ref_for(self._store, ref)
        check_seconds("poll_interval", poll_interval)
        backpressure = self._backpressure
        while True:
            if abort_when is not None and abort_when():
                raise errors.PutAborted(ref.sample_id)
            with self._op:
                # A producer that is flowing and stays so needs no reap of its own first: the put screens (reaps,
                # refuses a closed queue) as every put does.
                if backpressure.state == "flowing":
                    health = self._read_health(ref)
                    if not backpressure.should_pause(health):
                        self._admit([ref], health)
                        return
                reaped = self._engine.reap()
                if reaped.state != "open":
                    raise errors.QueueClosed(ref.sample_id)
                health = self._read_health(ref)
                callback = self._update_backpressure(health)
                if callback is not None:
                    self._op.defer(callback, health)
                    continue
                if backpressure.state == "flowing":
                    self._admit([ref], health)
                    return
                # Paused: an empty queue admits the sample all the same (the engine checks, atomically).
                if not reaped.holds and self._admit([ref], health, if_idle=True):
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
        if type(wait) not in _NUMBERS or not 0 <= wait < math.inf:  # a plain number passes without the call
            check_seconds("timeout" if timeout is not None else "poll_interval", wait)
        leases = self._lease_up_to(1, wait)
        return leases[0] if leases else None

    def acquire_many(self, n: int, *, timeout: float | None = None) -> list[Lease]:
        """Lease up to ``n`` refs, FIFO, waiting up to ``timeout`` (default 0.05) seconds for the first.

        Returns as soon as at least one is available, with every one available then (up to ``n``); ``[]`` when
        the wait ends empty-handed or the queue is drained. Traced as one ``Acquire`` per lease.
        """
        check_count("n", n, minimum=1)
        max_batch = self._engine.max_batch
        if max_batch is not None and n > max_batch:
            raise ValueError(f"n must be at most {max_batch} (one server call), got {n!r}")
        wait = 0.05 if timeout is None else timeout
        check_seconds("timeout", wait)
        return self._lease_up_to(n, wait)

    def ack(self, lease: Lease) -> bool:
        """Mark ``lease``'s sample consumed: it is never delivered again and this instance's store scrubs it.

        Returns ``True`` when this ack settled the sample, ``False`` when the
        lease was stale (reclaimed, already settled, copied, or from another
        queue or process): then nothing changed, and the rejection is logged once per
        lease. ``TypeError`` for anything that is not a ``Lease``. The ack
        stands even when the store's ``scrub`` fails: the scrub is then owed and retried
        later (see ``LeaseQueue``) and ``ack`` returns ``True``.
        """
        return self._settle_lease("ack", lease)

    def fail(self, lease: Lease) -> bool:
        """Give ``lease``'s sample back: redelivered from the tail, or dead once deliveries are spent.

        Returns ``True`` when this fail took effect, ``False`` for a stale
        lease (nothing changed; logged once per lease); ``TypeError`` for a
        non-lease.
        """
        return self._settle_lease("fail", lease)

    def lose(self, lease: Lease) -> bool:
        """The store lost ``lease``'s sample (``SampleLostError``): dead-letter it now, reason ``lost``.

        No redelivery could serve bytes that are gone, so none is made, whatever deliveries are left, and the
        dead letter's bytes are never kept. Returns ``False`` for a stale lease (nothing changed).
        """
        return self._settle_lease("lose", lease)

    def reject(self, lease: Lease, why: str) -> bool:
        """No consumer can train ``lease``'s sample (its ref breaks its algorithm's schema): dead-letter it now,
        reason ``schema: <why>`` (``why`` names the sample, the feature and what was wrong).

        No redelivery could train it, so none is made, whatever deliveries are left; it counts as a dead letter,
        never as acked, and its bytes are kept for a requeue as any dead letter's (``keep_dead_letter_bytes``).
        Returns ``False`` for a stale lease (nothing changed); ``TypeError`` for a non-lease or a ``why`` that is
        not a non-empty ``str``.
        """
        if not isinstance(why, str) or not why:
            raise TypeError(f"reject needs why, a non-empty str saying what was wrong, got {why!r}")
        return self._settle_lease("reject", lease, f"{SCHEMA_REASON}: {why}")

    def give_back(self, lease: Lease) -> bool:
        """Hand back ``lease`` unused: its sample is pending again at the tail, and this delivery does not count
        towards ``max_deliveries``. For leases taken but never worked on (a loader's prefetch on close).

        Returns ``False`` for a stale lease (nothing changed).
        """
        return self._settle_lease("give_back", lease)

    def give_back_many(self, leases: Iterable[Lease]) -> None:
        """``give_back`` every lease of ``leases``, in order, in one operation; each stale one is rejected on its
        own. ``TypeError`` (giving back none of them) when any item is not a ``Lease``."""
        self._settle("give_back", self._batch("leases", check_leases(leases, "give_back_many")))

    def ack_many(self, leases: Iterable[Lease]) -> None:
        """``ack`` every lease of ``leases``, in order, in one operation; each stale one is rejected on its own.

        ``TypeError`` (acking none of them) when any item is not a ``Lease``.
        """
        self._settle("ack", self._batch("leases", check_leases(leases, "ack_many")))

    def fail_many(self, leases: Iterable[Lease]) -> None:
        """``fail`` every lease of ``leases``, in order, in one operation; each stale one is rejected on its own.

        ``TypeError`` (failing none of them) when any item is not a ``Lease``.
        """
        self._settle("fail", self._batch("leases", check_leases(leases, "fail_many")))

    def extend(self, lease: Lease, seconds: float | None = None) -> None:
        """Push ``lease.deadline`` to now + ``seconds`` (default: the visibility timeout).

        Raises ``LeaseLost`` when the lease is not live, ``TypeError`` for a
        non-lease, ``ValueError`` for a non-positive or non-finite ``seconds``.
        """
        check_lease(lease, "extend")
        extra = self._vt.seconds if seconds is None else seconds
        check_seconds("seconds", extra, positive=True)
        with self._op:
            if not self._engine.extend(lease, extra):
                raise errors.LeaseLost(lease)

    def reclaim_expired(self) -> int:
        """Redeliver (or dead-letter) every lease past its deadline, whoever held it; return how many."""
        with self._op:
            return self._engine.reap().count

    # -- lifecycle, dead letters, introspection -----------------------------------
    def close(self, *, cause: str | None = None) -> None:
        """Refuse further puts (in every process of a shared queue) and wake every blocked producer (their puts
        raise ``RuntimeError``).

        ``acquire`` drains what is pending or leased, then returns ``None`` for good. ``cause``: why a producer
        that failed ends the run (its error, as text); every instance reads it as ``close_cause`` and a loader
        raises ``ProducerFailed`` with it where its stream ends. The first cause stands, also one given to a
        queue closed already. ``TypeError``/``ValueError`` (nothing closed) for a cause that is no non-empty str.
        """
        if cause is not None:
            check_text("cause", cause)
        with self._op:
            self._engine.close(cause)
            self._not_full.notify_all()
        self._sweep_drained()

    @property
    def close_cause(self) -> str | None:
        """Why a failed producer closed the queue (``close(cause=...)``, any instance), or ``None``."""
        with self._op.reading():
            return self._engine.snapshot().cause

    @property
    def lifecycle_state(self) -> str:
        """``open``, ``draining`` (closed, still holding samples) or ``drained``."""
        state = self._engine.snapshot().state
        if state == "drained":
            self._drained = True
            if not self._owed:
                self._reaper_stop.set()
        return state

    @property
    def is_closed(self) -> bool:
        """Whether ``close`` was called (not whether the queue is drained yet)."""
        return self.lifecycle_state != "open"

    @property
    def backpressure_state(self) -> str:
        """This producer's ``flowing`` or ``paused``."""
        return self._backpressure.state

    def training_ledger(self) -> TrainingLedger:
        """The queue's training ledger (``docs/resume.md``), kept where the queue's state is (``Engine``)."""
        with self._lock:
            if self._ledger is None:
                self._ledger = self._engine.training_ledger(self._holds)
            return self._ledger

    @property
    def store(self) -> FeatureStore:
        """The store this instance retains and scrubs in."""
        return self._store

    # The reads below first retry what this instance owes its store, as every call does (no callbacks, no gc).
    def pending_count(self) -> int:
        """Samples waiting to be leased."""
        return self._counters()["pending"]

    def outstanding_count(self) -> int:
        """Samples currently leased."""
        return self._counters()["outstanding"]

    def lease_state_counts(self) -> dict[str, int]:
        """How many leases sit in each live state (terminal leases are not kept)."""
        counters = self._counters()
        return {"pending": counters["pending"], "leased": counters["outstanding"]}

    def stats(self) -> QueueStats:
        """A consistent snapshot of the counters and gauges (a shared queue's are queue-wide, except
        ``store_errors`` and ``scrub_backlog``: store faults happen in a process's own store)."""
        with self._op.reading():
            values = self._engine.snapshot().counters
            values.update(store_errors=self._store_errors, scrub_backlog=len(self._owed))
        return QueueStats(**{name: values.get(name, 0) for name in STATS_FIELDS})

    def dead_letters(self, newest: int | None = None) -> list[DeadLetter]:
        """Samples whose deliveries were spent, oldest first; only the ``newest`` ones when it is given.

        ``ValueError`` naming a ``newest`` that is no int >= 0.
        """
        check_count("newest", newest, allow_none=True)
        with self._op.reading():
            return self._engine.dead_letters(newest)

    def oldest_lease_age(self) -> float | None:
        """Seconds (by the queue's clock) since the oldest live lease was issued; ``None`` when none is out."""
        with self._op.reading():
            return self._engine.snapshot(lease_ages=True).oldest_lease_age

    def requeue_dead_letters(self, sample_ids: Iterable[str] | None = None) -> list[str]:
        """Send the dead letters ``sample_ids`` (``None``: all) back to the tail with a fresh delivery budget.

        All or nothing: ``LookupError`` naming an id that is no dead letter, ``ValueError`` naming one whose
        bytes were not kept (``keep_dead_letter_bytes`` off, or over its cap when it died) or that is queued
        again, or when the queue is drained; then nothing changed. A requeued sample leaves the dead letters and
        the dedup window (it was never acked) and is delivered again from ``redelivery_count`` 0; its bytes were
        retained all along. Returns the requeued ids, oldest dead first; each is traced as ``RequeueDeadLetter``.
        """
        with self._op:
            return self._engine.repair("requeue", sample_ids)

    def purge_dead_letters(self, sample_ids: Iterable[str] | None = None) -> list[str]:
        """Drop the dead letters ``sample_ids`` (``None``: all) for good; return their ids, oldest dead first.

        All or nothing: ``LookupError`` naming an id that is no dead letter, and then nothing changed. Kept bytes
        are scrubbed (a failing scrub is owed and retried, as after an ack); in a shared queue the producing
        instance's store scrubs them through the settle feed. Each is traced as ``PurgeDeadLetter``.
        """
        with self._op:
            return self._engine.repair("purge", sample_ids)

    # -- internals (lock held) -------------------------------------------------
    def _counters(self) -> dict[str, int]:
        """The engine's counters and gauges, after retrying what this instance owes its store."""
        with self._op.reading():
            return self._engine.snapshot().counters

    def _batch(self, name: str, items: Iterable[Any]) -> list[Any]:
        """``items`` as a list, of at most the engine's ``max_batch`` (one server call); ``ValueError`` otherwise."""
        batch = list(items)
        cap = self._engine.max_batch
        if cap is not None and len(batch) > cap:
            raise ValueError(f"{name} must hold at most {cap} items (one server call), got {len(batch)}")
        return batch

    def _require_store(self) -> None:
        """Raise ``RuntimeError`` when this instance cannot produce or consume (an operator's handle)."""
        handle = self._operator_store
        if handle is not None:
            raise RuntimeError(
                f"this handle on queue {handle.queue!r} is an operator's handle ({handle.opened_by}): it "
                "has no feature store, so it neither puts nor leases"
            )

    def _holds(self, sample_ids: Sequence[str]) -> set[str]:
        """Which of ``sample_ids`` the queue holds (pending or leased); the training ledger asks."""
        with self._op.reading():
            return self._engine.held(sample_ids)

    def _check_resident(self, ref: SampleRef) -> None:
        """Refuse a ref whose bytes are gone (``NotResident``): a consumer's ``get`` would fail on it. A store that
        cannot tell (``is_resident`` raises ``NotImplementedError``, as the contract's default does) is taken at
        its word."""
        store = self._store
        if type(store).is_resident is FeatureStore.is_resident:
            return  # the contract's default: it cannot tell (asked, it would raise NotImplementedError)
        try:
            resident = store.is_resident(ref.sample_id)
        except NotImplementedError:
            return
        if not resident:
            raise errors.NotResident(ref.sample_id, ref.store_uri)

    def _check_local(self, ref: SampleRef) -> None:
        """The coordinator's own refusals of a put, after the engine's: a scrub still owed, bytes gone."""
        if self._owed and self._owes_scrub(ref.sample_id):
            raise errors.ScrubOwed(ref.sample_id)
        self._check_resident(ref)

    def _owes_scrub(self, sample_id: str) -> bool:
        owed = self._owed.get(sample_id) if self._owed else None
        return owed is not None and owed[0] == "scrub"

    def _admit(self, batch: list[SampleRef], health: StoreHealth | None = None, *, if_idle: bool = False) -> bool:
        """Screen, retain and enqueue ``batch`` (all or none); ``if_idle``: only into a queue holding nothing
        (``False``: it held samples, nothing changed). ``health``: the store read a producer's put was decided on."""
        engine = self._engine
        engine.screen(batch, self._check_local)
        # Retain every sample before any is enqueued, or none: a consumer (in another process, for a shared queue)
        # may lease, get and release one at once, and its store must then find it retained.
        store = self._store
        for index, ref in enumerate(batch):
            try:
                store.retain(ref)
            except Exception as exc:
                self._undo_retains(batch[: index + 1], exc)
        if self._owed:  # an unretain still owed for an earlier refused put would undo this retain
            for ref in batch:
                self._owed.pop(ref.sample_id, None)
        refusal = engine.admit(batch, health, if_idle=if_idle)
        if refusal is None:
            return True
        for ref in refusal.unretain:
            self._owe("unretain", ref)
        if refusal.error is not None:
            raise refusal.error
        return False

    def _undo_retains(self, attempted: list[SampleRef], exc: Exception) -> NoReturn:
        """The retain of ``attempted[-1]`` raised ``exc``: undo the retains of ``attempted`` (one that failed
        halfway must not pin the bytes either), except of ids the queue holds (those retains belong to the queued
        samples), and refuse the put."""
        ref = attempted[-1]
        self._store_fault("retain", ref.sample_id, exc)
        self._engine.reap()  # a refused put still reaps, as every queue call does
        sample_ids = [retained.sample_id for retained in attempted]
        try:
            held = self._engine.held(sample_ids)
        except Exception:
            # Un-retaining a queued sample would lose it; keeping an unqueued one only pins it.
            logger.warning("could not tell which of %r the queue holds; their retains stay", sample_ids, exc_info=True)
            held = set(sample_ids)
        for retained in attempted:
            if retained.sample_id not in held:
                self._owe("unretain", retained)
        raise errors.store_error(exc, f"put of sample {ref.sample_id!r} refused, nothing enqueued") from exc

    def _lease_up_to(self, n: int, wait: float) -> list[Lease]:
        """Up to ``n`` leases, waiting up to ``wait`` seconds (outside the lock, in the engine) for the first."""
        self._require_store()
        engine = self._engine
        give_up = time.monotonic() + wait
        remaining = wait
        while True:
            with self._op:
                leases, wake = engine.lease(n, remaining)
            if wake is None:
                return leases
            remaining = give_up - time.monotonic()
            if remaining <= 0:
                return []
            engine.wait(wake, remaining)
            remaining = max(0.0, give_up - time.monotonic())

    def _settle_lease(self, action: str, lease: Lease, why: str = "") -> bool:
        if type(lease) is not Lease:  # the exact type passes without the call
            check_lease(lease, action)
        with self._op:
            return self._engine.settle(action, [lease], why)[0]

    def _settle(self, action: str, leases: list[Lease]) -> list[bool]:
        if not leases:
            return []
        with self._op:
            return self._engine.settle(action, leases)

    def _read_health(self, ref: SampleRef) -> StoreHealth:
        try:
            return self._store.health()
        except Exception as exc:
            self._store_fault("health", ref.sample_id, exc)
            self._engine.reap()  # the call still reaps, as its put would have
            doing = f"put_blocks_until_below of sample {ref.sample_id!r} enqueued nothing"
            raise errors.store_error(exc, doing) from exc

"""``SampleRefQueue``: the lease / ack / fail coordinator over ``SampleRef``s."""

from __future__ import annotations

import collections
import dataclasses
import heapq
import logging
import math
import time
from collections.abc import Callable, Iterable

from featurestream.core import errors, events
from featurestream.core.backpressure import HealthCallback
from featurestream.core.checks import check_count, check_seconds
from featurestream.core.errors import LeaseLost
from featurestream.core.frontend import FrontEnd, Signal, Tracer
from featurestream.core.lease import (
    LOST_REASON,
    DeadLetter,
    Lease,
    StaleLog,
    VisibilityTimeout,
    _lease_id_counter,
    _next_lease_id,
    check_lease,
    check_leases,
)
from featurestream.core.machines import LEASE, LEASE_MACHINE, LIFECYCLE, LIFECYCLE_MACHINE, fire
from featurestream.core.operation import observing
from featurestream.core.reaper import start_reaper
from featurestream.core.refs import SampleRef
from featurestream.core.resume import MemoryLedger, TrainingLedger
from featurestream.stores.base import FeatureStore, StoreHealth

__all__ = [
    "DEFAULT_DEDUP_WINDOW",
    "DEFAULT_MAX_DELIVERIES",
    "DeadLetter",
    "Lease",
    "QUEUE_STATS_GAUGES",
    "LeaseLost",
    "QueueStats",
    "SampleRefQueue",
    "VisibilityTimeout",
    "_lease_id_counter",
    "_next_lease_id",
]

logger = logging.getLogger(__name__)

DEFAULT_MAX_DELIVERIES = 10
DEFAULT_DEDUP_WINDOW = 100_000


@dataclasses.dataclass(frozen=True)
class QueueStats:
    """Counters since construction, plus the current gauges.

    ``store_errors`` counts store calls made by the queue that raised (each
    failed retry counts again); ``scrub_backlog`` is the gauge of settled
    samples (or refused puts) whose ``scrub`` (``unretain``) the queue still
    owes the store and retries. ``requeued`` / ``purged`` count dead letters
    sent back by ``requeue_dead_letters`` / dropped by ``purge_dead_letters``.
    """

    put: int = 0
    leased: int = 0
    acked: int = 0
    failed: int = 0
    reclaimed: int = 0
    dead_lettered: int = 0
    extended: int = 0
    stale_rejected: int = 0
    dedup_refused: int = 0
    producer_pauses: int = 0
    store_errors: int = 0
    requeued: int = 0
    purged: int = 0
    # Gauges: the current value, not a count since construction (marked so readers need not list them).
    pending: int = dataclasses.field(default=0, metadata={"gauge": True})
    outstanding: int = dataclasses.field(default=0, metadata={"gauge": True})
    scrub_backlog: int = dataclasses.field(default=0, metadata={"gauge": True})


QUEUE_STATS_GAUGES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(QueueStats) if f.metadata.get("gauge"))


class _Record:
    """One lease's state-machine model; ``lease`` is set when it is handed out."""

    __slots__ = ("deadline", "lease", "leased_at", "redelivery_count", "ref", "state")

    def __init__(self, ref: SampleRef, redelivery_count: int) -> None:
        self.state = LEASE.initial
        self.ref = ref
        self.redelivery_count = redelivery_count
        self.lease: Lease | None = None
        # The queue's own copy: a consumer mutating ``lease.deadline`` cannot make its lease immortal.
        self.deadline = math.inf
        self.leased_at = math.nan

    def __str__(self) -> str:
        which = "the delivery" if self.lease is None else f"lease {self.lease.lease_id}"
        return f"{which} of sample {self.ref.sample_id!r}"


class _Flag:
    """The queue's lifecycle machine model."""

    __slots__ = ("state",)

    def __init__(self, initial: str) -> None:
        self.state = initial

    def __str__(self) -> str:
        return "the queue"


class SampleRefQueue(FrontEnd):
    """The in-process ``LeaseQueue``: the shared front end over an engine of plain Python structures.

    The contract (lifecycle, store faults, callbacks, dead-letter repair, batches) is ``LeaseQueue``'s
    docstring. The engine keeps the pending FIFO, the live leases with a deadline heap, the dedup window and
    the dead letters under the front end's lock; each lease is a ``_Record`` the lease machine drives.
    """

    def __init__(
        self,
        store: FeatureStore,
        visibility_timeout: VisibilityTimeout | None = None,
        high_watermark_bytes: int | None = None,
        low_watermark_bytes: int | None = None,
        on_pause: HealthCallback | None = None,
        on_resume: HealthCallback | None = None,
        *,
        max_deliveries: int = DEFAULT_MAX_DELIVERIES,
        dedup_window: int = DEFAULT_DEDUP_WINDOW,
        on_dead_letter: Callable[[DeadLetter], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        reaper_interval: float | None = None,
        tracer: Tracer | None = None,
        keep_dead_letter_bytes: int = 0,
    ) -> None:
        self._init_front_end(
            store, visibility_timeout, high_watermark_bytes, low_watermark_bytes, on_pause, on_resume,
            max_deliveries=max_deliveries, dedup_window=dedup_window, on_dead_letter=on_dead_letter, tracer=tracer,
            keep_dead_letter_bytes=keep_dead_letter_bytes, reaper_interval=reaper_interval,
        )  # fmt: skip
        self.keep_dead_letter_bytes = keep_dead_letter_bytes
        self._clock = clock
        self._not_empty = Signal(self._lock)
        self._pending: collections.deque[_Record] = collections.deque()
        self._live: dict[int, _Record] = {}
        self._held: dict[str, _Record] = {}
        self._deadlines: list[tuple[float, int]] = []
        self._recent_terminal: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._dead: list[DeadLetter] = []
        self._kept: dict[str, int] = {}  # dead letters whose bytes stay retained for a requeue -> their size
        self._kept_bytes = 0
        self._lifecycle = _Flag(LIFECYCLE.initial)
        self._counts: collections.Counter[str] = collections.Counter()
        self._stale_log = StaleLog(logger)
        self._ledger: MemoryLedger | None = None
        if reaper_interval is not None:
            start_reaper(self, reaper_interval, self._reaper_stop, name="featurestream-reaper")

    # -- producer side ----------------------------------------------------
    def put(self, ref: SampleRef) -> None:
        """Enqueue ``ref`` at the tail; never blocks on backpressure.

        Raises ``TypeError`` for a non-ref, ``ValueError`` for a ref of another
        store, an id already queued, recently acked/dead or still being
        scrubbed, ``RuntimeError`` once closed, and the store's error type when
        its ``retain`` fails. A refused put changes nothing.
        """
        self._check_ref(ref)
        with self._op:
            self._reap_due()
            self._admit(ref)

    def put_many(self, refs: Iterable[SampleRef]) -> None:
        """Enqueue every ref of ``refs``, in order: all of them or none.

        Refused as a whole (changing nothing) when any single ``put`` would be
        refused -- with the error ``put`` raises, naming the first offending
        sample -- and with ``ValueError`` when an id repeats. Traced as one
        ``Put`` per sample.
        """
        batch = list(refs)
        seen: set[str] = set()
        for ref in batch:
            self._check_ref(ref)
            if ref.sample_id in seen:
                raise errors.RepeatedInBatch(ref.sample_id)
            seen.add(ref.sample_id)
        with self._op:
            self._reap_due()
            for ref in batch:
                self._check_admissible(ref)
            retained: list[SampleRef] = []
            try:
                for ref in batch:
                    self._retain(ref)
                    retained.append(ref)
            except Exception:
                for ref in retained:  # the batch is refused: the samples already retained are let go again
                    self._owe("unretain", ref)
                raise
            for ref in batch:
                self._push_new(ref)

    # -- consumer side ----------------------------------------------------
    def _lease_up_to(self, n: int, wait: float) -> list[Lease]:
        give_up = time.monotonic() + wait
        with self._op:
            while True:
                self._reap_due()
                if self._pending:
                    return [self._lease_head() for _ in range(min(n, len(self._pending)))]
                if self._lifecycle.state == "drained":
                    return []
                remaining = give_up - time.monotonic()
                if remaining <= 0:
                    return []
                if self._deadlines:
                    remaining = min(remaining, max(self._deadlines[0][0] - self._clock(), 0.0))
                self._not_empty.wait(remaining)

    def ack(self, lease: Lease) -> bool:
        """Mark ``lease``'s sample consumed: it is never delivered again and its store scrubs it.

        Returns ``True`` when this ack settled the sample, ``False`` when the
        lease was stale (reclaimed, already settled, copied, or from another
        queue): then nothing changed, and the rejection is logged once per
        lease. ``TypeError`` for anything that is not a ``Lease``. The ack
        stands even when the store's ``scrub`` fails: the scrub is then retried
        later (see the class docstring) and ``ack`` returns ``True``.
        """
        check_lease(lease, "ack")
        with self._op:
            self._reap_due()
            return self._ack_locked(lease)

    def ack_many(self, leases: Iterable[Lease]) -> None:
        """``ack`` every lease of ``leases``, in order, in one operation; each stale one is rejected on its own.

        ``TypeError`` (acking none of them) when any item is not a ``Lease``.
        """
        batch = check_leases(leases, "ack_many")
        with self._op:
            self._reap_due()
            for lease in batch:
                self._ack_locked(lease)

    def _ack_locked(self, lease: Lease) -> bool:
        record = self._settle(lease, "ack")
        if record is None:
            return False
        self._counts["acked"] += 1
        self._release_hold(record.ref.sample_id, "acked")
        if self._tracer is not None:
            self._emit(events.ACK, record, lease_id=lease.lease_id)
        self._scrub(record.ref)
        self._maybe_drained()
        return True

    def fail(self, lease: Lease) -> bool:
        """Give ``lease``'s sample back: redelivered from the tail, or dead once deliveries are spent.

        Returns ``True`` when this fail took effect, ``False`` for a stale
        lease (nothing changed; logged once per lease); ``TypeError`` for a
        non-lease.
        """
        check_lease(lease, "fail")
        with self._op:
            self._reap_due()
            return self._fail_locked(lease)

    def fail_many(self, leases: Iterable[Lease]) -> None:
        """``fail`` every lease of ``leases``, in order, in one operation; each stale one is rejected on its own.

        ``TypeError`` (failing none of them) when any item is not a ``Lease``.
        """
        batch = check_leases(leases, "fail_many")
        with self._op:
            self._reap_due()
            for lease in batch:
                self._fail_locked(lease)

    def _fail_locked(self, lease: Lease, *, lost: bool = False) -> bool:
        record = self._settle(lease, "fail")
        if record is None:
            return False
        self._counts["failed"] += 1
        self._redeliver(record, events.FAIL, "failed", lost=lost)
        return True

    def lose(self, lease: Lease) -> bool:
        """The store lost ``lease``'s sample (``SampleLostError``): dead-letter it now, reason ``lost``.

        No redelivery could serve bytes that are gone, so none is made, whatever deliveries are left, and the
        dead letter's bytes are never kept. Returns ``False`` for a stale lease (nothing changed).
        """
        check_lease(lease, "lose")
        with self._op:
            self._reap_due()
            return self._fail_locked(lease, lost=True)

    def extend(self, lease: Lease, seconds: float | None = None) -> None:
        """Push ``lease.deadline`` to now + ``seconds`` (default: the visibility timeout).

        Raises ``LeaseLost`` when the lease is not live, ``TypeError`` for a
        non-lease, ``ValueError`` for a non-positive or non-finite ``seconds``.
        """
        check_lease(lease, "extend")
        extra = self._vt.seconds if seconds is None else seconds
        check_seconds("seconds", extra, positive=True)
        with self._op:
            self._reap_due()
            record = self._live_record(lease, "extend")
            if record is None:
                raise LeaseLost(lease)
            fire(LEASE_MACHINE, "extend", record)
            self._set_deadline(record, self._clock() + extra)
            self._counts["extended"] += 1
            self._emit(events.EXTEND, record, lease_id=lease.lease_id, deadline=record.deadline)

    def reclaim_expired(self) -> int:
        """Redeliver (or dead-letter) every lease past its deadline; return how many."""
        with self._op:
            return self._reap_due()

    # -- lifecycle and introspection -----------------------------------------
    def close(self) -> None:
        """Refuse further puts and wake every blocked producer (their puts raise ``RuntimeError``).

        ``acquire`` drains what is pending or leased, then returns ``None`` for good.
        """
        with self._op:
            if self._lifecycle.state == "open":  # closing a closed queue changes nothing
                fire(LIFECYCLE_MACHINE, "close", self._lifecycle)
                self._emit(events.CLOSE)
                self._maybe_drained()
                self._not_empty.notify_all()
                self._not_full.notify_all()

    @property
    def lifecycle_state(self) -> str:
        """``open``, ``draining`` (closed, still holding samples) or ``drained``."""
        return self._lifecycle.state

    def pending_count(self) -> int:
        """Samples waiting to be leased."""
        with observing(self):
            return len(self._pending)

    def outstanding_count(self) -> int:
        """Samples currently leased."""
        with observing(self):
            return len(self._live)

    def dead_letters(self, newest: int | None = None) -> list[DeadLetter]:
        """Samples whose deliveries were spent, oldest first; only the ``newest`` ones when it is given.

        ``ValueError`` naming a ``newest`` that is no int >= 0.
        """
        check_count("newest", newest, allow_none=True)
        with observing(self):
            first = 0 if newest is None else max(len(self._dead) - newest, 0)
            return self._dead[first:]

    def requeue_dead_letters(self, sample_ids: Iterable[str] | None = None) -> list[str]:
        """Send the dead letters ``sample_ids`` (``None``: all) back to the tail with a fresh delivery budget.

        All or nothing: ``LookupError`` naming an id that is no dead letter,
        ``ValueError`` naming one whose bytes were not kept (``keep_dead_letter_bytes``
        off, or over its cap when it died) or that is queued again, or when the
        queue is drained; then nothing changed. A requeued sample leaves the dead
        letters and the dedup window (it was never acked) and is delivered again
        from ``redelivery_count`` 0; its bytes were retained all along. Returns
        the requeued ids, oldest dead first; each is traced as ``RequeueDeadLetter``.
        """
        with self._op:
            self._reap_due()
            letters = self._chosen_letters(sample_ids, "requeued")
            for letter in letters:
                sample_id = letter.ref.sample_id
                if sample_id not in self._kept:
                    raise errors.DeadLetterNotKept(sample_id, self.keep_dead_letter_bytes)
                if sample_id in self._held:
                    raise errors.DeadLetterQueued(sample_id)
            if letters and self._lifecycle.state == "drained":
                raise errors.QueueDrained()
            for letter in letters:
                sample_id = letter.ref.sample_id
                self._dead.remove(letter)
                self._unkeep(sample_id)
                self._recent_terminal.pop(sample_id, None)
                self._counts["requeued"] += 1
                record = _Record(letter.ref, 0)
                self._push_pending(record)
                self._emit(events.REQUEUE_DEAD_LETTER, record)
            return [letter.ref.sample_id for letter in letters]

    def purge_dead_letters(self, sample_ids: Iterable[str] | None = None) -> list[str]:
        """Drop the dead letters ``sample_ids`` (``None``: all) for good; return their ids, oldest dead first.

        All or nothing: ``LookupError`` naming an id that is no dead letter, and
        then nothing changed. Kept bytes are scrubbed (a failing scrub is owed
        and retried, as after an ack). Each is traced as ``PurgeDeadLetter``.
        """
        with self._op:
            self._reap_due()
            letters = self._chosen_letters(sample_ids, "purged")
            for letter in letters:
                self._dead.remove(letter)
                self._counts["purged"] += 1
                self._emit(events.PURGE_DEAD_LETTER, sample_id=letter.ref.sample_id)
                if self._unkeep(letter.ref.sample_id):
                    self._scrub(letter.ref)
            return [letter.ref.sample_id for letter in letters]

    def oldest_lease_age(self) -> float | None:
        """Seconds (by the queue's clock) since the oldest live lease was issued; ``None`` when none is out."""
        with observing(self):
            # ``_live`` keeps issue order (a dict), so its first entry is the oldest live lease: O(1).
            oldest = next(iter(self._live.values()), None)
            return None if oldest is None else self._clock() - oldest.leased_at

    def stats(self) -> QueueStats:
        """A consistent snapshot of the counters and gauges."""
        with observing(self):
            return QueueStats(
                **self._counts,
                store_errors=self._store_errors,
                pending=len(self._pending),
                outstanding=len(self._live),
                scrub_backlog=len(self._owed),
            )

    def lease_state_counts(self) -> dict[str, int]:
        """How many leases sit in each live state (terminal leases are not kept)."""
        with observing(self):
            return {"pending": len(self._pending), "leased": len(self._live)}

    def training_ledger(self) -> TrainingLedger:
        """The queue's training ledger (``docs/resume.md``), in this process's memory like the queue."""
        with self._lock:
            if self._ledger is None:
                self._ledger = MemoryLedger(self._holds)
            return self._ledger

    def _holds(self, sample_ids: Iterable[str]) -> set[str]:
        with observing(self):
            return {sample_id for sample_id in sample_ids if sample_id in self._held}

    # -- internals (called with the lock held) ---------------------------------
    def _require_open(self, ref: SampleRef) -> None:
        if self._lifecycle.state != "open":
            raise errors.QueueClosed(ref.sample_id)

    def _admit(self, ref: SampleRef, health: StoreHealth | None = None, *, if_idle: bool = False) -> bool:
        """Retain and enqueue ``ref`` (the front end asks ``if_idle`` only of a queue it saw hold nothing, under
        this same lock: nothing to re-check)."""
        self._check_admissible(ref)
        self._retain(ref)
        self._push_new(ref, health)
        return True

    def _check_admissible(self, ref: SampleRef) -> None:
        """Raise what a put of ``ref`` is refused with (counting a dedup refusal); change nothing else."""
        self._require_open(ref)
        sample_id = ref.sample_id
        if sample_id in self._held:
            raise errors.DuplicateSample(sample_id, self._held[sample_id].state)
        outcome = self._recent_terminal.get(sample_id)
        if outcome is not None:
            self._counts["dedup_refused"] += 1
            self._emit(events.DEDUP_REFUSED, sample_id=sample_id)
            raise errors.SettledSample(sample_id, outcome)
        if sample_id in self._kept:
            raise errors.KeptDeadLetter(sample_id)
        owed = self._owed.get(sample_id) if self._owed else None
        if owed is not None and owed[0] == "scrub":
            raise errors.ScrubOwed(sample_id)
        self._check_resident(ref)

    def _retain(self, ref: SampleRef) -> None:
        try:
            self._store.retain(ref)
        except Exception as exc:
            self._store_fault("retain", ref.sample_id, exc)
            self._owe("unretain", ref)  # a retain that failed halfway must not pin the bytes
            raise errors.store_error(exc, f"put of sample {ref.sample_id!r} refused, nothing enqueued") from exc

    def _push_new(self, ref: SampleRef, health: StoreHealth | None = None) -> None:
        """Enqueue a retained, admissible ``ref`` as a fresh lease (``redelivery_count`` 0)."""
        if self._owed:  # an unretain still owed for an earlier refused put would undo this retain
            self._owed.pop(ref.sample_id, None)
        self._counts["put"] += 1
        record = _Record(ref, 0)
        self._push_pending(record)
        if self._tracer is not None:
            extra = {} if health is None else {"resident_bytes": health.resident_bytes}
            self._emit(events.PUT, record, **extra)

    def _push_pending(self, record: _Record) -> None:
        self._pending.append(record)
        self._held[record.ref.sample_id] = record
        self._not_empty.notify()

    def _lease_head(self) -> Lease:
        record = self._pending.popleft()
        fire(LEASE_MACHINE, "lease", record)
        record.leased_at = self._clock()
        lease = Lease(
            ref=record.ref,
            deadline=record.leased_at + self._vt.seconds,
            visibility_timeout=self._vt,
            redelivery_count=record.redelivery_count,
        )
        record.lease = lease
        self._live[lease.lease_id] = record
        self._set_deadline(record, lease.deadline)
        self._counts["leased"] += 1
        if self._tracer is not None:
            self._emit(events.ACQUIRE, record, lease_id=lease.lease_id, deadline=record.deadline)
        return lease

    def _set_deadline(self, record: _Record, deadline: float) -> None:
        assert record.lease is not None
        record.deadline = record.lease.deadline = deadline
        heapq.heappush(self._deadlines, (deadline, record.lease.lease_id))
        # Extends and settles leave dead heap entries; rebuild before they dominate.
        if len(self._deadlines) > 2 * len(self._live) + 1024:
            self._deadlines = [(live.deadline, lease_id) for lease_id, live in self._live.items()]
            heapq.heapify(self._deadlines)

    def _live_record(self, lease: Lease, action: str) -> _Record | None:
        lease_id = getattr(lease, "lease_id", None)
        record = self._live.get(lease_id) if isinstance(lease_id, int) else None
        if record is None or record.lease is not lease:
            self._counts["stale_rejected"] += 1
            self._stale_log.rejected(action, lease, _stale_reason(record is not None))
            sample_id = getattr(getattr(lease, "ref", None), "sample_id", None)
            n = getattr(lease, "redelivery_count", None)
            # forged: this lease id is live, but the object is a copy of its lease, not the one acquire returned.
            self._emit(
                events.STALE_REJECTED, op=action, lease_id=lease_id, sample_id=sample_id, n=n, forged=record is not None
            )
            return None
        return record

    def _settle(self, lease: Lease, trigger: str) -> _Record | None:
        """Fire ``trigger`` on the live lease and forget it; the caller traces and finishes the step."""
        record = self._live_record(lease, trigger)
        if record is None:
            return None
        fire(LEASE_MACHINE, trigger, record)
        del self._live[lease.lease_id]
        return record

    def _reap_due(self) -> int:
        """Reclaim every live lease whose deadline has passed: O(k log n) for k due."""
        heap = self._deadlines
        if not heap:
            return 0
        now = self._clock()
        count = 0
        while heap and heap[0][0] <= now:
            deadline, lease_id = heapq.heappop(heap)
            record = self._live.get(lease_id)
            if record is None or record.lease is None or record.deadline != deadline:
                continue
            self._settle(record.lease, "reclaim")
            self._counts["reclaimed"] += 1
            self._redeliver(record, events.RECLAIM, "expired", deadline=deadline)
            count += 1
        return count

    def _redeliver(self, record: _Record, action: str, reason: str, *, lost: bool = False, **fields: object) -> None:
        """Finish a Fail or Reclaim: the sample goes back to the tail, or is dead once deliveries are spent.

        ``lost``: the store lost the sample's bytes: dead at once, and never kept (there is nothing to keep).
        """
        assert record.lease is not None
        lease_id = record.lease.lease_id
        deliveries = record.redelivery_count + 1
        sample_id = record.ref.sample_id
        if deliveries < self.max_deliveries and not lost:
            del self._held[sample_id]
            self._push_pending(_Record(record.ref, deliveries))
            self._emit(action, record, lease_id=lease_id, **fields)
            return
        why = LOST_REASON if lost else f"{reason} {deliveries} times (max_deliveries={self.max_deliveries})"
        dead = DeadLetter(record.ref, why, deliveries)
        self._dead.append(dead)
        self._counts["dead_lettered"] += 1
        self._release_hold(sample_id, "dead-lettered")
        kept = not lost and self._keep(record.ref)
        self._emit(action, record, lease_id=lease_id, **fields)
        self._emit(events.DEAD_LETTER, record, kept=kept)
        if self._on_dead_letter is not None:
            self._outbox.append((self._on_dead_letter, dead))
        if not kept:
            self._scrub(record.ref)
        self._maybe_drained()

    def _keep(self, ref: SampleRef) -> bool:
        """Keep a new dead letter's bytes retained for a requeue, if they fit ``keep_dead_letter_bytes``."""
        size = ref.estimated_bytes
        if not self.keep_dead_letter_bytes or self._kept_bytes + size > self.keep_dead_letter_bytes:
            return False
        self._kept[ref.sample_id] = size
        self._kept_bytes += size
        return True

    def _unkeep(self, sample_id: str) -> bool:
        size = self._kept.pop(sample_id, None)
        if size is None:
            return False
        self._kept_bytes -= size
        return True

    def _chosen_letters(self, sample_ids: Iterable[str] | None, action: str) -> list[DeadLetter]:
        """The dead letters named by ``sample_ids`` (``None``: all), oldest dead first; ``LookupError`` for others."""
        if sample_ids is None:
            return list(self._dead)
        if isinstance(sample_ids, str):
            raise TypeError(f"sample_ids must be an iterable of ids, not the str {sample_ids!r}")
        wanted = list(dict.fromkeys(sample_ids))
        letters = {letter.ref.sample_id: letter for letter in self._dead}
        for sample_id in wanted:
            if sample_id not in letters:
                raise errors.NotDeadLetter(sample_id, action)
        chosen = set(wanted)
        return [letter for letter in self._dead if letter.ref.sample_id in chosen]

    def _release_hold(self, sample_id: str, outcome: str) -> None:
        """The sample is settled for good: no longer held, remembered by the dedup window."""
        del self._held[sample_id]
        if self.dedup_window:
            self._recent_terminal[sample_id] = outcome
            if len(self._recent_terminal) > self.dedup_window:
                self._recent_terminal.popitem(last=False)
        self._not_full.notify_all()

    def _maybe_drained(self) -> None:
        if self._lifecycle.state == "draining" and not self._held:
            fire(LIFECYCLE_MACHINE, "drain", self._lifecycle)
            self._emit(events.DRAIN)
            if not self._owed:
                self._reaper_stop.set()
            self._not_empty.notify_all()

    def _all_paid(self) -> None:
        if self._lifecycle.state == "drained":
            self._reaper_stop.set()

    def _put_round(self, ref: SampleRef) -> bool:
        self._reap_due()
        self._require_open(ref)
        return bool(self._held)

    def _count_pause(self) -> None:
        self._counts["producer_pauses"] += 1

    def _trace_state(self, action: str, **fields: object) -> None:
        """Trace ``action`` with the state it left: ``pending``/``outstanding`` counts and the clock ``now``."""
        if self._tracer is not None:
            state = {"pending": len(self._pending), "outstanding": len(self._live), "now": self._clock()}
            self._tracer(action, {**fields, **state})

    def _emit(self, action: str, record: _Record | None = None, **fields: object) -> None:
        """Trace ``action`` with the state it changed: the sample, its lease's redelivery count ``n``, the gauges."""
        if self._tracer is None:
            return
        if record is not None:
            fields = {"sample_id": record.ref.sample_id, "n": record.redelivery_count, **fields}
        self._trace_state(action, **fields)


def _stale_reason(forged: bool) -> str:
    """Why a ``Lease`` was rejected: a copy of a live lease, or one this queue no longer (or never) honours."""
    if forged:
        return "it is a copy of the live lease, not the object acquire returned"
    return "it was settled or reclaimed already, or issued by another queue"

"""``MemoryEngine``: the in-process engine (``core.engine.Engine``) behind ``SampleRefQueue``."""

from __future__ import annotations

import collections
import heapq
import math
from collections.abc import Callable, Iterable, Sequence

from featurestream.common import errors
from featurestream.common.refs import SampleRef
from featurestream.core.engine import (
    Admitted,
    Closed,
    DeadLettered,
    DedupRefused,
    Drained,
    EngineContext,
    Extended,
    Holds,
    Leased,
    LeaseModel,
    Purged,
    Reaped,
    Reclaimed,
    Refusal,
    Released,
    Requeued,
    Settled,
    Snapshot,
    Stale,
    Trace,
)
from featurestream.core.lease import LOST_REASON, DeadLetter, Lease
from featurestream.core.machines import LIFECYCLE, LIFECYCLE_MACHINE, fire
from featurestream.core.resume import MemoryLedger, TrainingLedger
from featurestream.core.signal import Signal
from featurestream.core.stats import QUEUE_STATS_GAUGES, STATS_FIELDS
from featurestream.stores.base import StoreHealth

__all__ = ["MemoryEngine"]

# What the engine counts: ``QueueStats``' counters but the coordinator's own ``store_errors`` and the two that
# ``snapshot`` derives from the others (``_DERIVED``).
_DERIVED = ("put", "leased")
_COUNTERS = tuple(
    name for name in STATS_FIELDS if name not in QUEUE_STATS_GAUGES and name != "store_errors" and name not in _DERIVED
)


class _Record(LeaseModel):
    """One delivery: its lease-machine model (``lease_id`` set when it is handed out) and the engine's data."""

    __slots__ = ("deadline", "lease", "leased_at", "redelivery_count", "ref")

    def __init__(self, ref: SampleRef, redelivery_count: int) -> None:
        LeaseModel.__init__(self, ref.sample_id)
        self.ref = ref
        self.redelivery_count = redelivery_count
        self.lease: Lease | None = None
        # The queue's own copy: a consumer mutating ``lease.deadline`` cannot make its lease immortal.
        self.deadline = math.inf
        self.leased_at = math.nan


class _QueueLifecycle:
    """The queue's lifecycle machine model (``open``, ``draining``, ``drained``)."""

    __slots__ = ("state",)

    def __init__(self, initial: str) -> None:
        self.state = initial

    def __str__(self) -> str:
        return "the queue"


class MemoryEngine:
    """The in-process engine (``core.engine.Engine``): plain Python structures under the coordinator's lock.

    The pending FIFO of ``_Record``s, the live leases with a deadline heap, the held ids, the dedup window and
    the dead letters (with the kept bytes of those a requeue may send back).
    """

    max_batch = None

    def __init__(self, context: EngineContext, *, clock: Callable[[], float]) -> None:
        lock = context.lock
        self._report = context.report
        self._lock = lock
        self._traced = context.traced
        self._clock = clock
        self._vt = context.visibility_timeout
        self._max_deliveries = context.max_deliveries
        self._dedup_window = context.dedup_window
        self._keep_cap = context.keep_dead_letter_bytes
        self._not_empty = Signal(lock)
        self._pending: collections.deque[_Record] = collections.deque()
        self._live: dict[int, _Record] = {}
        self._held: dict[str, _Record] = {}
        self._deadlines: list[tuple[float, int]] = []
        self._recent_terminal: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._dead: list[DeadLetter] = []
        self._kept: dict[str, int] = {}  # dead letters whose bytes stay retained for a requeue -> their size
        self._kept_bytes = 0
        self._lifecycle = _QueueLifecycle(LIFECYCLE.initial)
        self._cause: str | None = None
        # A plain dict with every counter present: a Counter (a dict subclass) misses CPython's fast path for
        # ``d[key] += 1``, which the hot path takes three times per sample.
        self._counts: dict[str, int] = dict.fromkeys(_COUNTERS, 0)

    # -- admitting ------------------------------------------------------------
    def screen(self, batch: list[SampleRef], check: Callable[[SampleRef], None]) -> None:
        """Raise what a put of the first refused ref is refused with (counting a dedup refusal); change nothing
        else."""
        self._reap_due()
        held = self._held
        for ref in batch:
            sample_id = ref.sample_id
            if self._lifecycle.state != "open":
                raise errors.put_refused("closed", sample_id)
            if sample_id in held:
                raise errors.put_refused("held", sample_id, held[sample_id].state)
            outcome = self._recent_terminal.get(sample_id)
            if outcome is not None:
                self._counts["dedup_refused"] += 1
                self._report(DedupRefused(sample_id, self._fields(sample_id=sample_id) if self._traced else None))
                raise errors.put_refused("settled", sample_id, outcome)
            if sample_id in self._kept:
                raise errors.put_refused("kept", sample_id)
            check(ref)

    def admit(self, batch: list[SampleRef], health: StoreHealth | None, *, if_idle: bool) -> Refusal | None:
        # The coordinator asks ``if_idle`` only of a queue it saw hold nothing, under this same lock: nothing to
        # re-check.
        traced = self._traced
        for ref in batch:
            record = _Record(ref, 0)
            self._push_pending(record)
            if traced:
                extra = {} if health is None else {"resident_bytes": health.resident_bytes}
                self._report(Admitted(ref.sample_id, self._fields(record, **extra)))
            # Untraced, an Admitted carries nothing the coordinator acts on (it only traces it), so none is
            # reported, as the Redis engine reports none for an untraced put.
        return None

    def held(self, sample_ids: Sequence[str]) -> set[str]:
        """Which of ``sample_ids`` the queue holds (pending or leased)."""
        return {sample_id for sample_id in sample_ids if sample_id in self._held}

    def training_ledger(self, holds: Holds) -> TrainingLedger:
        """A ledger in this process's memory, like the queue."""
        return MemoryLedger(holds)

    def _push_pending(self, record: _Record) -> None:
        self._pending.append(record)
        self._held[record.sample_id] = record
        if self._not_empty.waiting:
            self._not_empty.notify()

    # -- leasing ----------------------------------------------------------------
    def lease(self, n: int, wait: float) -> tuple[list[Lease], object | None]:
        self._reap_due()
        pending = self._pending
        if pending:
            now = self._clock()  # read after the reap, which may trace (and take time)
            if n == 1:  # acquire: no comprehension to build for one lease
                return [self._lease_head(now)], None
            return [self._lease_head(now) for _ in range(min(n, len(pending)))], None
        if self._lifecycle.state == "drained":
            return [], None
        return [], True

    def wait(self, wake: object, seconds: float) -> None:
        with self._lock:
            if self._pending or self._lifecycle.state == "drained":
                return
            if self._deadlines:
                seconds = min(seconds, max(self._deadlines[0][0] - self._clock(), 0.0))
            self._not_empty.wait(seconds)

    def _lease_head(self, now: float) -> Lease:
        """Lease the head of the pending FIFO at ``now`` (the clock read by the call, once)."""
        record = self._pending.popleft()
        record.leased_at = now
        vt = self._vt
        record.deadline = deadline = now + vt.seconds
        lease = Lease(record.ref, deadline, vt, record.redelivery_count)
        record.lease = lease
        record.lease_id = lease_id = lease.lease_id
        self._live[lease_id] = record
        heapq.heappush(self._deadlines, (deadline, lease_id))
        trace = self._fields(record, lease_id=lease_id, deadline=record.deadline) if self._traced else None
        self._report(Leased(record, lease, trace))
        return lease

    def _set_deadline(self, record: _Record, lease: Lease, deadline: float) -> None:
        """``record``'s live ``lease`` (extended) expires at ``deadline``."""
        record.deadline = lease.deadline = deadline
        heapq.heappush(self._deadlines, (deadline, lease.lease_id))
        if len(self._deadlines) > 2 * len(self._live) + 1024:
            self._prune_deadlines()

    def _prune_deadlines(self) -> None:
        """Extends and settles leave dead heap entries: rebuild the heap from the live leases before they
        dominate (amortised O(1): each entry was pushed once); a settle leaving no live lease clears it."""
        self._deadlines = [(record.deadline, lease_id) for lease_id, record in self._live.items()]
        heapq.heapify(self._deadlines)

    def _live_record(self, lease: Lease, action: str) -> _Record | None:
        """The record of the live ``lease`` (the very object ``acquire`` returned), else ``None``: reported
        ``Stale`` and counted."""
        lease_id = getattr(lease, "lease_id", None)
        record = self._live.get(lease_id) if isinstance(lease_id, int) else None
        if record is None or record.lease is not lease:
            self._reject(lease, action, lease_id, forged=record is not None)
            return None
        return record

    def _reject(self, lease: Lease, action: str, lease_id: object, *, forged: bool) -> None:
        """Report ``lease`` stale (``forged``: its id is live, but the object is a copy of the live lease)."""
        self._counts["stale_rejected"] += 1
        trace = None
        if self._traced:
            sample_id = getattr(getattr(lease, "ref", None), "sample_id", None)
            n = getattr(lease, "redelivery_count", None)
            trace = self._fields(op=action, lease_id=lease_id, sample_id=sample_id, n=n, forged=forged)
        self._report(Stale(action, lease, _stale_reason(forged), trace))

    # -- settling -------------------------------------------------------------------
    def settle(self, action: str, leases: list[Lease], why: str = "") -> list[bool]:
        self._reap_due()
        if len(leases) == 1:  # ack / fail / lose / reject / give_back: no comprehension to build for one lease
            return [self._settle_one(action, leases[0], why)]
        return [self._settle_one(action, lease, why) for lease in leases]

    def _settle_one(self, action: str, lease: Lease, why: str) -> bool:
        trigger = action if action == "ack" or action == "give_back" else "fail"
        record = self._live_record(lease, trigger)
        if record is None:
            return False
        live = self._live
        del live[lease.lease_id]
        if not live:
            self._deadlines.clear()  # every entry left is a settled or extended lease's
        elif len(self._deadlines) > 2 * len(live) + 1024:
            self._prune_deadlines()
        if trigger == "ack":
            self._counts["acked"] += 1
            self._release_hold(record.sample_id, "acked")
            trace = self._fields(record, lease_id=lease.lease_id) if self._traced else None
            self._report(Settled(record, "ack", record.ref, trace))
            if self._lifecycle.state == "draining":
                self._maybe_drained()
        elif trigger == "give_back":
            self._counts["given_back"] += 1
            record.lease = None
            record.deadline = math.inf
            self._push_pending(record)  # the same delivery, not used: its redelivery count stays
            trace = self._fields(record, lease_id=lease.lease_id) if self._traced else None
            self._report(Settled(record, "give_back", None, trace))
        else:
            self._counts["failed"] += 1
            if action == "lose":
                self._redeliver(record, "fail", "failed", dead_now=LOST_REASON, keepable=False)
            elif action == "reject":
                self._redeliver(record, "fail", "failed", dead_now=why)
            else:
                self._redeliver(record, "fail", "failed")
        return True

    def extend(self, lease: Lease, seconds: float) -> bool:
        self._reap_due()
        record = self._live_record(lease, "extend")
        if record is None:
            return False
        self._set_deadline(record, lease, self._clock() + seconds)
        self._counts["extended"] += 1
        trace = self._fields(record, lease_id=lease.lease_id, deadline=record.deadline) if self._traced else None
        self._report(Extended(record, trace))
        return True

    def reap(self) -> Reaped:
        return Reaped(self._reap_due(), self._lifecycle.state, bool(self._held))

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
            del self._live[lease_id]
            self._counts["reclaimed"] += 1
            self._redeliver(record, "reclaim", "expired", deadline=deadline)
            count += 1
        return count

    def _redeliver(
        self,
        record: _Record,
        trigger: str,
        reason: str,
        *,
        dead_now: str | None = None,
        keepable: bool = True,
        **fields: object,
    ) -> None:
        """Finish a Fail or Reclaim: the sample goes back to the tail, or is dead once deliveries are spent.

        ``dead_now``: the dead letter's reason when no redelivery could serve the sample (the store lost its
        bytes, or no consumer can train it): dead at once. ``keepable``: ``False`` when there is nothing to keep.
        """
        assert record.lease is not None
        lease_id = record.lease.lease_id
        deliveries = record.redelivery_count + 1
        sample_id = record.ref.sample_id
        spent = dead_now is not None or deliveries >= self._max_deliveries
        if spent:
            why = dead_now or f"{reason} {deliveries} times (max_deliveries={self._max_deliveries})"
            dead = DeadLetter(record.ref, why, deliveries)
            self._dead.append(dead)
            self._counts["dead_lettered"] += 1
            self._release_hold(sample_id, "dead-lettered")
            kept = keepable and self._keep(record.ref)
        else:
            del self._held[sample_id]
            self._push_pending(_Record(record.ref, deliveries))
        trace = self._fields(record, lease_id=lease_id, **fields) if self._traced else None
        self._report(Settled(record, "fail", None, trace) if trigger == "fail" else Reclaimed(record, trace))
        if spent:
            self._report(DeadLettered(dead, kept, self._fields(record, kept=kept) if self._traced else None))
            self._maybe_drained()

    def _keep(self, ref: SampleRef) -> bool:
        """Keep a new dead letter's bytes retained for a requeue, if they fit ``keep_dead_letter_bytes``."""
        size = ref.estimated_bytes
        if not self._keep_cap or self._kept_bytes + size > self._keep_cap:
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

    def _release_hold(self, sample_id: str, outcome: str) -> None:
        """The sample is settled for good: no longer held, remembered by the dedup window."""
        del self._held[sample_id]
        if self._dedup_window:
            self._recent_terminal[sample_id] = outcome
            if len(self._recent_terminal) > self._dedup_window:
                self._recent_terminal.popitem(last=False)

    # -- lifecycle ----------------------------------------------------------------
    def close(self, cause: str | None) -> None:
        if self._cause is None:
            self._cause = cause
        if self._lifecycle.state == "open":  # closing a closed queue changes nothing
            fire(LIFECYCLE_MACHINE, "close", self._lifecycle)
            self._report(Closed(self._fields() if self._traced else None))
            self._maybe_drained()
            self._not_empty.notify_all()

    def _maybe_drained(self) -> None:
        if self._lifecycle.state == "draining" and not self._held:
            fire(LIFECYCLE_MACHINE, "drain", self._lifecycle)
            self._report(Drained(self._fields() if self._traced else None))
            self._not_empty.notify_all()

    # -- dead-letter repair ---------------------------------------------------------
    def repair(self, action: str, sample_ids: Iterable[str] | None) -> list[str]:
        self._reap_due()
        return self._requeue(sample_ids) if action == "requeue" else self._purge(sample_ids)

    def _requeue(self, sample_ids: Iterable[str] | None) -> list[str]:
        letters = self._chosen_letters(sample_ids, "requeued")
        for letter in letters:
            sample_id = letter.ref.sample_id
            if sample_id not in self._kept:
                raise errors.DeadLetterNotKept(sample_id, self._keep_cap)
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
            self._report(Requeued(sample_id, self._fields(record) if self._traced else None))
        return [letter.ref.sample_id for letter in letters]

    def _purge(self, sample_ids: Iterable[str] | None) -> list[str]:
        letters = self._chosen_letters(sample_ids, "purged")
        for letter in letters:
            sample_id = letter.ref.sample_id
            self._dead.remove(letter)
            self._counts["purged"] += 1
            self._report(Purged(sample_id, self._fields(sample_id=sample_id) if self._traced else None))
            if self._unkeep(sample_id):
                self._report(Released(letter.ref))
        return [letter.ref.sample_id for letter in letters]

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

    # -- reads ----------------------------------------------------------------------
    def count_pause(self) -> None:
        self._counts["producer_pauses"] += 1

    def snapshot(self, *, lease_ages: bool = False) -> Snapshot:
        """The counters, ``put`` and ``leased`` derived rather than counted on every put and lease: a put's sample
        is held until it is acked or dead-lettered (a requeue holds one again without a put), and a lease is live
        until it is acked, failed (lost too), reclaimed or given back."""
        counts = self._counts
        put = len(self._held) + counts["acked"] + counts["dead_lettered"] - counts["requeued"]
        leased = counts["acked"] + counts["failed"] + counts["reclaimed"] + counts["given_back"] + len(self._live)
        gauges = {"pending": len(self._pending), "outstanding": len(self._live)}
        counters = {**counts, "put": put, "leased": leased, **gauges}
        oldest = self._oldest_lease_age() if lease_ages else None
        return Snapshot(self._lifecycle.state, counters, oldest, self._cause)

    def dead_letters(self, newest: int | None) -> list[DeadLetter]:
        first = 0 if newest is None else max(len(self._dead) - newest, 0)
        return self._dead[first:]

    def _oldest_lease_age(self) -> float | None:
        # ``_live`` keeps issue order (a dict), so its first entry is the oldest live lease: O(1).
        oldest = next(iter(self._live.values()), None)
        return None if oldest is None else self._clock() - oldest.leased_at

    def trace_state(self) -> dict[str, object]:
        """The state an event leaves: ``pending``/``outstanding`` counts and the clock ``now``."""
        return {"pending": len(self._pending), "outstanding": len(self._live), "now": self._clock()}

    def _fields(self, record: _Record | None = None, **fields: object) -> Trace:
        """A traced event's fields: the sample, its lease's redelivery count ``n``, ``fields``, the state."""
        if record is not None:
            fields = {"sample_id": record.ref.sample_id, "n": record.redelivery_count, **fields}
        return {**fields, **self.trace_state()}


def _stale_reason(forged: bool) -> str:
    """Why a ``Lease`` was rejected: a copy of a live lease, or one this queue no longer (or never) honours."""
    if forged:
        return "it is a copy of the live lease, not the object acquire returned"
    return "it was settled or reclaimed already, or issued by another queue"

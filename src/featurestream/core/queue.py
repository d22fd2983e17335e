"""``SampleRefQueue``: the lease / ack / fail coordinator over ``SampleRef``s."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import heapq
import logging
import math
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator

from featurestream.core import events
from featurestream.core.checks import check_count, check_seconds
from featurestream.core.lease import DeadLetter, Lease, VisibilityTimeout, _lease_id_counter, _next_lease_id
from featurestream.core.machines import (
    BACKPRESSURE,
    BACKPRESSURE_MACHINE,
    LEASE,
    LEASE_MACHINE,
    LIFECYCLE,
    LIFECYCLE_MACHINE,
    fire,
)
from featurestream.core.refs import SampleRef
from featurestream.stores.base import FeatureStore, StoreHealth

__all__ = [
    "DEFAULT_DEDUP_WINDOW",
    "DEFAULT_MAX_DELIVERIES",
    "DeadLetter",
    "Lease",
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


Tracer = Callable[[str, dict[str, object]], None]


class LeaseLost(RuntimeError):
    """The lease is no longer live (acked, failed, reclaimed, or never issued here)."""


@dataclasses.dataclass(frozen=True)
class QueueStats:
    """Counters since construction, plus the current gauges."""

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
    pending: int = 0
    outstanding: int = 0


class _Record:
    """One lease's state-machine model; ``lease`` is set when it is handed out."""

    __slots__ = ("deadline", "lease", "redelivery_count", "ref", "state")

    def __init__(self, ref: SampleRef, redelivery_count: int) -> None:
        self.state = LEASE.initial
        self.ref = ref
        self.redelivery_count = redelivery_count
        self.lease: Lease | None = None
        # The queue's own copy: a consumer mutating ``lease.deadline`` cannot make its lease immortal.
        self.deadline = math.inf


class _Flag:
    __slots__ = ("state",)

    def __init__(self, initial: str) -> None:
        self.state = initial


class SampleRefQueue:
    """Lease / ack / fail queue over tensor-free ``SampleRef``s.

    Each delivery attempt is a lease (``pending -> leased -> acked | failed |
    reclaimed``). A failed or expired lease sends its sample to the tail as a
    new lease, until ``max_deliveries`` is spent and it is dead-lettered.
    While the queue holds a sample its store retains it; when the sample is
    acked or dead the store scrubs it. Expired leases are reclaimed by every
    call (and by an optional reaper thread). Every method is thread-safe.
    """

    def __init__(
        self,
        store: FeatureStore,
        visibility_timeout: VisibilityTimeout | None = None,
        high_watermark_bytes: int | None = None,
        low_watermark_bytes: int | None = None,
        on_pause: Callable[[StoreHealth], None] | None = None,
        on_resume: Callable[[StoreHealth], None] | None = None,
        *,
        max_deliveries: int = DEFAULT_MAX_DELIVERIES,
        dedup_window: int = DEFAULT_DEDUP_WINDOW,
        on_dead_letter: Callable[[DeadLetter], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        reaper_interval: float | None = None,
        tracer: Tracer | None = None,
    ) -> None:
        if not isinstance(store, FeatureStore):
            raise TypeError(f"store must be a FeatureStore, got {type(store).__name__}")
        if visibility_timeout is not None and not isinstance(visibility_timeout, VisibilityTimeout):
            raise TypeError(f"visibility_timeout must be a VisibilityTimeout, got {visibility_timeout!r}")
        check_count("high_watermark_bytes", high_watermark_bytes, allow_none=True)
        check_count("low_watermark_bytes", low_watermark_bytes, allow_none=True)
        if high_watermark_bytes is not None and low_watermark_bytes is not None:
            if low_watermark_bytes >= high_watermark_bytes:
                raise ValueError(
                    f"low_watermark_bytes ({low_watermark_bytes}) must be below "
                    f"high_watermark_bytes ({high_watermark_bytes}) so the hysteresis band is non-empty"
                )
        check_count("max_deliveries", max_deliveries, minimum=1)
        check_count("dedup_window", dedup_window)
        if reaper_interval is not None:
            check_seconds("reaper_interval", reaper_interval, positive=True)
        self._store = store
        self._vt = visibility_timeout or VisibilityTimeout()
        self._high = high_watermark_bytes
        self._low = low_watermark_bytes
        self._on_pause = on_pause
        self._on_resume = on_resume
        self._on_dead_letter = on_dead_letter
        self.max_deliveries = max_deliveries
        self.dedup_window = dedup_window
        self._clock = clock
        self._tracer = tracer

        self._lock = threading.Lock()
        self._not_empty = threading.Condition(self._lock)
        self._not_full = threading.Condition(self._lock)
        self._pending: collections.deque[_Record] = collections.deque()
        self._live: dict[int, _Record] = {}
        self._held: dict[str, _Record] = {}
        self._deadlines: list[tuple[float, int]] = []
        self._recent_terminal: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._dead: list[DeadLetter] = []
        self._outbox: list[tuple[Callable[..., None], object]] = []
        self._backpressure = _Flag(BACKPRESSURE.initial)
        self._lifecycle = _Flag(LIFECYCLE.initial)
        self._counts: collections.Counter[str] = collections.Counter()
        self._reaper_stop = threading.Event()
        if reaper_interval is not None:
            _start_reaper(self, reaper_interval)

    # -- producer side ----------------------------------------------------
    def put(self, ref: SampleRef) -> None:
        """Enqueue ``ref`` at the tail; never blocks on backpressure.

        Raises ``TypeError`` for a non-ref, ``ValueError`` for a ref of another
        store, an id already queued or recently acked/dead, ``RuntimeError``
        once closed. A refused put changes nothing.
        """
        self._check_ref(ref)
        with self._operation():
            self._reap_due()
            self._enqueue_new(ref)

    def put_blocks_until_below(
        self,
        ref: SampleRef,
        poll_interval: float = 0.05,
        abort_when: Callable[[], bool] | None = None,
    ) -> None:
        """Enqueue ``ref``, first waiting while the producer is paused by backpressure.

        Pauses at/above the high watermark, resumes at/below the low one, and
        keeps its state inside the band. Wakes on every ack/scrub and at least
        every ``poll_interval`` seconds to re-check the store and ``abort_when``.
        Raises ``RuntimeError`` when the queue is closed or ``abort_when()`` is true.

        The producer's own sample is already in the store and counts towards
        ``resident_bytes``: keep the low watermark above what all producers hold
        at once, or every producer can stay paused for good.
        """
        self._check_ref(ref)
        check_seconds("poll_interval", poll_interval)
        while True:
            if abort_when is not None and abort_when():
                raise RuntimeError(f"put of sample {ref.sample_id!r} aborted: abort_when() returned True")
            with self._operation():
                self._reap_due()
                self._require_open(ref)
                health = self._store.health()
                callback = self._update_backpressure(health)
                if callback is not None:
                    self._outbox.append((callback, health))
                    continue
                if self._backpressure.state == "flowing":
                    self._enqueue_new(ref)
                    return
                self._not_full.wait(poll_interval)

    # -- consumer side ----------------------------------------------------
    def acquire(self, poll_interval: float = 0.05, *, timeout: float | None = None) -> Lease | None:
        """Lease the next ref, waiting up to ``timeout`` (default ``poll_interval``) seconds.

        Wakes as soon as a sample becomes available (put, fail, reclaim).
        Returns ``None`` when the wait ends empty-handed; ``is_closed`` tells a
        transient empty poll from a closed, drained queue (which returns at once).
        """
        wait = poll_interval if timeout is None else timeout
        check_seconds("timeout" if timeout is not None else "poll_interval", wait)
        give_up = time.monotonic() + wait
        with self._operation():
            while True:
                self._reap_due()
                if self._pending:
                    return self._lease_head()
                if self._lifecycle.state == "drained":
                    return None
                remaining = give_up - time.monotonic()
                if remaining <= 0:
                    return None
                if self._deadlines:
                    remaining = min(remaining, max(self._deadlines[0][0] - self._clock(), 0.0))
                self._not_empty.wait(remaining)

    def ack(self, lease: Lease) -> None:
        """Mark ``lease``'s sample consumed: it is never delivered again and its store scrubs it.

        A stale lease (reclaimed, already settled, copied, or from another
        queue) is rejected and changes nothing.
        """
        with self._operation():
            self._reap_due()
            record = self._settle(lease, "ack")
            if record is not None:
                self._counts["acked"] += 1
                self._retire(record.ref, "acked")

    def fail(self, lease: Lease) -> None:
        """Give ``lease``'s sample back: redelivered from the tail, or dead once deliveries are spent.

        A stale lease is rejected and changes nothing.
        """
        with self._operation():
            self._reap_due()
            record = self._settle(lease, "fail")
            if record is not None:
                self._counts["failed"] += 1
                self._redeliver(record, "failed")

    def extend(self, lease: Lease, seconds: float | None = None) -> None:
        """Push ``lease.deadline`` to now + ``seconds`` (default: the visibility timeout).

        Raises ``LeaseLost`` when the lease is not live, ``ValueError`` for a
        non-positive or non-finite ``seconds``.
        """
        extra = self._vt.seconds if seconds is None else seconds
        check_seconds("seconds", extra, positive=True)
        with self._operation():
            self._reap_due()
            record = self._live_record(lease, "extend")
            if record is None:
                raise LeaseLost(
                    f"lease {getattr(lease, 'lease_id', lease)!r} is not live; "
                    "stop working on it (it was settled or reclaimed)"
                )
            fire(LEASE_MACHINE, "extend", record)
            self._set_deadline(record, self._clock() + extra)
            self._counts["extended"] += 1
            self._trace(events.EXTEND, sample_id=lease.ref.sample_id, lease_id=lease.lease_id)

    def reclaim_expired(self) -> int:
        """Redeliver (or dead-letter) every lease past its deadline; return how many."""
        with self._operation():
            return self._reap_due()

    # -- lifecycle and introspection -----------------------------------------
    def close(self) -> None:
        """Refuse further puts; ``acquire`` drains what is held, then returns ``None`` for good."""
        with self._lock:
            if fire(LIFECYCLE_MACHINE, "close", self._lifecycle):
                self._trace(events.CLOSE)
                self._maybe_drained()
                self._not_empty.notify_all()
                self._not_full.notify_all()

    @property
    def is_closed(self) -> bool:
        """Whether ``close`` was called (not whether the queue is drained yet)."""
        return self._lifecycle.state != "open"

    @property
    def lifecycle_state(self) -> str:
        """``open``, ``draining`` (closed, still holding samples) or ``drained``."""
        return self._lifecycle.state

    @property
    def backpressure_state(self) -> str:
        """``flowing`` or ``paused``."""
        return self._backpressure.state

    def pending_count(self) -> int:
        """Samples waiting to be leased."""
        with self._lock:
            return len(self._pending)

    def outstanding_count(self) -> int:
        """Samples currently leased."""
        with self._lock:
            return len(self._live)

    def dead_letters(self) -> list[DeadLetter]:
        """Samples whose deliveries were spent, oldest first."""
        with self._lock:
            return list(self._dead)

    def stats(self) -> QueueStats:
        """A consistent snapshot of the counters and gauges."""
        with self._lock:
            return QueueStats(**self._counts, pending=len(self._pending), outstanding=len(self._live))

    def lease_state_counts(self) -> dict[str, int]:
        """How many leases sit in each live state (terminal leases are not kept)."""
        with self._lock:
            return {"pending": len(self._pending), "leased": len(self._live)}

    def render(self, path: str | os.PathLike[str], format: str | None = None) -> None:
        """Draw this queue's machines to ``path``: lease counts per state, current backpressure and lifecycle.

        ``format`` is ``svg``, ``png`` or ``dot`` (default: the suffix of ``path``);
        svg/png need graphviz's ``dot`` binary. See ``featurestream.tools.diagrams.render_queue``.
        """
        from featurestream.tools.diagrams import render_queue  # graphviz is optional: import on use

        render_queue(self, path, format)

    @property
    def store(self) -> FeatureStore:
        return self._store

    # -- internals (called with the lock held) ---------------------------------
    def _check_ref(self, ref: object) -> None:
        if not isinstance(ref, SampleRef):
            raise TypeError(f"put expects a SampleRef, got {type(ref).__name__}: {ref!r:.80}")
        store_uri = getattr(self._store, "store_uri", ref.store_uri)
        if ref.store_uri != store_uri:
            raise ValueError(
                f"sample {ref.sample_id!r} lives in {ref.store_uri}, but this queue's store is {store_uri}; "
                "put it into the queue bound to that store"
            )

    def _require_open(self, ref: SampleRef) -> None:
        if self._lifecycle.state != "open":
            raise RuntimeError(f"cannot put sample {ref.sample_id!r}: the queue is closed")

    def _enqueue_new(self, ref: SampleRef) -> None:
        self._require_open(ref)
        sample_id = ref.sample_id
        if sample_id in self._held:
            raise ValueError(
                f"sample {sample_id!r} is already queued ({self._held[sample_id].state}); ids must be unique"
            )
        outcome = self._recent_terminal.get(sample_id)
        if outcome is not None:
            self._counts["dedup_refused"] += 1
            self._trace(events.DEDUP_REFUSED, sample_id=sample_id)
            raise ValueError(
                f"sample {sample_id!r} was already {outcome}; re-puts of settled samples are refused "
                "(discard the duplicate from the store)"
            )
        self._store.retain(ref)
        self._counts["put"] += 1
        self._trace(events.PUT, sample_id=sample_id)
        self._push_pending(_Record(ref, 0))

    def _push_pending(self, record: _Record) -> None:
        self._pending.append(record)
        self._held[record.ref.sample_id] = record
        self._not_empty.notify()

    def _lease_head(self) -> Lease:
        record = self._pending.popleft()
        fire(LEASE_MACHINE, "lease", record)
        lease = Lease(
            ref=record.ref,
            deadline=self._clock() + self._vt.seconds,
            visibility_timeout=self._vt,
            redelivery_count=record.redelivery_count,
        )
        record.lease = lease
        self._live[lease.lease_id] = record
        self._set_deadline(record, lease.deadline)
        self._counts["leased"] += 1
        self._trace(events.ACQUIRE, sample_id=record.ref.sample_id, lease_id=lease.lease_id)
        return lease

    def _set_deadline(self, record: _Record, deadline: float) -> None:
        assert record.lease is not None
        record.deadline = record.lease.deadline = deadline
        heapq.heappush(self._deadlines, (deadline, record.lease.lease_id))
        # Extends and settles leave dead heap entries; rebuild before they dominate.
        if len(self._deadlines) > 2 * len(self._live) + 1024:
            self._deadlines = [(live.deadline, lease_id) for lease_id, live in self._live.items()]
            heapq.heapify(self._deadlines)

    def _live_record(self, lease: object, action: str) -> _Record | None:
        lease_id = getattr(lease, "lease_id", None)
        record = self._live.get(lease_id) if isinstance(lease_id, int) else None
        if record is None or record.lease is not lease:
            self._counts["stale_rejected"] += 1
            logger.debug("rejected stale %s of lease %r", action, getattr(lease, "lease_id", lease))
            self._trace(events.STALE_REJECTED, op=action, lease_id=getattr(lease, "lease_id", None))
            return None
        return record

    def _settle(self, lease: Lease, trigger: str) -> _Record | None:
        record = self._live_record(lease, trigger)
        if record is None:
            return None
        fire(LEASE_MACHINE, trigger, record)
        del self._live[lease.lease_id]
        self._trace(events.TRIGGER_EVENTS[trigger], sample_id=record.ref.sample_id, lease_id=lease.lease_id)
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
            self._redeliver(record, "expired")
            count += 1
        return count

    def _redeliver(self, record: _Record, reason: str) -> None:
        deliveries = record.redelivery_count + 1
        if deliveries >= self.max_deliveries:
            dead = DeadLetter(
                record.ref, f"{reason} {deliveries} times (max_deliveries={self.max_deliveries})", deliveries
            )
            self._dead.append(dead)
            self._counts["dead_lettered"] += 1
            self._trace(events.DEAD_LETTER, sample_id=record.ref.sample_id)
            self._retire(record.ref, "dead-lettered")
            if self._on_dead_letter is not None:
                self._outbox.append((self._on_dead_letter, dead))
            return
        del self._held[record.ref.sample_id]
        self._push_pending(_Record(record.ref, deliveries))

    def _retire(self, ref: SampleRef, outcome: str) -> None:
        sample_id = ref.sample_id
        del self._held[sample_id]
        self._store.scrub(ref)
        if self.dedup_window:
            self._recent_terminal[sample_id] = outcome
            if len(self._recent_terminal) > self.dedup_window:
                self._recent_terminal.popitem(last=False)
        self._not_full.notify_all()
        self._maybe_drained()

    def _maybe_drained(self) -> None:
        if self._lifecycle.state == "draining" and not self._held:
            fire(LIFECYCLE_MACHINE, "drain", self._lifecycle)
            self._trace(events.DRAIN)
            self._reaper_stop.set()
            self._not_empty.notify_all()

    def _update_backpressure(self, health: StoreHealth) -> Callable[[StoreHealth], None] | None:
        """Apply the hysteresis; return the callback to run (outside the lock), if any."""
        state = self._backpressure.state
        if state == "flowing" and self._should_pause(health):
            fire(BACKPRESSURE_MACHINE, "pause", self._backpressure)
            self._counts["producer_pauses"] += 1
            self._trace(events.PAUSE, resident_bytes=health.resident_bytes)
            return self._on_pause or _no_callback
        if state == "paused" and self._should_resume(health):
            fire(BACKPRESSURE_MACHINE, "resume", self._backpressure)
            self._trace(events.RESUME, resident_bytes=health.resident_bytes)
            return self._on_resume or _no_callback
        return None

    def _should_pause(self, health: StoreHealth) -> bool:
        if self._high is not None:
            return health.resident_bytes >= self._high
        return health.high_watermark_hit

    def _should_resume(self, health: StoreHealth) -> bool:
        if self._low is not None:
            return health.resident_bytes <= self._low
        return health.low_watermark_hit

    def _trace(self, action: str, **fields: object) -> None:
        if self._tracer is not None:
            self._tracer(action, fields)

    # -- around the lock ----------------------------------------------------------
    @contextlib.contextmanager
    def _operation(self) -> Iterator[None]:
        """Hold the lock for the body; then, even if it raised, run queued callbacks and the store's gc."""
        outbox: list[tuple[Callable[..., None], object]] = []
        try:
            with self._lock:
                try:
                    yield
                finally:
                    outbox, self._outbox = self._outbox, []
        finally:
            self._after(outbox)

    def _after(self, outbox: list[tuple[Callable[..., None], object]]) -> None:
        for callback, argument in outbox:
            try:
                callback(argument)
            except Exception:
                logger.exception("queue callback %r raised; the queue carries on", callback)
        try:
            self._store.gc()
        except Exception:
            logger.exception("store gc() raised; the queue carries on")


def _no_callback(health: StoreHealth) -> None:
    """Stands in for an unset on_pause/on_resume."""


def _start_reaper(queue: SampleRefQueue, interval: float) -> None:
    """Reclaim expired leases every ``interval`` seconds until the queue drains or is collected."""
    ref = weakref.ref(queue)
    stop = queue._reaper_stop

    def run() -> None:
        while not stop.wait(interval):
            target = ref()
            if target is None or target.lifecycle_state == "drained":
                return
            target.reclaim_expired()
            del target

    threading.Thread(target=run, name="featurestream-reaper", daemon=True).start()

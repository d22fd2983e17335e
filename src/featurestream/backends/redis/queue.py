"""``RedisSampleRefQueue``: the lease / ack / fail queue with its state in Redis.

Producers and consumers in different processes or on different machines
share one queue by naming the same Redis server and queue ``name``. It
implements ``featurestream.core.protocol.LeaseQueue`` with the in-process
``SampleRefQueue``'s semantics, every state change made by one atomic call of
a server-side Lua function (Redis 7.0+; see
``featurestream.backends.redis.functions`` for the library and the key layout):

- a delivery attempt is an entry of a Redis list (FIFO); a
  failed or reclaimed sample is appended to the tail as a new entry with
  ``redelivery_count + 1``, or dead-lettered once ``max_deliveries`` is spent;
- a lease carries a secret token; ack / fail / extend succeed only when the
  function finds that exact token on the live lease, so a reclaimed lease's late
  ack changes nothing, whichever process sends it;
- lease deadlines live in a sorted set scored by the server's ``TIME`` (or by
  the injected ``clock``), and every call reaps due leases first;
- refs cross the wire as strict JSON (``featurestream.backends.redis.wire``), never pickle.

API (every method thread-safe; each state change one server call, one round trip):

- producers: ``put(ref)``, ``put_many(refs)`` (all or none), ``put_blocks_until_below(ref, ...)``;
- consumers: ``acquire(timeout=)`` -> ``RedisLease | None``, ``acquire_many(n, timeout=)`` -> list,
  ``ack`` / ``fail`` / ``extend`` one lease, ``ack_many`` / ``fail_many`` a batch (stale ones rejected
  one by one, as by ``ack`` / ``fail``);
- operators: ``RedisSampleRefQueue.open(url, name)`` -> a handle with no feature store (``LookupError``
  when no such queue; it never puts or leases), ``stats()`` (a ``QueueStats``), ``pending_count()``,
  ``outstanding_count()``, ``lifecycle_state``, ``oldest_lease_age()`` -> seconds | None,
  ``dead_letters(newest=None)`` (oldest first; ``newest=N`` reads only the newest N),
  ``requeue_dead_letters(ids=None)`` / ``purge_dead_letters(ids=None)`` -> the ids acted on (``None``: all;
  one atomic call, all or nothing: ``LookupError`` for an id that is no dead letter, ``ValueError`` for a
  requeue whose bytes were not kept -- see ``keep_dead_letter_bytes``), ``reclaim_expired()``, ``close()``,
  ``disconnect()``.

Each process binds the queue to its own store instance: the putting process
``retain``s, and whichever process settles a sample (the acker, or the
process whose call reaped and dead-lettered it) ``scrub``s it in its store.
Store faults follow the contract in ``LeaseQueue``'s
docstring: a settle on the server stands whatever the store raises, and a
``scrub`` / ``unretain`` that raised is owed -- logged, counted in
``stats().store_errors`` / ``scrub_backlog`` (this instance's), and retried
at the start of this instance's later calls and by its reaper thread.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import math
import os
import secrets
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NoReturn

try:
    import redis  # redis.exceptions is loaded by the package itself
except ImportError as exc:  # pragma: no cover - exercised only without the optional dependency
    raise ImportError(
        "RedisSampleRefQueue needs redis-py: pip install 'featurestream[redis]' (or pip install 'redis>=5')"
    ) from exc

from featurestream.backends.redis import functions
from featurestream.backends.redis.link import Link, first_contact
from featurestream.backends.redis.resume import RedisTrainingLedger
from featurestream.backends.redis.wire import (
    dead_letter_from_json,
    event_state,
    lease_issued,
    ref_from_json,
    ref_to_json,
)
from featurestream.core import errors, events
from featurestream.core.backpressure import HealthCallback
from featurestream.core.checks import check_count, check_seconds
from featurestream.core.frontend import FrontEnd, Tracer
from featurestream.core.lease import DeadLetter, Lease, StaleLog, VisibilityTimeout, check_lease, check_leases
from featurestream.core.machines import LEASE, LEASE_MACHINE, fire
from featurestream.core.operation import observing
from featurestream.core.queue import DEFAULT_DEDUP_WINDOW, DEFAULT_MAX_DELIVERIES, QueueStats
from featurestream.core.reaper import start_reaper
from featurestream.core.refs import SampleRef
from featurestream.stores.base import FeatureStore, StoreHealth

__all__ = ["DEFAULT_REDIS_URL", "RedisLease", "RedisSampleRefQueue", "list_queues"]

logger = logging.getLogger(__name__)

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"

# Server event kind -> tracer action: the server reports lease and lifecycle events by machine trigger (mapped by
# core.events.TRIGGER_EVENTS), and these extra kinds.
_NOT_ISSUED_HERE = "it is not the object this instance's acquire returned (a copy, or another process's or queue's)"

_ACTIONS = {
    **events.TRIGGER_EVENTS,
    "put": events.PUT,
    "dead": events.DEAD_LETTER,
    "kept": events.DEAD_LETTER,
    "dedup": events.DEDUP_REFUSED,
    "stale": events.STALE_REJECTED,
    "forged": events.STALE_REJECTED,
    "requeue": events.REQUEUE_DEAD_LETTER,
    "purge": events.PURGE_DEAD_LETTER,
}

# The functions that report settles from the ``retired`` feed to a producing caller.
_FEEDING = frozenset({"put", "put_many", "reclaim"})

# QueueStats fields this instance keeps itself (store faults are per process); the rest are queue-wide.
_LOCAL_STATS = ("store_errors", "scrub_backlog")


@dataclasses.dataclass
class RedisLease(Lease):
    """A ``Lease`` issued by a ``RedisSampleRefQueue``; ``token`` proves it to the server."""

    token: str = dataclasses.field(default="", repr=False)


class _LeaseModel:
    """The lease machine's model of one lease, driven by what the server reports about it."""

    __slots__ = ("lease_id", "sample_id", "state")

    def __init__(self, lease_id: int, sample_id: str, state: str = LEASE.initial) -> None:
        self.lease_id = lease_id
        self.sample_id = sample_id
        self.state = state

    def __str__(self) -> str:
        return f"lease {self.lease_id} of sample {self.sample_id!r}"


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _sample_ids(sample_ids: Iterable[str] | None) -> list[str]:
    """The ids of a dead-letter request (``None``: all, sent as no ids); ``TypeError`` for anything but strs."""
    if sample_ids is None:
        return []
    if isinstance(sample_ids, (str, bytes)):
        kind = type(sample_ids).__name__
        raise TypeError(f"sample_ids must be a list of ids or None, got the single {kind} {sample_ids!r}")
    ids = list(sample_ids)
    for sample_id in ids:
        if not isinstance(sample_id, str):
            raise TypeError(f"sample ids must be str, got {sample_id!r}")
    if not ids:
        raise ValueError("sample_ids is empty: pass None for every dead letter, or name at least one")
    return _batch("sample_ids", ids)


def _batch(name: str, items: Iterable[Any]) -> list[Any]:
    """``items`` as a list of at most ``MAX_BATCH`` (a batch is one server call); ``ValueError`` otherwise."""
    batch = list(items)
    if len(batch) > functions.MAX_BATCH:
        raise ValueError(f"{name} must hold at most {functions.MAX_BATCH} items (one server call), got {len(batch)}")
    return batch


def _pending(counters: dict[Any, Any]) -> int:
    """The pending gauge from the counters (``functions.PENDING_TERMS``, as traced calls derive it on the server)."""
    values = {_text(k): int(v) for k, v in counters.items()}
    return sum(sign * values.get(name, 0) for name, sign in functions.PENDING_TERMS.items())


def _settings(values: dict[str, int]) -> str:
    return ", ".join(f"{name}={value}" for name, value in values.items())


class RedisSampleRefQueue(FrontEnd):
    """A ``LeaseQueue`` whose state lives in Redis, shared by every instance with the same ``name``.

    Same constructor and methods as ``SampleRefQueue`` plus, keyword-only:
    ``url`` (default ``$FEATURESTREAM_REDIS_URL`` or ``redis://127.0.0.1:6379/0``)
    or a ready ``client``, the queue ``name`` (a key namespace) and
    ``reconnect_timeout`` (how long a call retries while Redis is unreachable,
    e.g. restarting). Needs Redis 7.0+ (the protocol is a Redis Functions
    library, loaded on first use). Differences that follow from being shared:

    - ``clock=None`` (default) makes the Redis server's ``TIME`` the deadline
      authority, so nodes with unrelated clocks agree; ``Lease.deadline`` is
      still reported in this process's ``time.monotonic()``. An injected
      ``clock`` must be shared by every instance of the queue (tests).
    - ``stats()``, counts, dead letters and the lifecycle are global; the
      backpressure state and the store-fault figures are this instance's.
    - A lease is honoured only as the object this instance's ``acquire``
      returned (copies and other processes' leases are stale), and the
      server also checks its token, so a reclaimed lease's late ack is stale
      in every process.
    - ``max_deliveries`` and ``dedup_window`` are fixed by the first instance
      that creates the queue; a later instance with other values is refused.
    - ``on_dead_letter`` runs in the instance whose call dead-lettered the
      sample; that instance's store scrubs it.
    - ``acquire`` waits server-side (``XREAD BLOCK`` on the wake stream,
      which every call that makes a sample pending appends to while a
      consumer waits), so a put, fail, reclaim, close or drain in any process
      wakes it at once; the wait is cut short at the next lease deadline to
      reap it. A batch (``put_many``, ``acquire_many``, ``ack_many`` ...) is
      one server call of at most ``functions.MAX_BATCH`` items.
    """

    # The server-side library this class calls (a test subclass may swap in a seeded defect).
    _library: functions.Library = functions.LIBRARY
    _max_batch = functions.MAX_BATCH

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
        clock: Callable[[], float] | None = None,
        reaper_interval: float | None = None,
        tracer: Tracer | None = None,
        url: str | None = None,
        client: redis.Redis | None = None,
        name: str = "featurestream",
        reconnect_timeout: float = 30.0,
        keep_dead_letter_bytes: int = 0,
    ) -> None:
        if clock is not None and not callable(clock):
            raise TypeError(f"clock must be a callable returning seconds or None, got {clock!r}")
        check_seconds("reconnect_timeout", reconnect_timeout)
        if not isinstance(name, str) or not name or "{" in name or "}" in name:
            raise ValueError(f"name must be a non-empty str without braces (it becomes a key hash tag), got {name!r}")
        if url is not None and client is not None:
            raise ValueError("pass either url or client, not both")
        if client is not None and not isinstance(client, redis.Redis):
            raise TypeError(f"client must be a redis.Redis, got {type(client).__name__}")
        self._init_front_end(
            store, visibility_timeout, high_watermark_bytes, low_watermark_bytes, on_pause, on_resume,
            max_deliveries=max_deliveries, dedup_window=dedup_window, on_dead_letter=on_dead_letter, tracer=tracer,
            keep_dead_letter_bytes=keep_dead_letter_bytes, reaper_interval=reaper_interval,
        )  # fmt: skip
        self._server_time = clock is None
        self._clock: Callable[[], float] = clock if clock is not None else time.monotonic
        self._stale_log = StaleLog(logger)
        # Put tokens and lease tokens: this instance's random prefix and a counter (unique, and unknown to
        # other processes; cheaper than fresh randomness per call).
        self._token_prefix = secrets.token_hex(8)
        self._token_counter = itertools.count()

        self._owns_client = client is None
        if client is None:
            client = redis.Redis.from_url(url or os.environ.get("FEATURESTREAM_REDIS_URL", DEFAULT_REDIS_URL))
        self.name = name
        self._link = Link(client, name, self._library, reconnect_timeout)
        self._redis: redis.Redis = client
        self._key = self._link.key
        self._retrying = self._link.retrying
        # The header's fixed middle and end (see _header; the feed cursor goes between them).
        self._settings = f"\t{max_deliveries}\t{dedup_window}\t"
        self._trace_flag = "\t1" if tracer is not None else "\t"
        # A traced call's events carry their state as a fourth item (see functions).
        self._event_width = 4 if tracer is not None else 3
        # Traced instances: the queue's state as this instance last saw it reported (pending, outstanding, now), which
        # the events it traces itself (StoreFault, ScrubRetried) carry, as the in-process queue's carry its state.
        self._seen_state: dict[str, object] = {}
        self._issued: weakref.WeakValueDictionary[int, RedisLease] = weakref.WeakValueDictionary()
        # Lease id -> its lease machine model, for the leases this instance was issued (and, briefly, settled:
        # so a second settle the server reports names the state the first left). See _lease_model.
        self._models: dict[int, _LeaseModel] = {}
        # Samples this instance put and has not seen settled; their settles elsewhere arrive on the feed.
        self._mine: dict[str, SampleRef] = {}
        # The same samples by the exact wire bytes this instance sent: leasing one of them back skips the decode
        # (identical bytes decode to an equal ref; the in-process queue hands out the very object put, too).
        self._sent: dict[bytes, SampleRef] = {}
        self._wire: dict[str, bytes] = {}
        # Ids this instance saw settled, newest last (at most dedup_window): a re-put of one is asked of the server
        # before the store is touched, as the in-process queue refuses it from its dedup window.
        self._settled: collections.OrderedDict[str, None] = collections.OrderedDict()
        # The clock value the last call sent (None: the server's TIME), so a lease's deadline needs no reply field.
        self._sent_now: float | None = None
        self._producing = False
        self._ledger: RedisTrainingLedger | None = None
        store_uri = getattr(store, "store_uri", "") if not isinstance(store, _NoStore) else ""
        reply = (_text(v) for v in self._run("init", keep_dead_letter_bytes, store_uri))
        layout, *stored, pinned, self._feed_cursor = reply
        if layout != functions.LAYOUT:
            raise ValueError(
                f"queue {name!r} on Redis has key layout {layout!r}; this version reads layout {functions.LAYOUT!r} "
                "(drain it with the featurestream version that created it, or use another name)"
            )
        asked = {"max_deliveries": max_deliveries, "dedup_window": dedup_window}
        asked["keep_dead_letter_bytes"] = keep_dead_letter_bytes
        found = dict(zip(asked, (int(value) for value in stored), strict=True))
        if found != asked:
            raise ValueError(
                f"queue {name!r} on Redis was created with {_settings(found)}; this instance asks for "
                f"{_settings(asked)} (use the same settings everywhere, or another name)"
            )
        if store_uri and pinned != store_uri:
            raise errors.StoreMismatch(name, pinned, store_uri)
        self.keep_dead_letter_bytes = keep_dead_letter_bytes
        if reaper_interval is not None:
            start_reaper(self, reaper_interval, self._reaper_stop, name="featurestream-redis-reaper")

    # -- producer side ----------------------------------------------------
    def put(self, ref: SampleRef) -> None:
        """Enqueue ``ref`` at the tail; never blocks on backpressure.

        Raises ``TypeError`` for a non-ref, ``ValueError`` for a ref of another
        store, an id already queued, recently acked/dead (in any process) or
        still owed a scrub here, ``RuntimeError`` once closed, and the store's
        error type when its ``retain`` fails. A refused put changes nothing.
        Retried transparently while Redis is unreachable (idempotent: a put
        whose reply was lost is not refused as its own duplicate).
        """
        self._check_ref(ref)
        with self._op:
            self._admit(ref)

    def put_many(self, refs: Iterable[SampleRef]) -> None:
        """Enqueue every ref of ``refs``, in order, in one server call: all of them or none.

        Refused as a whole (changing nothing) when any single ``put`` would be
        refused -- the error is the one that ``put`` raises, naming the first
        offending sample -- and with ``ValueError`` when an id repeats.
        """
        batch = _batch("refs", refs)
        for ref in batch:
            self._check_ref(ref)
        seen: set[str] = set()
        for ref in batch:
            if ref.sample_id in seen:
                raise errors.RepeatedInBatch(ref.sample_id)
            seen.add(ref.sample_id)
        if not batch:
            return
        with self._op:
            self._put_batch_locked(batch)

    # -- consumer side ----------------------------------------------------
    def ack(self, lease: Lease) -> bool:
        """Mark ``lease``'s sample consumed: never delivered again; this process's store scrubs it.

        Returns ``True`` when this ack settled the sample, ``False`` when the
        lease was stale (reclaimed, already settled, copied, or from another
        queue or process): then nothing changed, and the rejection is logged
        once per lease. ``TypeError`` for anything that is not a ``Lease``.
        The ack stands even when the store's ``scrub`` fails: the scrub is owed
        and retried, and ``ack`` returns ``True``.
        """
        check_lease(lease, "ack")
        return self._settle_batch("ack", [lease])[0]

    def ack_many(self, leases: Iterable[Lease]) -> None:
        """``ack`` every lease of ``leases`` in one server call; each stale one is rejected on its own.

        ``TypeError`` (acking none of them) when any item is not a ``Lease``.
        """
        self._settle_batch("ack", _batch("leases", check_leases(leases, "ack_many")))

    def fail(self, lease: Lease) -> bool:
        """Give ``lease``'s sample back: redelivered from the tail, or dead once deliveries are spent.

        Returns ``True`` when this fail took effect, ``False`` for a stale
        lease (nothing changed; logged once per lease); ``TypeError`` for a
        non-lease.
        """
        check_lease(lease, "fail")
        return self._settle_batch("fail", [lease])[0]

    def fail_many(self, leases: Iterable[Lease]) -> None:
        """``fail`` every lease of ``leases`` in one server call; each stale one is rejected on its own.

        ``TypeError`` (failing none of them) when any item is not a ``Lease``.
        """
        self._settle_batch("fail", _batch("leases", check_leases(leases, "fail_many")))

    def lose(self, lease: Lease) -> bool:
        """The store lost ``lease``'s sample (``SampleLostError``): dead-letter it now, reason ``lost``.

        No redelivery could serve bytes that are gone, so none is made, whatever deliveries are left, and the
        dead letter's bytes are never kept. Returns ``False`` for a stale lease (nothing changed).
        """
        check_lease(lease, "lose")
        return self._settle_batch("fail", [lease], function="lose")[0]

    def extend(self, lease: Lease, seconds: float | None = None) -> None:
        """Push ``lease.deadline`` to now + ``seconds`` (default: the visibility timeout).

        Raises ``LeaseLost`` when the lease is not live, ``TypeError`` for a
        non-lease, ``ValueError`` for a non-positive or non-finite ``seconds``.
        """
        check_lease(lease, "extend")
        extra = self._vt.seconds if seconds is None else seconds
        check_seconds("seconds", extra, positive=True)
        key, token, _ = self._proof(lease)
        with self._op:
            status, reply_events, *rest = self._run("extend", key, token, repr(float(extra)))
            self._apply(reply_events)
            if _text(status) == "ok":
                fire(LEASE_MACHINE, "extend", self._lease_model(lease.lease_id, "extend"))
                lease.deadline = self._local_deadline(rest[0], rest[1])
                return
            if token:
                self._lost(lease.lease_id)
            raise errors.LeaseLost(lease)

    def reclaim_expired(self) -> int:
        """Redeliver (or dead-letter) every lease past its deadline, whoever held it; return how many."""
        total = 0
        while True:
            with self._op:
                _, reply_events, count, *_ = self._run("reclaim")
                self._apply(reply_events)
            total += int(count)
            # One call reaps at most REAP_LIMIT leases, to keep the server responsive.
            if int(count) < functions.REAP_LIMIT:
                return total

    # -- lifecycle and introspection -----------------------------------------
    def close(self) -> None:
        """Refuse further puts, in every process; wake this process's blocked producers (``RuntimeError``).

        ``acquire`` drains what is held, then returns ``None``.
        """
        with self._op:
            _, reply_events = self._run("close")
            self._apply(reply_events)
            self._not_full.notify_all()

    @property
    def lifecycle_state(self) -> str:
        """``open``, ``draining`` (closed, still holding samples) or ``drained``."""
        state = _text(self._retrying(self._redis.hget, self._key["meta"], "state"))
        if state == "drained" and not self._owed:
            self._reaper_stop.set()
        return state

    def training_ledger(self) -> RedisTrainingLedger:
        """The queue's training ledger (``docs/resume.md``): keys in this queue's namespace, as durable as it."""
        with self._lock:
            if self._ledger is None:
                self._ledger = RedisTrainingLedger(self._redis, self._link.prefix, self._retrying, self._holds)
            return self._ledger

    def _holds(self, sample_ids: Sequence[str]) -> set[str]:
        """Which of ``sample_ids`` the queue holds (pending or leased, put by any process); raises when Redis
        cannot tell."""
        if not sample_ids:
            return set()
        found = self._retrying(self._redis.hmget, self._key["refs"], list(sample_ids))
        return {sample_id for sample_id, value in zip(sample_ids, found, strict=True) if value is not None}

    # The reads below first retry what this instance owes its store, as every call does (no callbacks, no gc).
    def pending_count(self) -> int:
        """Samples waiting to be leased."""
        with observing(self):
            return _pending(self._retrying(self._redis.hgetall, self._key["stats"]))

    def outstanding_count(self) -> int:
        """Samples currently leased."""
        with observing(self):
            return int(self._retrying(self._redis.hlen, self._key["leases"]))

    def dead_letters(self, newest: int | None = None) -> list[DeadLetter]:
        """Samples whose deliveries were spent, oldest first; only the ``newest`` ones when it is given.

        ``newest`` reads (and decodes) just those: O(newest), not O(dead letters). ``ValueError`` naming a
        ``newest`` that is no int >= 0.
        """
        check_count("newest", newest, allow_none=True)
        if newest == 0:  # LRANGE -0 -1 would be every letter
            return []
        with observing(self):
            letters = self._retrying(self._redis.lrange, self._key["dead"], -newest if newest else 0, -1)
        return [dead_letter_from_json(raw) for raw in letters]

    def requeue_dead_letters(self, sample_ids: Iterable[str] | None = None) -> list[str]:
        """Send the dead letters ``sample_ids`` (``None``: all) back to the tail with a fresh delivery budget.

        One atomic server call, all or nothing: ``LookupError`` naming an id that is no dead letter,
        ``ValueError`` naming one whose bytes were not kept (``keep_dead_letter_bytes`` off, or over its cap)
        or that is queued again, or when the queue is drained; then nothing changed. A requeued sample leaves
        the dead letters and the dedup window (it was never acked) and is delivered again from
        ``redelivery_count`` 0; its bytes were retained all along. Returns the requeued ids, oldest dead first.
        """
        ids = _sample_ids(sample_ids)
        with self._op:
            status, reply_events, detail = self._run("requeue", self._token(), *ids)
            self._apply(reply_events)
        status = _text(status)
        if status == "ok":
            return [_text(sample_id) for sample_id in detail]
        sample_id = _text(detail)
        if status == "unknown":
            raise errors.NotDeadLetter(sample_id, "requeued", self.name)
        if status == "gone":
            raise errors.DeadLetterNotKept(sample_id, self.keep_dead_letter_bytes)
        if status == "held":
            raise errors.DeadLetterQueued(sample_id)
        raise errors.QueueDrained(self.name)

    def purge_dead_letters(self, sample_ids: Iterable[str] | None = None) -> list[str]:
        """Drop the dead letters ``sample_ids`` (``None``: all) for good; return their ids, oldest dead first.

        One atomic server call, all or nothing: ``LookupError`` naming an id that is no dead letter, and then
        nothing changed. Kept bytes are released: scrubbed in this process's store (if it has one) and, through
        the settle feed, by the producing instance's store on its next put or backpressure poll.
        """
        ids = _sample_ids(sample_ids)
        with self._op:
            status, reply_events, *rest = self._run("purge", *ids)
            self._apply(reply_events)
            if _text(status) == "ok":
                purged, released = rest
                if not isinstance(self._store, _NoStore):
                    for ref_json in released:
                        ref = ref_from_json(ref_json)
                        if ref.store_uri == getattr(self._store, "store_uri", ref.store_uri):
                            self._scrub(ref)
                return [_text(sample_id) for sample_id in purged]
        raise errors.NotDeadLetter(_text(rest[0]), "purged", self.name)

    def oldest_lease_age(self) -> float | None:
        """Seconds since the oldest live lease was issued (by the Redis server's clock), ``None`` when none is out.

        Read from the live lease records (each holds the server's ``TIME`` when it was leased): O(live leases).
        """

        def read() -> tuple[list[Any], float]:
            with self._redis.pipeline(transaction=True) as pipe:
                pipe.hvals(self._key["leases"])
                pipe.time()
                records, (seconds, micros) = pipe.execute()
            return records, seconds + micros / 1e6

        records, server_now = self._retrying(read)
        if not records:
            return None
        issued = min(lease_issued(record) for record in records)
        return max(0.0, server_now - issued)

    @classmethod
    def open(cls, url: str, name: str, *, reconnect_timeout: float = 30.0) -> RedisSampleRefQueue:
        """An operator's handle on the existing queue ``name`` at ``url``, with no feature store.

        For status (``stats``, ``dead_letters``, ``oldest_lease_age`` ...) and repair (``requeue_dead_letters``,
        ``purge_dead_letters``, ``close``); it adopts the queue's stored settings and never produces:
        ``put`` and the like raise ``RuntimeError``. ``LookupError`` when the server has no queue of that name;
        redis-py's connection errors when it cannot be reached. ``disconnect()`` it when done.
        """
        if not isinstance(url, str):
            raise TypeError(f"url must be a redis:// URL str, got {url!r}")
        if not isinstance(name, str) or not name or "{" in name or "}" in name:
            raise ValueError(f"name must be a non-empty str without braces (it becomes a key hash tag), got {name!r}")
        check_seconds("reconnect_timeout", reconnect_timeout)
        client = redis.Redis.from_url(url)
        try:
            first_contact(client, name, reconnect_timeout)
            layout, *settings = client.hmget(
                f"featurestream:{{{name}}}:meta", "layout", "max_deliveries", "dedup_window", "keep_bytes"
            )
        except BaseException:
            client.close()
            raise
        client.close()
        if layout is None:
            raise LookupError(f"no queue named {name!r} on this Redis server (no featurestream:{{{name}}}:meta)")
        max_deliveries, dedup_window, keep = (int(value) if value is not None else 0 for value in settings)
        return cls(
            _NoStore(), url=url, name=name, reconnect_timeout=reconnect_timeout,
            max_deliveries=max_deliveries, dedup_window=dedup_window, keep_dead_letter_bytes=keep,
        )  # fmt: skip

    def stats(self) -> QueueStats:
        """A consistent snapshot of the queue-wide counters and gauges (one MULTI/EXEC).

        ``store_errors`` and ``scrub_backlog`` are this instance's: store faults happen in a process's own store.
        """
        with observing(self):
            counters, outstanding = self._link.snapshot()
            values = {_text(k): int(v) for k, v in counters.items()}
            values.update(store_errors=self._store_errors, scrub_backlog=len(self._owed))
        values.update(pending=_pending(counters), outstanding=int(outstanding))
        return QueueStats(**{field.name: values.get(field.name, 0) for field in dataclasses.fields(QueueStats)})

    def lease_state_counts(self) -> dict[str, int]:
        """How many leases sit in each live state, queue-wide."""
        with observing(self):
            counters, outstanding = self._link.snapshot()
        return {"pending": _pending(counters), "leased": int(outstanding)}

    def disconnect(self) -> None:
        """Stop this instance's reaper and close its connections (when it made them); the queue stays in Redis."""
        self._reaper_stop.set()
        self._link.close()
        if self._owns_client:
            self._redis.close()

    # -- talking to the server -------------------------------------------------
    def _run(self, script: str, *args: str | int | bytes) -> Any:
        """Call one library function with the shared header (see ``_header``)."""
        return self._link.call(script, self._header, *args)

    def _header(self, script: str) -> str:
        """``now`` (empty: the server's TIME), max_deliveries, dedup_window, the feed cursor, the trace flag."""
        if self._server_time:
            self._sent_now = None
            now = ""
        else:
            self._sent_now = float(self._clock())
            now = repr(self._sent_now)
        if self._producing and script in _FEEDING:
            # Holding no unsettled puts, this instance needs no settles from before now, only the newest id.
            return f"{now}{self._settings}{self._feed_cursor if self._mine else '$'}{self._trace_flag}"
        return f"{now}{self._settings}{self._trace_flag}"

    # -- producer internals (lock held) ------------------------------------------
    def _require_store(self) -> None:
        if isinstance(self._store, _NoStore):
            raise RuntimeError(
                f"this handle on queue {self.name!r} is an operator's handle (RedisSampleRefQueue.open): it has no "
                "feature store, so it neither puts nor leases"
            )

    def _retain_batch(self, batch: list[SampleRef]) -> None:
        """Retain every sample of ``batch`` before any becomes visible, or none: a consumer in another process
        may lease, get and release one at once, and its store must then find it retained."""
        for index, ref in enumerate(batch):
            try:
                self._store.retain(ref)
            except Exception as exc:
                self._store_fault("retain", ref.sample_id, exc)
                self._reap()
                # Undo the retains (one that failed halfway must not pin the bytes either), except of ids the
                # queue holds: those retains belong to the queued samples.
                attempted = batch[: index + 1]
                held = self._held_ids([retained.sample_id for retained in attempted])
                for retained in attempted:
                    if retained.sample_id not in held:
                        self._owe("unretain", retained)
                raise errors.store_error(exc, f"put of sample {ref.sample_id!r} refused, nothing enqueued") from exc
        for ref in batch:
            self._owed.pop(ref.sample_id, None)  # an unretain owed for an earlier refused put would undo this one
        self._producing = True

    def _known(self, sample_id: str) -> bool:
        """Whether this instance put ``sample_id`` before (held, settled, or owed a scrub)."""
        return sample_id in self._mine or sample_id in self._settled or self._owes_scrub(sample_id)

    def _owes_scrub(self, sample_id: str) -> bool:
        owed = self._owed.get(sample_id)
        return owed is not None and owed[0] == "scrub"

    def _reap(self) -> None:
        """Reap due leases: a put refused before it reaches the server still reaps, as every queue call does."""
        _, reply_events, *_ = self._run("reclaim")
        self._apply(reply_events)

    def _held_ids(self, sample_ids: list[str]) -> set[str]:
        """Which of ``sample_ids`` the queue holds (pending or leased, put by any process); all of them when
        Redis cannot tell (un-retaining a queued sample would lose it, keeping an unqueued one only pins it)."""
        try:
            return self._holds(sample_ids)
        except redis.RedisError:
            logger.warning("could not tell which of %r the queue holds; their retains stay", sample_ids)
            return set(sample_ids)

    def _admit(self, ref: SampleRef, health: StoreHealth | None = None, *, if_idle: bool = False) -> bool:
        """Put ``ref``; with ``if_idle`` only into an empty queue (``False``: it was not, nothing changed).

        ``health``: the store read this put was decided on (``put_blocks_until_below``), traced with its Put.
        """
        if self._known(ref.sample_id):
            self._check_puts([ref])
        self._check_resident(ref)
        self._retain_batch([ref])
        wire = ref_to_json(ref).encode()
        status, reply_events, *rest = self._run("put", ref.sample_id, wire, self._token(), "idle" if if_idle else "")
        self._apply(reply_events, put_health=health)
        status = _text(status)
        if status == "ok":
            self._remember(ref, wire)
            if rest:
                self._settled_since(ref, rest[0])
            return True
        if status == "busy":
            self._owe("unretain", ref)
            return False
        held = bool(int(rest[0])) if status == "closed" else status in ("held", "kept")
        self._refuse(status, ref, held=held, outcome=rest)

    def _put_batch_locked(self, batch: list[SampleRef]) -> None:
        if any(self._known(ref.sample_id) for ref in batch):
            self._check_puts(batch)
        for ref in batch:
            self._check_resident(ref)
        self._retain_batch(batch)
        wires = [ref_to_json(ref).encode() for ref in batch]
        items: list[str | bytes] = []
        for ref, wire in zip(batch, wires, strict=True):
            items += [ref.sample_id, wire]
        status, reply_events, *rest = self._run("put_many", self._token(), *items)
        self._apply(reply_events)
        status = _text(status)
        if status == "ok":
            for ref, wire in zip(batch, wires, strict=True):
                self._remember(ref, wire)
            for ref, settled in zip(batch, rest[0] if rest else (), strict=False):
                self._settled_since(ref, settled)
            return
        offender, outcome, held = rest
        offending = next((ref for ref in batch if ref.sample_id == _text(offender)), batch[0])
        for ref, flag in zip(batch, held, strict=True):
            if not int(flag) and ref is not offending:
                self._owe("unretain", ref)
        self._refuse(status, offending, held=bool(int(held[batch.index(offending)])), outcome=[outcome])

    def _check_puts(self, batch: list[SampleRef]) -> None:
        """Before retaining ids this instance put already, or still owes a scrub: the server refuses them first
        (closed, queued, in the dedup window -- counted there) without any store call, as the in-process queue
        does; an id that passes but is owed a scrub is refused here. One extra call, on re-puts only."""
        items = [part for ref in batch for part in (ref.sample_id, "")]
        status, reply_events, *rest = self._run("put_many", "?" + self._token(), *items)
        self._apply(reply_events)
        status = _text(status)
        if status != "fresh":
            offending = next((ref for ref in batch if ref.sample_id == _text(rest[0])), batch[0])
            self._refuse(status, offending, held=True, outcome=[rest[1]])  # nothing was retained: nothing to undo
        owed = next((ref for ref in batch if self._owes_scrub(ref.sample_id)), None)
        if owed is not None:
            raise errors.ScrubOwed(owed.sample_id)

    def _refuse(self, status: str, ref: SampleRef, *, held: bool, outcome: list[Any]) -> NoReturn:
        """Raise ``put``'s error for a refusal; un-retain the sample unless the queue holds one of that id."""
        if not held:
            self._owe("unretain", ref)
        if status == "closed":
            raise errors.QueueClosed(ref.sample_id)
        if status == "held":
            raise errors.DuplicateSample(ref.sample_id)
        if status == "kept":
            raise errors.KeptDeadLetter(ref.sample_id)
        raise errors.SettledSample(ref.sample_id, _text(outcome[0]))

    def _settled_since(self, ref: SampleRef, settled: object) -> None:
        """A retried put whose first run's reply was lost: the server says whether the sample settled since
        (``functions``' ``settled_since``). Its settle was fed before this instance knew the sample was its own,
        so this is where its store learns it; a dead letter whose bytes are kept stays retained."""
        if int(settled) == 1:
            self._scrub(ref)

    def _token(self) -> str:
        """A fresh token (the server appends an item number to it for the leases or puts of a batch)."""
        return f"{self._token_prefix}{next(self._token_counter)}."

    def _remember(self, ref: SampleRef, wire: bytes) -> None:
        self._mine[ref.sample_id] = ref
        self._sent[wire] = ref
        self._wire[ref.sample_id] = wire

    def _put_flowing(self, ref: SampleRef) -> bool:
        """Flowing and staying so: put at once, as the put function itself reaps and checks the lifecycle."""
        backpressure = self._backpressure
        health = self._read_health(ref) if backpressure.state == "flowing" else None
        if health is not None and not backpressure.should_pause(health):
            self._admit(ref, health)
            return True
        return False

    def _put_round(self, ref: SampleRef) -> bool:
        """Like the in-process queue: reap, refuse once closed, and only then move the hysteresis."""
        _, reaped_events, _, state, held, left = self._run("reclaim")
        self._apply(reaped_events)
        if left:  # traced: the state the reclaim left, which this round's own events report
            self._seen_state = event_state(left)
        if self._owed:  # a scrub the reap just owed: retry it before judging residency
            self._pay_owed()
        if _text(state) != "open":
            raise errors.QueueClosed(ref.sample_id)
        return bool(int(held))

    def _after_health_fault(self) -> None:
        self._reap()  # the call still reaps (the fast path reads health before its put would have)

    def _count_pause(self) -> None:
        self._retrying(self._redis.hincrby, self._key["stats"], "producer_pauses", 1)

    # -- consumer internals ------------------------------------------------------
    def _lease_up_to(self, n: int, wait: float) -> list[RedisLease]:
        """Up to ``n`` leases from one server call, waiting server-side up to ``wait`` seconds for the first."""
        self._require_store()
        give_up = time.monotonic() + wait
        remaining = wait
        while True:
            base = self._token()
            with self._op:
                # the server registers this wait, so a put (in any process) while it lasts wakes it
                vt = repr(float(self._vt.seconds))
                status, reply_events, *rest = self._run("acquire", vt, base, n, repr(float(remaining)))
                self._apply(reply_events)
                status = _text(status)
                if status == "ok":
                    return self._issue(rest, base)
                if status == "drained":
                    return []
            remaining = give_up - time.monotonic()
            if remaining <= 0:
                return []
            last_wake, until_deadline = (_text(v) for v in rest)
            block = remaining
            if until_deadline:
                block = min(block, max(float(until_deadline), 0.0))
            # BLOCK 0 would mean forever: wait at least a millisecond.
            block_ms = max(1, math.ceil(block * 1000))
            self._retrying(self._redis.xread, {self._key["wake"]: last_wake}, count=1, block=block_ms)
            remaining = max(0.0, give_up - time.monotonic())

    def _issue(self, reply: list[Any], base: str) -> list[RedisLease]:
        """Leases from the server's ``key, n, ref`` triples; lease i (from 1) has token ``base + str(i)``."""
        # The server's deadline is the now it used plus vt: this process's clock, or exactly the now we sent.
        deadline = (self._clock() if self._sent_now is None else self._sent_now) + self._vt.seconds
        leases = []
        for index in range(0, len(reply), 3):
            key, n, ref_json = reply[index : index + 3]
            ref = self._sent.get(ref_json)
            lease = RedisLease(
                ref=ref if ref is not None else ref_from_json(ref_json),
                deadline=deadline,
                visibility_timeout=self._vt,
                redelivery_count=int(n),
                lease_id=int(key),
                token=f"{base}{index // 3 + 1}",
            )
            self._issued[lease.lease_id] = lease
            model = self._models.get(lease.lease_id)
            if model is None:
                model = self._models[lease.lease_id] = _LeaseModel(lease.lease_id, lease.ref.sample_id)
            fire(LEASE_MACHINE, "lease", model)
            leases.append(lease)
        if len(self._models) > 2 * len(self._issued) + 1024:
            self._prune_models()
        return leases

    def _prune_models(self) -> None:
        """Forget the models of settled leases and of leases whose object is gone (nothing can settle those
        here any more): the leased ones still issued stay."""
        issued = self._issued
        self._models = {
            lease_id: model
            for lease_id, model in self._models.items()
            if model.state == "leased" and lease_id in issued
        }

    def _lease_model(self, lease_id: int, trigger: str) -> _LeaseModel:
        """The model of a lease this instance was issued, for ``trigger`` the server reported on it; a lease it
        holds no model of cannot have been settled or extended by it: ``IllegalTransition``."""
        model = self._models.get(lease_id)
        if model is None:
            raise errors.IllegalTransition(LEASE.name, f"lease {lease_id}", "not issued to this instance", trigger)
        return model

    def _lost(self, lease_id: int) -> None:
        """The server refused this instance's own proof of a lease its model holds as leased: some call this
        instance did not see reclaimed it."""
        model = self._models.get(lease_id)
        if model is not None and model.state == "leased":
            fire(LEASE_MACHINE, "reclaim", model)

    def _reclaimed(self, lease_id: int, sample_id: str) -> None:
        """A reclaim the server reported: of a lease this instance holds, or of another instance's (which can only
        have been leased), as far as this instance learns of it."""
        model = self._models.get(lease_id) or _LeaseModel(lease_id, sample_id, "leased")
        fire(LEASE_MACHINE, "reclaim", model)

    def _proof(self, lease: object) -> tuple[str, str, str]:
        """(lease key, token, sample id) to present to the server; the token is empty unless ``lease``
        is the very object this instance issued, so copies and foreign leases are rejected as stale."""
        lease_id = getattr(lease, "lease_id", None)
        if type(lease_id) is not int:
            return "", "", ""
        sample_id = getattr(getattr(lease, "ref", None), "sample_id", "")
        issued = self._issued.get(lease_id)
        token = issued.token if issued is lease and issued is not None else ""
        return f"{lease_id:016d}", token, sample_id if isinstance(sample_id, str) else ""

    def _settle_batch(self, trigger: str, leases: list[Any], function: str | None = None) -> list[bool]:
        """Ack or fail ``leases`` in one server call (``function``, default ``trigger``); each is settled or
        rejected as stale on its own.

        Returns, per lease, whether it took effect."""
        if not leases:
            return []
        proofs, seen = [], set()
        for lease in leases:
            key, token, sample_id = self._proof(lease)
            # A lease repeated in the batch: its second settle is stale, as a second ack() would be.
            proofs.append((key, token if key not in seen else "", sample_id))
            seen.add(key)
        with self._op:
            parts = (part for proof in proofs for part in proof)
            statuses, reply_events = self._run(function or trigger, *parts)
            texts = [_text(raw) for raw in statuses]
            # Acked samples are scrubbed at their "ack" event (traced calls get one), so a failed scrub is traced
            # right after its Ack, before a Drain the same call caused; untraced calls scrub them after.
            settled = zip(leases, proofs, texts, strict=True)
            acked = {key: lease.ref for lease, (key, _, _), status in settled if status == "ok" and trigger == "ack"}
            self._apply(reply_events, acked)
            for ref in acked.values():
                self._scrub(ref)
            for lease, (_, token, sample_id), status in zip(leases, proofs, texts, strict=True):
                if status == "ok" or status == "again":
                    fire(LEASE_MACHINE, trigger, self._lease_model(lease.lease_id, trigger))
                elif token:
                    self._lost(lease.lease_id)
                if token:
                    self._issued.pop(lease.lease_id, None)
                # A fail that dead-letters is scrubbed through its "dead" event; "again" is a retried settle
                # whose first run's reply (and events) was lost: acked, or failed into the dead letters.
                if status == "again":
                    self._trace(_ACTIONS[trigger], sample_id=sample_id, lease_id=lease.lease_id)
                    if trigger == "fail":
                        self._trace(_ACTIONS["dead"], sample_id=sample_id)
                    self._scrub(lease.ref)
                elif status != "ok":
                    why = "it was settled or reclaimed already" if token else _NOT_ISSUED_HERE
                    self._stale_log.rejected(trigger, lease, why)
        return [status in ("ok", "again") for status in texts]

    def _local_deadline(self, deadline: object, now: object) -> float:
        """A server deadline in this process's clock: exact under an injected clock, offset from TIME otherwise."""
        if self._server_time:
            return self._clock() + (float(_text(deadline)) - float(_text(now)))
        return float(_text(deadline))

    # -- the server's events, store calls, callbacks -------------------------------
    def _apply(
        self, reply_events: list[Any], acked: dict[str, SampleRef] | None = None, put_health: StoreHealth | None = None
    ) -> None:
        """Trace the server's events in order, scrub settled samples here, queue the dead-letter callbacks.

        ``acked``: lease key -> ref of this call's acks, scrubbed (and removed) at their "ack" event;
        ``put_health``: the store read a put was decided on, whose resident bytes its Put reports. Called
        inside ``self._op`` (lock held), so one instance's trace follows the server's order. A store fault while
        scrubbing is owed, never raised: it belongs to a sample, not to this caller.
        """
        width = self._event_width
        for index in range(0, len(reply_events), width):
            kind, first, second = (_text(v) for v in reply_events[index : index + 3])
            action = _ACTIONS.get(kind, kind)
            values = event_state(reply_events[index + 3]) if width == 4 and kind != "retired" else {}
            if values:
                self._seen_state = {name: values[name] for name in ("pending", "outstanding", "now")}
            if kind in ("lease", "extend", "ack", "fail", "reclaim"):
                if kind == "reclaim":
                    self._reclaimed(int(second), first)
                self._trace(action, sample_id=first, lease_id=int(second), **values)
                if kind == "ack" and acked and second in acked:
                    self._scrub(acked.pop(second))
            elif kind == "put" and put_health is not None:
                self._trace(action, sample_id=first, resident_bytes=put_health.resident_bytes, **values)
            elif kind in ("put", "dedup", "requeue", "purge"):
                self._trace(action, sample_id=first, **values)
            elif kind in ("stale", "forged"):  # forged: a copy of a live lease, not the object acquire returned
                lease_id = int(second) if second else None
                self._trace(action, op=first, lease_id=lease_id, forged=kind == "forged", **values)
            elif kind == "retired":
                self._feed_cursor = second
                mine = self._mine.get(first)
                if mine is not None:
                    self._scrub(mine)
            elif kind in ("dead", "kept"):
                self._trace(action, sample_id=first, kept=kind == "kept", **values)
                dead = dead_letter_from_json(second)
                if self._on_dead_letter is not None:
                    self._outbox.append((self._on_dead_letter, dead))
                if kind == "dead":  # a kept one stays retained (and in _mine) until requeued and settled, or purged
                    self._scrub(dead.ref)
            else:  # close, drain
                self._trace(action, **values)

    def _scrubbing(self, ref: SampleRef) -> None:
        if self.dedup_window:
            self._settled[ref.sample_id] = None
            self._settled.move_to_end(ref.sample_id)
            if len(self._settled) > self.dedup_window:
                self._settled.popitem(last=False)
        self._mine.pop(ref.sample_id, None)
        self._sent.pop(self._wire.pop(ref.sample_id, b""), None)

    def _trace_state(self, action: str, **fields: object) -> None:
        """Trace an event this instance makes itself (a store fault, a paid scrub, a pause or resume) with the
        queue state its last call reported (``_seen_state``), as the in-process queue's carry its own: exact for
        this instance, whose lock it holds since that call (another process may have changed the queue since)."""
        self._trace(action, **fields, **self._seen_state)

    def _trace(self, action: str, **fields: object) -> None:
        if self._tracer is not None:
            self._tracer(action, fields)


def list_queues(url: str, *, reconnect_timeout: float = 30.0) -> dict[str, str]:
    """The featurestream queues on the Redis server at ``url``: name -> lifecycle state, sorted by name.

    Reads their ``meta`` keys (a ``SCAN``, never ``KEYS``); changes nothing. ``RedisUnreachable`` /
    ``NotRedisServer`` as for a queue's first connection.
    """
    check_seconds("reconnect_timeout", reconnect_timeout)
    client = redis.Redis.from_url(url)
    try:
        first_contact(client, None, reconnect_timeout)
        prefix, suffix = "featurestream:{", "}:meta"
        keys = sorted(_text(key) for key in client.scan_iter(match=f"{prefix}*{suffix}", count=1000))
        with client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hget(key, "state")
            states = [_text(state) if state is not None else "unknown" for state in pipe.execute()]
        return {key[len(prefix) : -len(suffix)]: state for key, state in zip(keys, states, strict=True)}
    finally:
        client.close()


class _NoStore(FeatureStore):
    """The store of an operator's handle (``RedisSampleRefQueue.open``): nothing to retain or read, so every
    producing or consuming call fails; health and gc are empty."""

    store_uri = "none://operator-handle"

    def _refuse(self, *_: object, **__: object) -> Any:
        raise RuntimeError("this is an operator's handle (RedisSampleRefQueue.open): it has no feature store")

    put = get = release = retain = unretain = scrub = _refuse  # type: ignore[assignment]

    def gc(self) -> int:
        return 0

    def health(self) -> StoreHealth:
        return StoreHealth(0, 0, 0, False, True)

    def close(self) -> None:
        pass

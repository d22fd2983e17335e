"""``RedisSampleRefQueue``: the lease / ack / fail queue with its state in Redis Streams.

Producers and consumers in different processes or on different machines
share one queue by naming the same Redis server and queue ``name``. The
protocol is the in-process ``SampleRefQueue``'s, with every state change made
by one atomic call of a server-side Lua function (Redis 7.0+; see
``featurestream.backends.redis.functions`` for the library and the key layout):

- a delivery attempt is a stream entry read through a consumer group; a
  failed or reclaimed sample is appended to the tail as a new entry with
  ``redelivery_count + 1``, or dead-lettered once ``max_deliveries`` is spent;
- a lease carries a secret token; ack / fail / extend succeed only when the
  function finds that exact token on the live lease, so a reclaimed lease's late
  ack changes nothing, whichever process sends it;
- lease deadlines live in a sorted set scored by the server's ``TIME`` (or by
  the injected ``clock``), and every call reaps due leases first;
- refs cross the wire as strict JSON (``featurestream.backends.redis.wire``), never pickle.

Each process binds the queue to its own store instance: the putting process
``retain``s, and whichever process settles a sample (the acker, or the
process whose call reaped and dead-lettered it) ``scrub``s it in its store.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import secrets
import time
import weakref
from collections.abc import Callable
from typing import Any

try:
    import redis  # redis.exceptions is loaded by the package itself
except ImportError as exc:  # pragma: no cover - exercised only without the optional dependency
    raise ImportError(
        "RedisSampleRefQueue needs redis-py: pip install 'featurestream[redis]' (or pip install 'redis>=5')"
    ) from exc

from featurestream.backends.redis import functions as _redis_scripts
from featurestream.backends.redis.wire import dead_letter_from_json, ref_from_json, ref_to_json
from featurestream.core import events
from featurestream.core.checks import check_seconds
from featurestream.core.lease import DeadLetter, Lease, VisibilityTimeout
from featurestream.core.queue import (
    DEFAULT_DEDUP_WINDOW,
    DEFAULT_MAX_DELIVERIES,
    LeaseLost,
    QueueStats,
    SampleRefQueue,
    Tracer,
    _start_reaper,
)
from featurestream.core.refs import SampleRef
from featurestream.stores.base import FeatureStore, StoreHealth

__all__ = ["DEFAULT_REDIS_URL", "RedisLease", "RedisSampleRefQueue"]

logger = logging.getLogger(__name__)

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"

# Server event kind -> tracer action; the lease and lifecycle machines are the source of these names.
# The server reports events by machine trigger; these are the server's extra kinds.
_ACTIONS = {
    **events.TRIGGER_EVENTS,
    "put": events.PUT,
    "dead": events.DEAD_LETTER,
    "dedup": events.DEDUP_REFUSED,
    "stale": events.STALE_REJECTED,
}

_RETRYABLE = (redis.ConnectionError, redis.TimeoutError)


@dataclasses.dataclass
class RedisLease(Lease):
    """A ``Lease`` issued by a ``RedisSampleRefQueue``; ``token`` proves it to the server."""

    token: str = dataclasses.field(default="", repr=False)


def _text(value: object) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _pending(counters: dict[Any, Any]) -> int:
    """The pending gauge from the counters: every stream entry is a put or a redelivery, minus those leased."""
    values = {_text(k): int(v) for k, v in counters.items()}
    redelivered = values.get("failed", 0) + values.get("reclaimed", 0) - values.get("dead_lettered", 0)
    return values.get("put", 0) + redelivered - values.get("leased", 0)


class RedisSampleRefQueue(SampleRefQueue):
    """``SampleRefQueue`` whose state lives in Redis, shared by every instance with the same ``name``.

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
      backpressure state is this producer's, from its own store's ``health()``.
    - A lease is honoured only as the object this instance's ``acquire``
      returned (copies and other processes' leases are stale), and the
      server also checks its token, so a reclaimed lease's late ack is stale
      in every process.
    - ``max_deliveries`` and ``dedup_window`` are fixed by the first instance
      that creates the queue; a later instance with other values is refused.
    - ``on_dead_letter`` runs in the instance whose call dead-lettered the
      sample; that instance's store scrubs it.
    """

    # The server-side library this class calls (a test subclass may swap in a seeded defect).
    _library: _redis_scripts.Library = _redis_scripts.LIBRARY

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
        clock: Callable[[], float] | None = None,
        reaper_interval: float | None = None,
        tracer: Tracer | None = None,
        url: str | None = None,
        client: redis.Redis | None = None,
        name: str = "featurestream",
        reconnect_timeout: float = 30.0,
    ) -> None:
        if clock is not None and not callable(clock):
            raise TypeError(f"clock must be a callable returning seconds or None, got {clock!r}")
        if reaper_interval is not None:
            check_seconds("reaper_interval", reaper_interval, positive=True)
        check_seconds("reconnect_timeout", reconnect_timeout)
        if not isinstance(name, str) or not name or "{" in name or "}" in name:
            raise ValueError(f"name must be a non-empty str without braces (it becomes a key hash tag), got {name!r}")
        if url is not None and client is not None:
            raise ValueError("pass either url or client, not both")
        if client is not None and not isinstance(client, redis.Redis):
            raise TypeError(f"client must be a redis.Redis, got {type(client).__name__}")
        # The reaper is started below, once the connection exists.
        super().__init__(
            store,
            visibility_timeout,
            high_watermark_bytes,
            low_watermark_bytes,
            on_pause,
            on_resume,
            max_deliveries=max_deliveries,
            dedup_window=dedup_window,
            on_dead_letter=on_dead_letter,
            clock=clock if clock is not None else time.monotonic,
            reaper_interval=None,
            tracer=tracer,
        )
        self._server_time = clock is None
        self._owns_client = client is None
        if client is None:
            client = redis.Redis.from_url(url or os.environ.get("FEATURESTREAM_REDIS_URL", DEFAULT_REDIS_URL))
        self._redis: redis.Redis = client
        self.name = name
        self._reconnect_timeout = reconnect_timeout
        self._prefix = f"featurestream:{{{name}}}:"
        self._key = {key: self._prefix + key for key in _redis_scripts.KEY_NAMES}
        self._load_library()
        self._issued: weakref.WeakValueDictionary[int, RedisLease] = weakref.WeakValueDictionary()
        # Samples this instance put and has not seen settled; their settles elsewhere arrive on the feed.
        self._mine: dict[str, SampleRef] = {}
        # The same samples by the exact wire bytes this instance sent: leasing one of them back skips the decode
        # (identical bytes decode to an equal ref; the in-process queue hands out the very object put, too).
        self._sent: dict[bytes, SampleRef] = {}
        self._wire: dict[str, bytes] = {}
        # The clock value the last call sent (None: the server's TIME), so a lease's deadline needs no reply field.
        self._sent_now: float | None = None
        self._producing = False
        layout, stored_max, stored_window, self._feed_cursor = (_text(v) for v in self._run("init"))
        if (int(stored_max), int(stored_window)) != (max_deliveries, dedup_window):
            raise ValueError(
                f"queue {name!r} on Redis was created with max_deliveries={stored_max}, dedup_window={stored_window}; "
                f"this instance asks for max_deliveries={max_deliveries}, dedup_window={dedup_window} "
                "(use the same settings everywhere, or another name)"
            )
        if layout != _redis_scripts.LAYOUT:
            raise ValueError(
                f"queue {name!r} on Redis has key layout {layout!r}; "
                f"this version reads layout {_redis_scripts.LAYOUT!r}"
            )
        if reaper_interval is not None:
            _start_reaper(self, reaper_interval)

    # -- producer side ----------------------------------------------------
    def put(self, ref: SampleRef) -> None:
        """Enqueue ``ref`` at the tail; never blocks on backpressure.

        Raises ``TypeError`` for a non-ref, ``ValueError`` for a ref of another
        store, an id already queued or recently acked/dead (in any process),
        ``RuntimeError`` once closed. A refused put changes nothing. Retried
        transparently while Redis is unreachable (idempotent: a put whose
        reply was lost is not refused as its own duplicate).
        """
        self._check_ref(ref)
        with self._operation():
            self._put_locked(ref)

    def put_blocks_until_below(
        self,
        ref: SampleRef,
        poll_interval: float = 0.05,
        abort_when: Callable[[], bool] | None = None,
    ) -> None:
        """Enqueue ``ref``, first waiting while this producer is paused by its store's backpressure.

        Pauses at/above the high watermark, resumes at/below the low one, and
        keeps its state inside the band. Wakes on every settle this process
        makes and at least every ``poll_interval`` seconds (settles in other
        processes show only through the store's ``health()``). Raises
        ``RuntimeError`` when the queue is closed or ``abort_when()`` is true.
        """
        self._check_ref(ref)
        check_seconds("poll_interval", poll_interval)
        while True:
            if abort_when is not None and abort_when():
                raise RuntimeError(f"put of sample {ref.sample_id!r} aborted: abort_when() returned True")
            with self._operation():
                if self._backpressure.state == "flowing" and not self._should_pause(self._store.health()):
                    # Flowing and staying so: the put script itself reaps and checks the lifecycle.
                    self._put_locked(ref)
                    return
                # Like the in-process queue: reap, refuse once closed, and only then move the hysteresis.
                _, events, _, state = self._run("reclaim")
                self._apply(events)
                if _text(state) != "open":
                    raise RuntimeError(f"cannot put sample {ref.sample_id!r}: the queue is closed")
                health = self._store.health()
                callback = self._update_backpressure(health)
                if callback is not None:
                    if self._backpressure.state == "paused":
                        self._retrying(self._redis.hincrby, self._key["stats"], "producer_pauses", 1)
                    self._outbox.append((callback, health))
                    continue
                self._not_full.wait(poll_interval)

    # -- consumer side ----------------------------------------------------
    def acquire(self, poll_interval: float = 0.05, *, timeout: float | None = None) -> RedisLease | None:
        """Lease the next ref, waiting up to ``timeout`` (default ``poll_interval``) seconds.

        The wait is server-side (``XREAD BLOCK`` on the delivery and wake
        streams), so a put, fail, reclaim, close or drain in any process wakes
        it at once; it is also cut short at the next lease deadline to reap it.
        Returns ``None`` when the wait ends empty-handed; ``is_closed`` tells a
        transient empty poll from a closed, drained queue (which returns at once).
        """
        wait = poll_interval if timeout is None else timeout
        check_seconds("timeout" if timeout is not None else "poll_interval", wait)
        give_up = time.monotonic() + wait
        while True:
            token = secrets.token_hex(8)
            with self._operation():
                status, events, *rest = self._run("acquire", repr(float(self._vt.seconds)), token)
                self._apply(events)
                status = _text(status)
                if status == "ok":
                    return self._issue(rest, token)
                if status == "drained":
                    return None
            remaining = give_up - time.monotonic()
            if remaining <= 0:
                return None
            last_entry, last_wake, until_deadline = (_text(v) for v in rest)
            if until_deadline:
                remaining = min(remaining, max(float(until_deadline), 0.0))
            # BLOCK 0 would mean forever: wait at least a millisecond.
            block_ms = max(1, math.ceil(remaining * 1000))
            self._retrying(
                self._redis.xread,
                {self._key["stream"]: last_entry, self._key["wake"]: last_wake},
                count=1,
                block=block_ms,
            )

    def ack(self, lease: Lease) -> None:
        """Mark ``lease``'s sample consumed: never delivered again; this process's store scrubs it.

        A stale lease (reclaimed, already settled, copied, or from another
        queue or process) is rejected and changes nothing.
        """
        self._settle("ack", lease)

    def fail(self, lease: Lease) -> None:
        """Give ``lease``'s sample back: redelivered from the tail, or dead once deliveries are spent.

        A stale lease is rejected and changes nothing.
        """
        self._settle("fail", lease)

    def extend(self, lease: Lease, seconds: float | None = None) -> None:
        """Push ``lease.deadline`` to now + ``seconds`` (default: the visibility timeout).

        Raises ``LeaseLost`` when the lease is not live, ``ValueError`` for a
        non-positive or non-finite ``seconds``.
        """
        extra = self._vt.seconds if seconds is None else seconds
        check_seconds("seconds", extra, positive=True)
        key, token, _ = self._proof(lease)
        with self._operation():
            status, events, *rest = self._run("extend", key, token, repr(float(extra)))
            self._apply(events)
            if _text(status) == "ok":
                lease.deadline = self._local_deadline(rest[0], rest[1])
                return
            sample_id = getattr(getattr(lease, "ref", None), "sample_id", None)
            raise LeaseLost(
                f"lease {getattr(lease, 'lease_id', lease)} of sample {sample_id!r} is not live; "
                "stop working on it (it was settled or reclaimed)"
            )

    def reclaim_expired(self) -> int:
        """Redeliver (or dead-letter) every lease past its deadline, whoever held it; return how many."""
        total = 0
        while True:
            with self._operation():
                _, events, count, _ = self._run("reclaim")
                self._apply(events)
            total += int(count)
            # A script reaps at most REAP_LIMIT leases, to keep the server responsive.
            if int(count) < 1000:
                return total

    # -- lifecycle and introspection -----------------------------------------
    def close(self) -> None:
        """Refuse further puts, in every process; ``acquire`` drains what is held, then returns ``None``."""
        with self._operation():
            _, events = self._run("close")
            self._apply(events)

    @property
    def is_closed(self) -> bool:
        """Whether ``close`` was called on this queue by any instance (not whether it is drained yet)."""
        return self.lifecycle_state != "open"

    @property
    def lifecycle_state(self) -> str:
        """``open``, ``draining`` (closed, still holding samples) or ``drained``."""
        state = _text(self._retrying(self._redis.hget, self._key["meta"], "state"))
        if state == "drained":
            self._reaper_stop.set()
        return state

    def pending_count(self) -> int:
        """Samples waiting to be leased."""
        return _pending(self._retrying(self._redis.hgetall, self._key["stats"]))

    def outstanding_count(self) -> int:
        """Samples currently leased."""
        return int(self._retrying(self._redis.hlen, self._key["leases"]))

    def dead_letters(self) -> list[DeadLetter]:
        """Samples whose deliveries were spent, oldest first."""
        return [dead_letter_from_json(raw) for raw in self._retrying(self._redis.lrange, self._key["dead"], 0, -1)]

    def stats(self) -> QueueStats:
        """A consistent snapshot of the queue-wide counters and gauges (one MULTI/EXEC)."""
        counters, outstanding = self._retrying(self._snapshot)
        values = {_text(k): int(v) for k, v in counters.items()}
        names = [field.name for field in dataclasses.fields(QueueStats) if field.name not in ("pending", "outstanding")]
        return QueueStats(
            **{name: values.get(name, 0) for name in names}, pending=_pending(counters), outstanding=int(outstanding)
        )

    def lease_state_counts(self) -> dict[str, int]:
        """How many leases sit in each live state, queue-wide."""
        counters, outstanding = self._retrying(self._snapshot)
        return {"pending": _pending(counters), "leased": int(outstanding)}

    def disconnect(self) -> None:
        """Stop this instance's reaper and close its connections (when it made them); the queue stays in Redis."""
        self._reaper_stop.set()
        if self._owns_client:
            self._redis.close()

    # -- internals -------------------------------------------------------------
    def _load_library(self) -> None:
        """``FUNCTION LOAD`` this version's library unless the server already has it (it persists with the data)."""
        try:
            self._retrying(self._redis.function_load, self._library.source)
        except redis.ResponseError as exc:
            if "already exists" in str(exc):
                return
            if "unknown command" in str(exc).lower():
                raise RuntimeError(
                    f"RedisSampleRefQueue needs Redis 7.0+ (Redis Functions); the server said: {exc}"
                ) from None
            raise

    def _run(self, script: str, *args: str | int) -> Any:
        """Call one library function with the shared header (now, max_deliveries, dedup_window, feed cursor)."""
        function = self._library.function(script)
        feeds = self._producing and script in ("put", "reclaim")

        def call() -> Any:
            self._sent_now = None if self._server_time else float(self._clock())
            now = "" if self._sent_now is None else repr(self._sent_now)
            # Holding no unsettled puts, this instance needs no settles from before now, only the newest id.
            cursor = (self._feed_cursor if self._mine else "$") if feeds else ""
            trace = "1" if self._tracer is not None else ""
            header = f"{now}\t{self.max_deliveries}\t{self.dedup_window}\t{cursor}\t{trace}"
            try:
                return self._redis.fcall(function, 1, self._prefix, header, *args)
            except redis.ResponseError as exc:
                if "function not found" not in str(exc).lower():
                    raise
            # A server restarted without persistence, or FUNCTION FLUSHed: load the library again.
            self._load_library()
            return self._redis.fcall(function, 1, self._prefix, header, *args)

        return self._retrying(call)

    def _retrying(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call ``call``, retrying with backoff while Redis is unreachable, for up to ``reconnect_timeout``.

        Only connection-level errors are retried: every script is idempotent
        under a retry after a lost reply (put by its put token, ack/fail by the
        dedup record of the lease that settled it; a retried acquire leaves a
        lease nobody holds, which expires and is redelivered).
        """
        give_up = time.monotonic() + self._reconnect_timeout
        delay = 0.02
        while True:
            try:
                return call(*args, **kwargs)
            except _RETRYABLE as exc:
                if time.monotonic() + delay > give_up:
                    raise
                logger.warning("Redis unreachable (%s); retrying in %.2fs", exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def _snapshot(self) -> tuple[dict[Any, Any], int]:
        with self._redis.pipeline(transaction=True) as pipe:
            pipe.hgetall(self._key["stats"])
            pipe.hlen(self._key["leases"])
            counters, outstanding = pipe.execute()
        return counters, outstanding

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

    def _settle(self, trigger: str, lease: Lease) -> None:
        key, token, sample_id = self._proof(lease)
        with self._operation():
            status, events, *_ = self._run(trigger, key, token, sample_id)
            status = _text(status)
            self._apply(events)
            if token:
                self._issued.pop(lease.lease_id, None)
            # A fail that dead-letters is scrubbed through its "dead" event; "again" is a retried settle
            # whose first run's reply (and events) was lost: acked, or failed into the dead letters.
            if status == "again":
                self._trace(_ACTIONS[trigger], sample_id=sample_id, lease_id=lease.lease_id)
                if trigger == "fail":
                    self._trace(_ACTIONS["dead"], sample_id=sample_id)
            if status == "again" or (status == "ok" and trigger == "ack"):
                self._scrub(lease.ref)

    def _issue(self, reply: list[Any], token: str) -> RedisLease:
        key, n, ref_json = reply
        ref = self._sent.get(ref_json)
        # The server's deadline is the now it used plus vt: this process's clock, or exactly the now we sent.
        now = self._clock() if self._sent_now is None else self._sent_now
        lease = RedisLease(
            ref=ref if ref is not None else ref_from_json(ref_json),
            deadline=now + self._vt.seconds,
            visibility_timeout=self._vt,
            redelivery_count=int(n),
            lease_id=int(key),
            token=token,
        )
        self._issued[lease.lease_id] = lease
        return lease

    def _local_deadline(self, deadline: object, now: object) -> float:
        """A server deadline in this process's clock: exact under an injected clock, offset from TIME otherwise."""
        if self._server_time:
            return self._clock() + (float(_text(deadline)) - float(_text(now)))
        return float(_text(deadline))

    def _put_locked(self, ref: SampleRef) -> None:
        # Retain before the sample becomes visible: a consumer in another process may lease, get and release
        # it at once, and its store must then find it retained. A refused put of a sample nobody queues
        # undoes that, so refusal leaves the store as it was.
        self._store.retain(ref)
        self._producing = True
        wire = ref_to_json(ref).encode()
        status, events, *rest = self._run("put", ref.sample_id, wire, secrets.token_hex(8))
        self._apply(events)
        status = _text(status)
        if status == "ok":
            self._mine[ref.sample_id] = ref
            self._sent[wire] = ref
            self._wire[ref.sample_id] = wire
        elif status == "closed":
            if not int(rest[0]):  # a queued sample of that id keeps its retain
                self._store.unretain(ref)
            raise RuntimeError(f"cannot put sample {ref.sample_id!r}: the queue is closed")
        elif status == "held":  # the queued sample of that id keeps its retain
            raise ValueError(f"sample {ref.sample_id!r} is already queued; ids must be unique")
        else:
            self._store.unretain(ref)
            raise ValueError(
                f"sample {ref.sample_id!r} was already {_text(rest[0])}; re-puts of settled samples are refused "
                "(discard the duplicate from the store)"
            )

    def _apply(self, events: list[Any]) -> None:
        """Trace the server's events in order, scrub dead-lettered samples here, queue the dead-letter callbacks.

        Called inside ``_operation`` (lock held), so one instance's trace follows the server's order.
        """
        for index in range(0, len(events), 3):
            kind, first, second = (_text(v) for v in events[index : index + 3])
            action = _ACTIONS.get(kind, kind)
            if kind in ("lease", "extend", "ack", "fail", "reclaim"):
                self._trace(action, sample_id=first, lease_id=int(second))
            elif kind in ("put", "dedup"):
                self._trace(action, sample_id=first)
            elif kind == "stale":
                self._trace(action, op=first, lease_id=int(second) if second else None)
            elif kind == "retired":
                self._feed_cursor = second
                mine = self._mine.get(first)
                if mine is not None:
                    self._scrub(mine)
            elif kind == "dead":
                self._trace(action, sample_id=first)
                dead = dead_letter_from_json(second)
                self._scrub(dead.ref)
                if self._on_dead_letter is not None:
                    self._outbox.append((self._on_dead_letter, dead))
            else:  # close, drain
                self._trace(action)
                if kind == "drain":
                    self._reaper_stop.set()

    def _scrub(self, ref: SampleRef) -> None:
        self._mine.pop(ref.sample_id, None)
        self._sent.pop(self._wire.pop(ref.sample_id, b""), None)
        self._store.scrub(ref)
        self._not_full.notify_all()

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

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

try:
    import redis  # redis.exceptions is loaded by the package itself
except ImportError as exc:  # pragma: no cover - exercised only without the optional dependency
    raise ImportError(
        "RedisSampleRefQueue needs redis-py: pip install 'featurestream[redis]' (or pip install 'redis>=5')"
    ) from exc

from featurestream.backends.redis import functions, sentinel
from featurestream.backends.redis.engine import RedisEngine, RedisLease
from featurestream.backends.redis.link import Link, first_contact, reply_text
from featurestream.common import errors
from featurestream.common.checks import check_seconds
from featurestream.core.backpressure import HealthCallback
from featurestream.core.coordinator import Coordinator, QueueOptions
from featurestream.core.engine import EngineContext
from featurestream.core.lease import VisibilityTimeout
from featurestream.core.operator_store import NoStore
from featurestream.stores.base import FeatureStore

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["DEFAULT_REDIS_URL", "RedisEngine", "RedisLease", "RedisSampleRefQueue", "list_queues"]

DEFAULT_REDIS_URL = "redis://127.0.0.1:6379/0"


def _settings(values: dict[str, int]) -> str:
    return ", ".join(f"{name}={value}" for name, value in values.items())


class RedisSampleRefQueue(Coordinator):
    """A ``LeaseQueue`` whose state lives in Redis, shared by every instance with the same ``name``.

    Same constructor and methods as ``SampleRefQueue`` plus, keyword-only:
    ``url`` (default ``$FEATURESTREAM_REDIS_URL`` or ``redis://127.0.0.1:6379/0``)
    or a ready ``client``, the queue ``name`` (a key namespace) and
    ``reconnect_timeout`` (how long a call retries while Redis is unreachable,
    e.g. restarting). Or, for a replicated server (``docs/redis.md``):
    ``sentinels=[(host, port), ...]`` and ``service_name`` (the primary is
    found through Sentinel and followed across failovers), ``password`` (the
    servers', also with ``url``) and ``sentinel_password``; ``min_replicas``
    (default 1 through Sentinel, else 0): every state-changing call returns
    only once its effect reached that many replicas. Needs Redis 7.0+ (the
    protocol is a Redis Functions library, loaded on first use). Differences that follow from being shared:

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
    _engine: RedisEngine
    _reaper_name = "featurestream-redis-reaper"

    # The positional parameters restate ``Coordinator``'s and ``open`` restates the connection keywords: each is a
    # public signature of its own (see ``SampleRefQueue.__init__``).
    def __init__(
        self,
        store: FeatureStore,
        visibility_timeout: VisibilityTimeout | None = None,
        high_watermark_bytes: int | None = None,
        low_watermark_bytes: int | None = None,
        on_pause: HealthCallback | None = None,
        on_resume: HealthCallback | None = None,
        *,
        clock: Callable[[], float] | None = None,
        url: str | None = None,
        client: redis.Redis | None = None,
        name: str = "featurestream",
        reconnect_timeout: float = 30.0,
        sentinels: Sequence[tuple[str, int]] | None = None,
        service_name: str | None = None,
        password: str | None = None,
        sentinel_password: str | None = None,
        min_replicas: int | None = None,
        **options: Unpack[QueueOptions],
    ) -> None:
        if clock is not None and not callable(clock):
            raise TypeError(f"clock must be a callable returning seconds or None, got {clock!r}")
        check_seconds("reconnect_timeout", reconnect_timeout)
        _check_name(name)
        if client is not None and (url, sentinels, password) != (None, None, None):
            raise ValueError("pass either url or client, not both (nor sentinels or a password with a client)")
        if client is not None and not isinstance(client, redis.Redis):
            raise TypeError(f"client must be a redis.Redis, got {type(client).__name__}")
        replicas = sentinel.check_min_replicas(min_replicas, sentinels)
        self.name = name
        self._owns_client = client is None

        def engine(context: EngineContext) -> RedisEngine:
            # Connects only once every argument passed its check.
            ready = client or sentinel.open_client(
                url or (None if sentinels else os.environ.get("FEATURESTREAM_REDIS_URL", DEFAULT_REDIS_URL)),
                sentinels, service_name, password=password, sentinel_password=sentinel_password,
                patience=reconnect_timeout,
            )  # fmt: skip
            return self._join(context, Link(ready, name, self._library, reconnect_timeout, replicas), store, clock)

        backpressure = (high_watermark_bytes, low_watermark_bytes, on_pause, on_resume)
        super().__init__(store, visibility_timeout, *backpressure, engine=engine, **options)

    def _join(
        self, context: EngineContext, link: Link, store: FeatureStore, clock: Callable[[], float] | None
    ) -> RedisEngine:
        """Create the queue on the server or join it (``ValueError`` / ``StoreMismatch`` when its layout, settings
        or pinned store differ from this instance's); return its engine."""
        self._link = link
        self._redis: redis.Redis = link.redis
        self._key = link.key
        handle_only = isinstance(store, NoStore)
        store_uri = "" if handle_only else getattr(store, "store_uri", "")
        engine = RedisEngine(context, link, self.name, clock=clock, store_uri=None if handle_only else store_uri)
        layout, *stored, pinned = engine.init(context.keep_dead_letter_bytes, store_uri)
        if layout != functions.LAYOUT:
            raise ValueError(
                f"queue {self.name!r} on Redis has key layout {layout!r}; this version reads layout "
                f"{functions.LAYOUT!r} (drain it with the featurestream version that created it, or use another name)"
            )
        asked = {
            "max_deliveries": context.max_deliveries,
            "dedup_window": context.dedup_window,
            "keep_dead_letter_bytes": context.keep_dead_letter_bytes,
        }
        found = dict(zip(asked, (int(value) for value in stored), strict=True))
        if found != asked:
            raise ValueError(
                f"queue {self.name!r} on Redis was created with {_settings(found)}; this instance asks for "
                f"{_settings(asked)} (use the same settings everywhere, or another name)"
            )
        if store_uri and pinned != store_uri:
            raise errors.StoreMismatch(self.name, pinned, store_uri)
        return engine

    @classmethod
    def open(
        cls,
        url: str | None,
        name: str,
        *,
        reconnect_timeout: float = 30.0,
        sentinels: Sequence[tuple[str, int]] | None = None,
        service_name: str | None = None,
        password: str | None = None,
        sentinel_password: str | None = None,
        min_replicas: int | None = None,
    ) -> RedisSampleRefQueue:
        """An operator's handle on the existing queue ``name`` at ``url`` (or, ``url`` ``None``, through
        ``sentinels`` and ``service_name``, as the constructor takes them), with no feature store.

        For status (``stats``, ``dead_letters``, ``oldest_lease_age`` ...) and repair (``requeue_dead_letters``,
        ``purge_dead_letters``, ``close``); it adopts the queue's stored settings and never produces:
        ``put`` and the like raise ``RuntimeError``. ``LookupError`` when the server has no queue of that name;
        redis-py's connection errors when it cannot be reached. ``disconnect()`` it when done.
        """
        if not isinstance(url, str) and (url is not None or sentinels is None):
            raise TypeError(f"url must be a redis:// URL str, got {url!r}")
        _check_name(name)
        check_seconds("reconnect_timeout", reconnect_timeout)
        sentinel.check_min_replicas(min_replicas, sentinels)
        connection = {"sentinels": sentinels, "service_name": service_name, "password": password}
        client = sentinel.open_client(
            url, **connection, sentinel_password=sentinel_password, patience=reconnect_timeout
        )
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
            NoStore(name, "RedisSampleRefQueue.open"), url=url, name=name, reconnect_timeout=reconnect_timeout,
            max_deliveries=max_deliveries, dedup_window=dedup_window, keep_dead_letter_bytes=keep,
            **connection, sentinel_password=sentinel_password, min_replicas=min_replicas,
        )  # fmt: skip

    def delete(self, *, force: bool = False) -> int:
        """Delete the queue from Redis, every key of it (its training ledger's too), and disconnect: for a finished
        queue, which ``featurestream status`` would otherwise list for good. One atomic server call, refused with
        ``QueueInUse`` (nothing deleted) while the queue is open or holds live leases, unless ``force``. Returns
        how many keys went. Bytes a store keeps (a kept dead letter's) are not the queue's: purge first."""
        self._reaper_stop.set()
        pattern = "".join("\\" + c if c in "*?[]\\" else c for c in self._link.prefix) + "*"
        try:
            status, count = self._link.retrying(self._redis.eval, _DELETE, 1, self._link.prefix, int(force), pattern)
        finally:
            self.disconnect()
        status = reply_text(status)
        if status == "deleted":
            return int(count)
        if status == "missing":
            raise LookupError(f"no queue named {self.name!r} on this Redis server (deleted already?)")
        raise errors.QueueInUse(self.name, f"{status} with {count} live lease{'' if count == 1 else 's'}")

    def disconnect(self) -> None:
        """Stop this instance's reaper and close its connections (when it made them); the queue stays in Redis."""
        self._reaper_stop.set()
        self._link.close()
        if self._owns_client:
            self._redis.close()


# KEYS[1]: the queue's key prefix; ARGV: 1 to delete a queue in use, the glob of its keys. Refused unless drained or
# draining with no live lease (or forced); then every key matching goes.
_DELETE = """
local state = redis.call('HGET', KEYS[1] .. 'meta', 'state')
if not state then
  return {'missing', 0}
end
local leases = redis.call('HLEN', KEYS[1] .. 'leases')
if ARGV[1] ~= '1' and (state == 'open' or leases > 0) then
  return {state, leases}
end
local deleted, cursor = 0, '0'
repeat
  local page = redis.call('SCAN', cursor, 'MATCH', ARGV[2], 'COUNT', 1000)
  cursor = page[1]
  if #page[2] > 0 then
    deleted = deleted + redis.call('UNLINK', unpack(page[2]))
  end
until cursor == '0'
return {'deleted', deleted}
"""


def _check_name(name: object) -> None:
    if not isinstance(name, str) or not name or "{" in name or "}" in name:
        raise ValueError(f"name must be a non-empty str without braces (it becomes a key hash tag), got {name!r}")


def list_queues(
    url: str | None,
    *,
    reconnect_timeout: float = 30.0,
    sentinels: Sequence[tuple[str, int]] | None = None,
    service_name: str | None = None,
    password: str | None = None,
    sentinel_password: str | None = None,
) -> dict[str, str]:
    """The featurestream queues on the Redis server at ``url`` (or the primary of ``service_name`` through
    ``sentinels``): name -> lifecycle state, sorted by name.

    Reads their ``meta`` keys (a ``SCAN``, never ``KEYS``); changes nothing. ``RedisUnreachable`` /
    ``NotRedisServer`` as for a queue's first connection.
    """
    check_seconds("reconnect_timeout", reconnect_timeout)
    client = sentinel.open_client(
        url, sentinels, service_name, password=password, sentinel_password=sentinel_password,
        patience=reconnect_timeout,
    )  # fmt: skip
    try:
        first_contact(client, None, reconnect_timeout)
        prefix, suffix = "featurestream:{", "}:meta"
        keys = sorted(reply_text(key) for key in client.scan_iter(match=f"{prefix}*{suffix}", count=1000))
        with client.pipeline(transaction=False) as pipe:
            for key in keys:
                pipe.hget(key, "state")
            states = [reply_text(state) if state is not None else "unknown" for state in pipe.execute()]
        return {key[len(prefix) : -len(suffix)]: state for key, state in zip(keys, states, strict=True)}
    finally:
        client.close()

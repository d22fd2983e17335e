"""A Redis queue's link to its server-side library: one ``FCALL`` per call, retried while Redis is unreachable.

``Link`` owns the connection's failure handling so the queue's code reads as protocol: the hot path goes
straight to the server; a connection error takes the slow path that retries with backoff for up to
``reconnect_timeout``, and a server that lost the library (restarted without persistence, ``FUNCTION
FLUSH``) gets it loaded again.

The hot path writes the ``FCALL`` on a connection of the link's own (made like the pool's, same parser and
options) and reads its reply: redis-py's per-command wrapper (pool checkout, retry closure, observability
hooks) costs about as much client CPU as the rest of a call, and every call of a queue is one request and one
reply. Any other client shape (a pool with a client-side cache, a single-connection client, a pool subclass
such as Sentinel's), a call while another thread holds that connection, and every retry take redis-py's
ordinary path.

With ``min_replicas`` (a replicated server, ``docs/redis.md``) every call is a pipeline of the ``FCALL``, a
fence (a ``PUBLISH`` to no listener, which enters the replication stream) and ``WAIT``, one round trip on
redis-py's path: the reply is handed back only once the replicas named have everything the primary had applied
when it answered. A call that ends short is retried exactly as after a lost reply, on whichever server is
primary by then; the server's remembered replies make that retry report the first run's effect or run it anew.

Where redis-py packs requests with hiredis (installed: its ``HiredisRespSerializer``), the hot path hands the
arguments to ``hiredis.pack_command`` itself: the same bytes, without redis-py's per-call wrapper around it
(a third of the packing's client CPU, ``docs/performance.md``).
"""

from __future__ import annotations

import itertools
import logging
import os
import secrets
import threading
import time
import warnings
from collections.abc import Callable
from typing import Any

import redis

from featurestream.backends.redis import functions, replicas, sentinel
from featurestream.backends.redis.sentinel import FIRST_CONTACT_TIMEOUT
from featurestream.common.errors import FeatureStreamError

try:
    import hiredis
    from redis.connection import HiredisRespSerializer
except ImportError:  # pragma: no cover - hiredis is optional; redis-py packs in Python then
    hiredis = None

__all__ = [
    "FIRST_CONTACT_TIMEOUT",
    "REPLICATION_WAIT",
    "RETRYABLE",
    "SENTINEL_RETRY_DELAY",
    "Link",
    "NotPrimary",
    "NotRedisServer",
    "NotReplicated",
    "PrimaryLost",
    "RedisUnreachable",
    "ReplicasMissing",
    "SentinelAtUrl",
    "first_contact",
    "reply_text",
]

logger = logging.getLogger(__name__)

RETRYABLE = (redis.ConnectionError, redis.TimeoutError)


# How long one WAIT blocks (at most what is left of reconnect_timeout) before the call is retried as after a
# lost reply: short enough that a failover is noticed within a second or so of it.
REPLICATION_WAIT = 1.0


# The longest pause between retries through Sentinel (1 s at a URL).
SENTINEL_RETRY_DELAY = 0.25


class RedisUnreachable(FeatureStreamError, redis.ConnectionError):
    """A queue's first connection found no server answering: nothing was created."""


class NotRedisServer(FeatureStreamError, redis.ConnectionError):
    """The server at the URL answered, but not in the Redis protocol (an HTTP server, another service's port)."""


class NotPrimary(FeatureStreamError, redis.ReadOnlyError):
    """The server at the URL is a read-only replica: a queue changes state, so it needs the primary."""


class SentinelAtUrl(FeatureStreamError, ValueError):
    """The URL names a Redis Sentinel, not a data server: a queue reaches its primary through ``sentinels=``."""


class ReplicasMissing(FeatureStreamError, ValueError):
    """``min_replicas`` asks for more replicas than the primary has connected."""


class NotReplicated(FeatureStreamError, redis.ConnectionError):
    """A call's effect did not reach ``min_replicas`` replicas within ``reconnect_timeout``: like a lost reply,
    the caller cannot tell whether it stands."""


class PrimaryLost(FeatureStreamError, redis.ConnectionError):
    """Through Sentinel: no primary answered within ``reconnect_timeout``; names the service and the sentinels."""


def reply_text(value: object) -> str:
    """A value of a server's reply as ``str``: the queue's clients return ``bytes`` (no ``decode_responses``)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def _transient(exc: BaseException) -> bool:
    """Whether ``exc`` leaves the call undone and worth retrying: a connection error, or a primary that refuses
    writes for want of replicas (``min-replicas-to-write``: nothing ran)."""
    return isinstance(exc, RETRYABLE) or (isinstance(exc, redis.ResponseError) and "NOREPLICAS" in str(exc))


def describe(client: redis.Redis) -> str:
    """Where ``client`` connects, as a URL without its password (for messages)."""
    kwargs = client.connection_pool.connection_kwargs
    if "path" in kwargs:
        return f"unix://{kwargs['path']}?db={kwargs.get('db', 0)}"
    scheme = "rediss" if kwargs.get("ssl") or "ssl_cert_reqs" in kwargs else "redis"
    return f"{scheme}://{kwargs.get('host', 'localhost')}:{kwargs.get('port', 6379)}/{kwargs.get('db', 0)}"


def first_contact(client: redis.Redis, name: str | None, reconnect_timeout: float) -> None:
    """``PING`` the server ``client`` names until it answers, for at most ``FIRST_CONTACT_TIMEOUT`` seconds.

    Raises ``RedisUnreachable`` (naming the URL, the queue and ``reconnect_timeout``) when nothing answers in
    time, and ``NotRedisServer`` (naming the URL and the queue) when something answers in another protocol;
    ``name`` ``None`` is a look at all the server's queues. The probe's connection has socket timeouts of that
    length, so a server that accepts and never replies cannot hang it either.
    """
    limit = min(reconnect_timeout, FIRST_CONTACT_TIMEOUT)
    target = sentinel.describe(client) or f"Redis at {describe(client)}"
    where = f"{target} for " + (f"queue {name!r}" if name is not None else "its queues")
    pool = client.connection_pool
    probe = client
    if type(pool) is redis.ConnectionPool:
        seconds = max(limit, 0.5)  # never None: a probe without timeouts could wait for ever
        timeouts = {"socket_timeout": seconds, "socket_connect_timeout": seconds}
        probe = redis.Redis(
            connection_pool=redis.ConnectionPool(pool.connection_class, **{**pool.connection_kwargs, **timeouts})
        )
    give_up = time.monotonic() + limit
    delay = 0.05
    try:
        while True:
            try:
                probe.ping()
                return
            except redis.exceptions.InvalidResponse as exc:
                raise NotRedisServer(
                    f"{where}: the server there is not a Redis server (it answered outside the Redis protocol: "
                    f"{exc}); check the host and port of the URL"
                ) from None
            except RETRYABLE as exc:
                if time.monotonic() + delay > give_up:
                    raise RedisUnreachable(
                        f"cannot reach {where}: {exc} (tried for {limit:g} s: a first connection fails fast; "
                        f"reconnect_timeout={reconnect_timeout:g} s rides out outages once connected)"
                    ) from None
                logger.debug("Redis at %s not answering yet (%s); retrying in %.2fs", describe(client), exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 0.5)
    finally:
        if probe is not client:
            probe.connection_pool.disconnect()  # a pool passed in is not closed with its client


Arg = str | int | bytes


class Link:
    """The functions of ``library`` on ``client`` for the queue ``name``; ``key[n]`` is key ``n``'s full name.

    Every call gets an id (this link's random id, ``functions.INSTANCE_CHARS`` characters, and a counter) and
    tells the server whether it may repeat a request the server already ran: a retry after a connection error,
    or any request redis-py sends (it retries by itself). The server remembers a call's reply under that id when
    the reply reports what the client must act on or trace, or an effect a retry could not recognise, and
    answers the retry with it (see ``functions``: ``calls``); a put is recognised by its put token and an ack by
    the dedup record of the lease it settled. So retrying connection errors is safe, and a retried call has the
    effect, and reports the events, of its first run. Thread-safe as redis-py's client is.
    """

    def __init__(
        self,
        client: redis.Redis,
        name: str,
        library: functions.Library,
        reconnect_timeout: float,
        min_replicas: int = 0,
    ) -> None:
        self.redis = client
        self.prefix = f"featurestream:{{{name}}}:"
        self.key = {key: self.prefix + key for key in functions.KEY_NAMES}
        self._library = library
        self._functions = {script: library.function(script) for script in functions.FUNCTIONS}
        self._reconnect_timeout = reconnect_timeout
        self.min_replicas = min_replicas  # replicas each change must reach before its call returns
        self._sentinel = sentinel.describe(client)
        self._where = self._sentinel or describe(client)
        self._fence = self.prefix + "fence"
        # the longest pause between retries: through Sentinel a promoted replica is usually ready within a
        # second or two of the loss, and a short pause finds it sooner
        self._max_delay = 1.0 if self._sentinel is None else SENTINEL_RETRY_DELAY
        pool = client.connection_pool
        # the hot path's own connection (see the module docstring); None: every call takes redis-py's path
        self._conn: redis.connection.AbstractConnection | None = None
        if type(client) is redis.Redis and client.connection is None and type(pool) is redis.ConnectionPool:
            if getattr(pool, "cache", None) is None:
                self._conn = pool.connection_class(**pool.connection_kwargs)
        # what packs the hot path's requests: the connection's own packer, or hiredis directly where that is
        # what the connection's packer calls (the arguments are str, int and bytes: it passes them unchanged)
        self._pack: Callable[..., list[bytes]] = self._pack_command
        if hiredis is not None and type(getattr(self._conn, "_command_packer", None)) is HiredisRespSerializer:
            self._pack = _hiredis_pack
        self._conn_lock = threading.Lock()
        self._pid = os.getpid()  # a forked child shares the socket: it must not use the connection
        self._id = secrets.token_hex(functions.INSTANCE_CHARS // 2)
        self._calls = itertools.count()
        # how long the server keeps a reply for this link's retry: longer than any retry of it can come
        self._keep = f":{float(max(functions.MEMO_SECONDS, 2 * reconnect_timeout))!r}"
        first_contact(client, name, reconnect_timeout)
        self.load()
        if min_replicas:
            self._check_replicas()
        if self._sentinel is not None:
            figures = replicas.count(client)
            spare = replicas.spare_replica_warning(self._sentinel, figures, min_replicas, reconnect_timeout)
            if spare is not None:
                warnings.warn(spare, RuntimeWarning, stacklevel=2)

    def _check_replicas(self) -> None:
        """``ReplicasMissing`` when the primary has fewer replicas connected than ``min_replicas`` for
        ``reconnect_timeout`` seconds: right after a failover the promoted primary has none until the others
        (or the old primary, restarted) resync, and a process started then waits for them as its calls would."""
        give_up = time.monotonic() + self._reconnect_timeout
        while True:
            info = self.retrying(self.redis.info, "replication")
            connected = int(info.get("connected_slaves", 0))
            if connected >= self.min_replicas:
                return
            if time.monotonic() >= give_up:
                raise ReplicasMissing(
                    f"min_replicas={self.min_replicas} but {self._where} has {connected} replica(s) connected "
                    f"(role {info.get('role')!r}): start the replicas first, or lower min_replicas"
                )
            time.sleep(0.1)

    def load(self) -> None:
        """``FUNCTION LOAD`` the library unless the server already has it (it persists with the data)."""
        try:
            self.retrying(self.redis.function_load, self._library.source)
        except redis.ReadOnlyError as exc:
            raise self._not_primary(exc) from None
        except redis.ResponseError as exc:
            if "already exists" in str(exc):
                return
            if "unknown command" in str(exc).lower():
                raise self._not_functions(exc) from None
            raise

    def _not_functions(self, exc: redis.ResponseError) -> Exception:
        """What to say when the server knows no ``FUNCTION``: a sentinel's port, or a Redis older than 7.0."""
        try:
            mode = self.redis.info("server").get("redis_mode")
            services = sorted(reply_text(name) for name in self.redis.sentinel_masters()) if mode == "sentinel" else []
        except redis.RedisError:
            mode = None
        if mode == "sentinel":
            return SentinelAtUrl(
                f"Redis at {self._where} is a Sentinel, not a Redis server (it monitors service(s) "
                f"{', '.join(map(repr, services)) or 'none'}): pass sentinels=[(host, port), ...] and "
                "service_name=... instead of url (the CLI: --sentinel HOST:PORT --service NAME)"
            )
        return RuntimeError(f"RedisSampleRefQueue needs Redis 7.0+ (Redis Functions); the server said: {exc}")

    def call(self, script: str, header: Callable[[str], str], *args: Arg) -> Any:
        """``FCALL`` function ``script`` with ``header(script)`` (built afresh for every attempt) and ``args``.

        The header ends with one more field: ``+`` when the request may repeat one the server ran (a retry, or
        any request redis-py sends: it retries by itself), else ``-``, then this call's id and ``:`` how long
        the server keeps a reply it remembers for the retry."""
        call = f"{self._id}{next(self._calls)}{self._keep}"
        if self.min_replicas:
            return self._call_replicated(script, lambda name: f"{header(name)}\t+{call}", args)
        try:
            conn = self._conn
            if conn is not None and self._pid == os.getpid() and self._conn_lock.acquire(blocking=False):
                try:
                    return self._request(conn, self._functions[script], f"{header(script)}\t-{call}", args)
                finally:
                    self._conn_lock.release()
            return self.redis.fcall(self._functions[script], 1, self.prefix, f"{header(script)}\t+{call}", *args)
        except RETRYABLE:
            pass
        except redis.ReadOnlyError as exc:
            if self._sentinel is None:  # through Sentinel: a demoted primary, retried on the promoted one
                raise self._not_primary(exc) from None
        except redis.ResponseError as exc:
            if "function not found" not in str(exc).lower() and not _transient(exc):
                raise
        return self.retrying(self._call_reloading, script, lambda name: f"{header(name)}\t+{call}", args)

    def _call_replicated(self, script: str, header: Callable[[str], str], args: tuple[Arg, ...]) -> Any:
        """``call`` with ``min_replicas``: the ``FCALL`` through ``replicated``, reloading a lost library."""

        def fcall(pipe: redis.client.Pipeline) -> None:
            pipe.execute_command("FCALL", self._functions[script], 1, self.prefix, header(script), *args)

        try:
            return self.replicated(fcall)
        except redis.ResponseError as exc:
            if "function not found" not in str(exc).lower():
                raise
        self.load()
        return self.replicated(fcall)

    def replicated(self, commands: Callable[[redis.client.Pipeline], object]) -> Any:
        """The last reply of the commands ``commands`` adds to a pipeline, once they reached ``min_replicas``
        replicas (``min_replicas`` >= 1: ``call`` and the training ledger use it only then).

        Each attempt is one round trip: the commands, the fence and ``WAIT``. An attempt that ends short of
        ``min_replicas`` is retried as after a lost reply (the commands must be safe to repeat: the library's
        calls are, by their remembered replies; the ledger's scripts are idempotent), for up to
        ``reconnect_timeout``, then ``NotReplicated``.
        """
        give_up = time.monotonic() + self._reconnect_timeout
        while True:
            acked, reply = self._retrying_until(give_up, self._attempt, commands, give_up)
            if acked >= self.min_replicas:
                return reply
            if time.monotonic() >= give_up:
                connected = replicas.count(self.redis).connected
                short = (
                    f"; it has {connected} replica(s) connected. To go on, {replicas.REMEDY}"
                    if connected is not None and connected < self.min_replicas
                    else ""
                )
                raise NotReplicated(
                    f"a call's effect reached {acked} of min_replicas={self.min_replicas} replica(s) of "
                    f"{self._where} within reconnect_timeout={self._reconnect_timeout:g} s: it may or may not "
                    f"stand (as after a lost reply){short}"
                )
            logger.warning(
                "a call reached %d of min_replicas=%d replica(s) of %s; retrying it",
                acked,
                self.min_replicas,
                self._where,
            )

    def _attempt(self, commands: Callable[[redis.client.Pipeline], object], give_up: float) -> tuple[int, Any]:
        """One round trip: ``commands``, then the fence and a ``WAIT`` for ``min_replicas`` of at most
        ``REPLICATION_WAIT`` seconds; (the replicas that acknowledged, the last command's reply)."""
        with self.redis.pipeline(transaction=False) as pipe:
            commands(pipe)
            # WAIT counts the replicas that have this connection's last write: the fence makes that everything
            # the primary holds now, even when the commands wrote nothing (a retry answered from memory).
            pipe.publish(self._fence, "")
            wait_ms = max(1, int(1000 * min(REPLICATION_WAIT, give_up - time.monotonic())))
            pipe.execute_command("WAIT", self.min_replicas, wait_ms)
            try:
                *replies, _, acked = pipe.execute()
            except redis.ReadOnlyError as exc:
                raise self._not_primary(exc) from None
        return int(acked), replies[-1]

    def _not_primary(self, exc: redis.ReadOnlyError) -> Exception:
        """A write refused by a read-only replica. Through Sentinel a demoted primary is a connection error
        (redis-py reconnects to the new one); at a URL the queue was pointed at a replica."""
        if self._sentinel is not None:
            return redis.ConnectionError(f"{self._sentinel} answered as a read-only replica: {exc}")
        return NotPrimary(
            f"Redis at {self._where} is a read-only replica, not the primary ({exc}): give the primary's URL, "
            "or connect through Sentinel (sentinels=..., service_name=...) to follow failovers"
        )

    def close(self) -> None:
        """Drop this link's remembered reply on the server and close the hot path's connection (a later call
        opens it again). One attempt: when Redis cannot be reached the reaper drops the reply in time."""
        forget = (("HDEL", self.key["calls"], self._id), ("ZREM", self.key["calls_due"], self._id))
        try:
            if self._conn is not None and self._pid == os.getpid():
                with self._conn_lock:
                    try:
                        self._conn.send_packed_command(self._conn.pack_commands(forget))
                        for _ in forget:
                            self._conn.read_response()
                    finally:
                        self._conn.disconnect()
            else:
                with self.redis.pipeline(transaction=False) as pipe:
                    for command in forget:
                        pipe.execute_command(*command)
                    pipe.execute()
        except (redis.RedisError, OSError) as exc:
            logger.debug("could not drop the remembered reply of %s on disconnect: %s", self._id, exc)

    def _request(
        self, conn: redis.connection.AbstractConnection, function: str, header: str, args: tuple[Arg, ...]
    ) -> Any:
        """One ``FCALL`` request and its reply on ``conn`` (connected on first use, and again after an error)."""
        try:
            conn.send_packed_command(self._pack(conn, "FCALL", function, 1, self.prefix, header, *args))
            return conn.read_response()
        except redis.ResponseError:
            raise  # an error reply was read whole: the connection is in step
        except BaseException:
            # anything else may leave a reply unread (an interrupt between the write and the read): start afresh
            conn.disconnect()
            raise

    @staticmethod
    def _pack_command(conn: redis.connection.AbstractConnection, *args: Arg) -> list[bytes]:
        return conn.pack_command(*args)

    def retrying(self, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Call ``call``, retrying with backoff while Redis is unreachable, for up to ``reconnect_timeout``.

        Only connection-level errors (and a primary's ``NOREPLICAS``: nothing ran) are retried; through
        Sentinel the last one is raised as ``PrimaryLost``, naming the service and the sentinels.
        """
        return self._retrying_until(time.monotonic() + self._reconnect_timeout, call, *args, **kwargs)

    def _retrying_until(self, give_up: float, call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        delay = 0.02
        while True:
            try:
                return call(*args, **kwargs)
            except redis.RedisError as exc:
                if not _transient(exc):
                    raise
                if time.monotonic() + delay > give_up:
                    if isinstance(exc, redis.ResponseError):  # NOREPLICAS: the primary answers, it lacks replicas
                        figures = replicas.count(self.redis)
                        raise replicas.refused(self._where, figures, self._reconnect_timeout) from None
                    if self._sentinel is None:
                        raise
                    raise PrimaryLost(
                        f"cannot reach {self._sentinel} (retried for reconnect_timeout="
                        f"{self._reconnect_timeout:g} s): {exc}"
                    ) from exc
                logger.warning("Redis unreachable at %s (%s); retrying in %.2fs", self._where, exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, self._max_delay)

    def snapshot(self, *, lease_records: bool) -> list[Any]:
        """Read together (one MULTI/EXEC): the ``stats`` hash, the number of live leases, the lifecycle state and
        close cause and, with ``lease_records``, every live lease record and the server's ``TIME``."""

        def read() -> list[Any]:
            with self.redis.pipeline(transaction=True) as pipe:
                pipe.hgetall(self.key["stats"])
                pipe.hlen(self.key["leases"])
                pipe.hmget(self.key["meta"], ["state", "cause"])
                if lease_records:
                    pipe.hvals(self.key["leases"])
                    pipe.time()
                return pipe.execute()

        return self.retrying(read)

    def _call_reloading(self, script: str, header: Callable[[str], str], args: tuple[Arg, ...]) -> Any:
        function = self._functions[script]
        try:
            return self.redis.fcall(function, 1, self.prefix, header(script), *args)
        except redis.ResponseError as exc:
            if "function not found" not in str(exc).lower():
                raise
        # A server restarted without persistence, or FUNCTION FLUSHed: load the library again.
        self.load()
        return self.redis.fcall(function, 1, self.prefix, header(script), *args)


def _hiredis_pack(_: redis.connection.AbstractConnection, *args: Arg) -> list[bytes]:
    return [hiredis.pack_command(args)]

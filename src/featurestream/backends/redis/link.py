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

Where redis-py packs requests with hiredis (installed: its ``HiredisRespSerializer``), the hot path hands the
arguments to ``hiredis.pack_command`` itself: the same bytes, without redis-py's per-call wrapper around it
(about 2 us of client CPU per call, a third of the packing).
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from typing import Any

import redis
from featurestream.backends.redis import functions

try:
    import hiredis
    from redis.connection import HiredisRespSerializer
except ImportError:  # pragma: no cover - hiredis is optional; redis-py packs in Python then
    hiredis = None

__all__ = ["RETRYABLE", "Link"]

logger = logging.getLogger(__name__)

RETRYABLE = (redis.ConnectionError, redis.TimeoutError)

Arg = str | int | bytes


class Link:
    """The functions of ``library`` on ``client`` for the queue ``name``; ``key[n]`` is key ``n``'s full name.

    Every function is idempotent under a retry after a lost reply (put by its put token, ack/fail by the
    dedup record of the lease that settled it; a retried acquire leaves a lease nobody holds, which expires
    and is redelivered), so retrying connection errors is safe. Thread-safe as redis-py's client is.
    """

    def __init__(self, client: redis.Redis, name: str, library: functions.Library, reconnect_timeout: float) -> None:
        self.redis = client
        self.prefix = f"featurestream:{{{name}}}:"
        self.key = {key: self.prefix + key for key in functions.KEY_NAMES}
        self._library = library
        self._functions = {script: library.function(script) for script in functions.FUNCTIONS}
        self._reconnect_timeout = reconnect_timeout
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
        self.load()

    def load(self) -> None:
        """``FUNCTION LOAD`` the library unless the server already has it (it persists with the data)."""
        try:
            self.retrying(self.redis.function_load, self._library.source)
        except redis.ResponseError as exc:
            if "already exists" in str(exc):
                return
            if "unknown command" in str(exc).lower():
                raise RuntimeError(
                    f"RedisSampleRefQueue needs Redis 7.0+ (Redis Functions); the server said: {exc}"
                ) from None
            raise

    def call(self, script: str, header: Callable[[str], str], *args: Arg) -> Any:
        """``FCALL`` function ``script`` with ``header(script)`` (built afresh for every attempt) and ``args``."""
        try:
            conn = self._conn
            if conn is not None and self._pid == os.getpid() and self._conn_lock.acquire(blocking=False):
                try:
                    return self._request(conn, self._functions[script], header(script), args)
                finally:
                    self._conn_lock.release()
            return self.redis.fcall(self._functions[script], 1, self.prefix, header(script), *args)
        except RETRYABLE:
            pass
        except redis.ResponseError as exc:
            if "function not found" not in str(exc).lower():
                raise
        return self.retrying(self._call_reloading, script, header, args)

    def close(self) -> None:
        """Close the hot path's connection (a later call opens it again)."""
        if self._conn is not None:
            with self._conn_lock:
                self._conn.disconnect()

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

        Only connection-level errors are retried.
        """
        give_up = time.monotonic() + self._reconnect_timeout
        delay = 0.02
        while True:
            try:
                return call(*args, **kwargs)
            except RETRYABLE as exc:
                if time.monotonic() + delay > give_up:
                    raise
                logger.warning("Redis unreachable (%s); retrying in %.2fs", exc, delay)
                time.sleep(delay)
                delay = min(delay * 2, 1.0)

    def snapshot(self) -> tuple[dict[Any, Any], int]:
        """The ``stats`` hash and the number of live leases, read together (one MULTI/EXEC)."""

        def read() -> tuple[dict[Any, Any], int]:
            with self.redis.pipeline(transaction=True) as pipe:
                pipe.hgetall(self.key["stats"])
                pipe.hlen(self.key["leases"])
                counters, outstanding = pipe.execute()
            return counters, outstanding

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

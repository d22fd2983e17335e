"""Reaching a queue's Redis through Sentinel: the primary of a replicated service, followed across failovers.

``connect`` checks the arguments, asks the sentinels for the service's primary once (so a service no
sentinel knows, or one whose primary they report down, is refused at construction with the service and the
sentinels named) and returns a redis-py client over a ``SentinelConnectionPool``: each new connection asks
the sentinels for the primary's address, and a connection to a primary that was demoted (``READONLY``) or
died raises a connection error, which the queue's ``Link`` retries within ``reconnect_timeout`` -- by then
on whichever server Sentinel promoted. Passwords go to redis-py only; no message here or in ``describe``
contains one.
"""

from __future__ import annotations

import concurrent.futures
import socket
import time
from collections.abc import Sequence
from typing import Any

import redis.sentinel

from featurestream.common.errors import FeatureStreamError

__all__ = ["FIRST_CONTACT_TIMEOUT", "SentinelServiceError", "connect", "describe", "sentinel_addresses", "where"]

Address = tuple[str, int]

# Seconds a sentinel or primary may take to accept a connection: a dead host must not stall the failover hunt.
CONNECT_TIMEOUT = 2.0

# How long a queue's very first connection is tried (at most its reconnect_timeout): a wrong URL or sentinel
# address should fail in seconds; once a server has answered, an outage is ridden out for reconnect_timeout.
FIRST_CONTACT_TIMEOUT = 3.0

# A primary host that vanished without closing its sockets (power loss, partition) is noticed by TCP
# keepalive after about idle + interval * count seconds, instead of the kernel's two hours.
_KEEPALIVE = {
    getattr(socket, name): value
    for name, value in (("TCP_KEEPIDLE", 5), ("TCP_KEEPINTVL", 1), ("TCP_KEEPCNT", 3))
    if hasattr(socket, name)
}


class SentinelServiceError(FeatureStreamError, redis.ConnectionError):
    """The sentinels know no such service, none of them answers, or they report its primary down."""


def sentinel_addresses(sentinels: object) -> tuple[Address, ...]:
    """``sentinels`` as ``(host, port)`` pairs; ``TypeError`` / ``ValueError`` naming the offending item."""
    if isinstance(sentinels, (str, bytes)) or not isinstance(sentinels, Sequence):
        raise TypeError(f"sentinels must be a list of (host, port) pairs, got {sentinels!r}")
    if not sentinels:
        raise ValueError("sentinels is empty: name at least one (host, port) of a sentinel")
    out: list[Address] = []
    for item in sentinels:
        if not isinstance(item, Sequence) or isinstance(item, (str, bytes)) or len(item) != 2:
            raise TypeError(f"each sentinel must be a (host, port) pair, got {item!r}")
        host, port = item
        if not isinstance(host, str) or not host:
            raise TypeError(f"a sentinel's host must be a non-empty str, got {host!r} in {item!r}")
        if isinstance(port, bool) or not isinstance(port, int) or not 0 < port < 65536:
            raise ValueError(f"a sentinel's port must be an int in 1..65535, got {port!r} in {item!r}")
        out.append((host, port))
    return tuple(out)


def _names(addresses: Sequence[Address]) -> str:
    return ", ".join(f"{host}:{port}" for host, port in addresses)


def where(service_name: str, addresses: Sequence[Address]) -> str:
    """The primary of ``service_name`` as the messages name it (never a password)."""
    return f"the primary of Sentinel service {service_name!r} (sentinels {_names(addresses)})"


def describe(client: redis.Redis) -> str | None:
    """``where`` for a client ``connect`` made (or any over a ``SentinelConnectionPool``); ``None`` otherwise."""
    pool = client.connection_pool
    if not isinstance(pool, redis.sentinel.SentinelConnectionPool):
        return None
    addresses = [
        (str(s.connection_pool.connection_kwargs.get("host")), int(s.connection_pool.connection_kwargs.get("port", 0)))
        for s in pool.sentinel_manager.sentinels
    ]
    return where(pool.service_name, sorted(addresses))


def connect(
    sentinels: object,
    service_name: object,
    *,
    password: str | None = None,
    sentinel_password: str | None = None,
    patience: float = 0.0,
) -> redis.Redis:
    """A client of ``service_name``'s primary, found through ``sentinels``.

    ``password`` is the Redis servers' (primary and replicas), ``sentinel_password`` the sentinels'.
    ``SentinelServiceError`` (naming the service and the sentinels) at once when no sentinel monitors the
    service, after ``FIRST_CONTACT_TIMEOUT`` seconds (or ``patience``, when shorter) when none of them answers,
    and after ``patience`` seconds (a failover in progress: the process was started while its primary was lost)
    when they still report its primary down; ``TypeError`` / ``ValueError`` for malformed arguments.
    """
    addresses = sentinel_addresses(sentinels)
    if not isinstance(service_name, str) or not service_name:
        raise ValueError(f"service_name must be a non-empty str (the name sentinels monitor), got {service_name!r}")
    for label, value in (("password", password), ("sentinel_password", sentinel_password)):
        if value is not None and not isinstance(value, str):
            raise TypeError(f"{label} must be a str or None, got a {type(value).__name__}")
    timeouts: dict[str, Any] = {"socket_connect_timeout": CONNECT_TIMEOUT}
    manager = redis.sentinel.Sentinel(
        list(addresses),
        sentinel_kwargs={**timeouts, "socket_timeout": CONNECT_TIMEOUT, "password": sentinel_password},
        password=password,
        socket_keepalive=True,
        socket_keepalive_options=_KEEPALIVE,
        **timeouts,
    )
    started = time.monotonic()
    limits = {"down": patience, "unreachable": min(patience, FIRST_CONTACT_TIMEOUT), "unknown": 0.0}
    delay = 0.05
    while True:
        answering = _answering(manager)  # asked at once: sentinels that hang cost one timeout, not one each
        try:
            if answering:
                manager.discover_master(service_name)
                return manager.master_for(service_name)
        except redis.sentinel.MasterNotFoundError:
            pass
        kind, why = _diagnose(answering, service_name, addresses)
        if time.monotonic() + delay > started + limits[kind]:
            if kind == "unreachable":
                why += f" (tried for {limits[kind]:g} s): check each sentinel's host and port"
            raise SentinelServiceError(why) from None
        time.sleep(delay)
        delay = min(delay * 2, 0.5)


def _answering(manager: redis.sentinel.Sentinel) -> list[redis.Redis]:
    """The sentinels that answer a ``PING``, all asked at once (each within ``CONNECT_TIMEOUT``)."""

    def answers(sentinel: redis.Redis) -> bool:
        try:
            return bool(sentinel.ping())
        except redis.RedisError:
            return False

    sentinels = manager.sentinels
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(sentinels)) as pool:
        return [sentinel for sentinel, ok in zip(sentinels, pool.map(answers, sentinels), strict=True) if ok]


def _diagnose(answering: Sequence[redis.Redis], service_name: str, addresses: Sequence[Address]) -> tuple[str, str]:
    """Why the ``answering`` sentinels named no usable primary of ``service_name``: ``unreachable`` (none
    answers), ``unknown`` (no answering sentinel monitors it: that will not pass) or ``down`` (they report its
    primary down), and the message saying so."""
    known: set[str] = set()
    states: list[str] = []
    unreachable = len(addresses) - len(answering)
    for sentinel in answering:
        try:
            masters = sentinel.sentinel_masters()
        except redis.RedisError:
            unreachable += 1
            continue
        known.update(masters)
        state = masters.get(service_name)
        if state is not None:
            flags = [flag for flag in ("is_sdown", "is_odown") if state.get(flag)]
            states.append(f"{state['ip']}:{state['port']} {'down' if flags else 'not a usable primary'}")
    target = where(service_name, addresses)
    if unreachable == len(addresses):
        return "unreachable", f"cannot reach {target}: none of the {len(addresses)} sentinels answers"
    if not states:
        others = ", ".join(repr(name) for name in sorted(known)) or "none"
        monitored = f"no sentinel monitors service {service_name!r} (they monitor: {others})"
        return "unknown", f"cannot reach {target}: {monitored}"
    return "down", f"cannot reach {target}: the sentinels report its primary {'; '.join(sorted(set(states)))}"


def open_client(
    url: str | None,
    sentinels: object,
    service_name: object,
    *,
    password: str | None,
    sentinel_password: str | None,
    patience: float = 0.0,
) -> redis.Redis:
    """The client a queue, an operator's handle or ``list_queues`` makes: through ``sentinels`` when given
    (with ``service_name``, waiting up to ``patience`` seconds for a primary, see ``connect``), else at
    ``url``; ``ValueError`` for a mix of the two."""
    if sentinels is None:
        if service_name is not None or sentinel_password is not None:
            raise ValueError("service_name and sentinel_password need sentinels=[(host, port), ...]")
        if password is not None and not isinstance(password, str):
            raise TypeError(f"password must be a str or None, got a {type(password).__name__}")
        if url is None:
            raise ValueError("give a Redis url, or sentinels=[(host, port), ...] with service_name")
        return redis.Redis.from_url(url, **({} if password is None else {"password": password}))
    if url is not None:
        raise ValueError(f"pass either a url or sentinels, not both (url={_redacted(url)}, sentinels={sentinels!r})")
    return connect(sentinels, service_name, password=password, sentinel_password=sentinel_password, patience=patience)


def check_min_replicas(min_replicas: object, sentinels: object) -> int:
    """``min_replicas`` as the number of replicas a call waits for: ``None`` is 1 through Sentinel, else 0."""
    if min_replicas is None:
        return 0 if sentinels is None else 1
    if isinstance(min_replicas, bool) or not isinstance(min_replicas, int):
        raise TypeError(f"min_replicas must be an int >= 0 or None, got {min_replicas!r}")
    if min_replicas < 0:
        raise ValueError(f"min_replicas must be >= 0, got {min_replicas}")
    return min_replicas


def _redacted(url: str) -> str:
    """``url`` without a password in it (for messages)."""
    scheme, sep, rest = url.partition("://")
    credentials, at, host = rest.rpartition("@")
    if not sep or not at or ":" not in credentials:
        return url
    return f"{scheme}://{credentials.split(':', 1)[0]}:***@{host}"

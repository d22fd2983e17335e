"""The operator commands' target: a queue on a Redis server, named by ``--redis URL --name NAME``, or on a
replicated Redis through Sentinel, ``--sentinel HOST:PORT`` (once per sentinel) ``--service NAME --name NAME``
(passwords from ``$FEATURESTREAM_REDIS_PASSWORD`` and ``$FEATURESTREAM_SENTINEL_PASSWORD``, never the command
line, which other users can read in the process list).

``open_target(args)`` opens it for inspection and repair (no feature store, no
producing) and turns every way of not getting there -- redis-py missing, the
server unreachable or refusing, no queue of that name -- into a ``TargetError``
whose message names the URL (password hidden) or the service and its
sentinels, and the queue, which the commands print and exit with status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import urllib.parse
from collections.abc import Iterator
from typing import Any

from featurestream.common.errors import FeatureStreamError

__all__ = [
    "TargetError",
    "add_server_arguments",
    "add_target_arguments",
    "connection_keywords",
    "describe_target",
    "list_target_queues",
    "open_target",
    "positive_float",
    "redact",
    "sentinel_address",
]

# An operator command gives up on an unreachable server after this long (a queue's own default is 30 s).
RECONNECT_TIMEOUT = 2.0


class TargetError(FeatureStreamError):
    """The queue cannot be reached or does not exist; the message says which and where."""


def add_target_arguments(parser: argparse.ArgumentParser, *, name_required: bool = True) -> None:
    """``--redis URL`` (default ``$FEATURESTREAM_REDIS_URL``) or ``--sentinel HOST:PORT ... --service NAME``,
    ``--name NAME`` and ``--json``."""
    default_url = os.environ.get("FEATURESTREAM_REDIS_URL")
    add_server_arguments(
        parser,
        redis_help="the Redis server holding the queue (default: $FEATURESTREAM_REDIS_URL)",
        default_url=default_url,
        required=default_url is None,
    )
    parser.add_argument(
        "--name",
        required=name_required,
        help="the queue name (RedisSampleRefQueue(name=...))"
        + ("" if name_required else "; omit it to list the queues"),
    )
    parser.add_argument("--json", action="store_true", help="print JSON for scripts instead of a table")


def add_server_arguments(
    parser: argparse.ArgumentParser, *, redis_help: str, default_url: str | None = None, required: bool = False
) -> None:
    """``--redis URL`` or (argparse refuses both) ``--sentinel HOST:PORT`` (repeatable) with ``--service NAME``;
    ``connection_keywords`` checks the pairing and turns them into a queue's keywords."""
    server = parser.add_mutually_exclusive_group(required=required)
    server.add_argument("--redis", metavar="redis://HOST:PORT/DB", default=default_url, help=redis_help)
    server.add_argument(
        "--sentinel",
        metavar="HOST:PORT",
        action="append",
        type=sentinel_address,
        help="a sentinel of a replicated Redis (repeat for each sentinel; with --service)",
    )
    parser.add_argument("--service", metavar="NAME", help="the service the sentinels monitor (with --sentinel)")


def redact(url: str) -> str:
    """``url`` with its password (if any) replaced by ``***``, fit for printing."""
    parts = urllib.parse.urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.hostname or ""
    if parts.port is not None:
        host = f"{host}:{parts.port}"
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def sentinel_address(text: str) -> tuple[str, int]:
    """An argparse type: ``HOST:PORT`` of a sentinel."""
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise argparse.ArgumentTypeError(f"must be HOST:PORT with a port in 1..65535, got {text!r}")
    return host, int(port)


def describe_target(args: argparse.Namespace) -> str:
    """Where the commands look, fit for printing: the URL (password hidden), or the service and its sentinels."""
    if args.sentinel:
        sentinels = ", ".join(f"{host}:{port}" for host, port in args.sentinel)
        return f"Sentinel service {args.service!r} (sentinels {sentinels})"
    return redact(args.redis)


def connection_keywords(args: argparse.Namespace) -> dict[str, Any]:
    """The keywords that reach the server ``add_server_arguments`` names (``url``, ``None`` through Sentinel,
    first), passwords from the environment; ``TargetError`` for --sentinel without --service or the reverse."""
    if not args.sentinel:
        if args.service is not None:
            raise TargetError("--service needs --sentinel HOST:PORT (the sentinels to ask)")
        return {"url": args.redis, "password": os.environ.get("FEATURESTREAM_REDIS_PASSWORD")}
    if not args.service:
        raise TargetError("--sentinel needs --service NAME (the service the sentinels monitor)")
    return {
        "url": None,
        "sentinels": args.sentinel,
        "service_name": args.service,
        "password": os.environ.get("FEATURESTREAM_REDIS_PASSWORD"),
        "sentinel_password": os.environ.get("FEATURESTREAM_SENTINEL_PASSWORD"),
    }


@contextlib.contextmanager
def open_target(args: argparse.Namespace, *, repairs: bool = False) -> Iterator[Any]:
    """Open the queue ``args.name`` at ``args.redis`` (or through ``args.sentinel``); connection errors inside
    the block become ``TargetError``.

    Through Sentinel a handle that ``repairs`` (requeues, purges) waits for a replica as any queue does
    (``min_replicas=1``); one that only reads does not, so status works while the replicas are down. The
    handle is disconnected when the block ends.
    """
    where = f"queue {args.name!r} at {describe_target(args)}"
    connection = connection_keywords(args)
    if args.sentinel and not repairs:
        connection["min_replicas"] = 0
    try:
        import redis

        from featurestream.backends.redis.link import NotRedisServer, RedisUnreachable
        from featurestream.backends.redis.queue import RedisSampleRefQueue
    except ImportError as exc:
        raise TargetError(f"cannot open {where}: {exc}") from None
    try:
        url = connection.pop("url")
        queue = RedisSampleRefQueue.open(url, args.name, reconnect_timeout=RECONNECT_TIMEOUT, **connection)
    except (NotRedisServer, RedisUnreachable) as exc:  # the first connection: nothing answered, or not Redis
        raise TargetError(f"cannot open {where}: {exc}") from None
    except (redis.ConnectionError, redis.TimeoutError) as exc:  # timed out, wrong password
        raise TargetError(f"cannot reach Redis for {where}: {exc}") from None
    except LookupError:
        raise TargetError(f"no {where}") from None
    except ValueError as exc:  # a malformed URL, or a queue of another key layout
        raise TargetError(f"cannot open {where}: {exc}") from None
    try:
        yield queue
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        raise TargetError(f"lost Redis while reading {where}: {exc}") from None
    finally:
        queue.disconnect()


def list_target_queues(args: argparse.Namespace) -> dict[str, str]:
    """The queues on the server ``args.redis`` or through ``args.sentinel`` (name -> lifecycle state); every
    failure is a ``TargetError``."""
    where = f"the queues at {describe_target(args)}"
    connection = connection_keywords(args)
    try:
        import redis

        from featurestream.backends.redis.link import NotRedisServer, RedisUnreachable
        from featurestream.backends.redis.queue import list_queues
    except ImportError as exc:
        raise TargetError(f"cannot list {where}: {exc}") from None
    try:
        return list_queues(connection.pop("url"), reconnect_timeout=RECONNECT_TIMEOUT, **connection)
    except (NotRedisServer, RedisUnreachable) as exc:
        raise TargetError(f"cannot list {where}: {exc}") from None
    except (redis.RedisError, ValueError) as exc:  # timed out, wrong password, a malformed URL
        raise TargetError(f"cannot list {where}: {exc}") from None


def positive_float(text: str) -> float:
    """An argparse type: a finite number of seconds > 0."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number of seconds, got {text!r}") from None
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"must be > 0 and finite, got {text!r}")
    return value

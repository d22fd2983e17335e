"""The operator commands' target: a queue on a Redis server, named by ``--redis URL --name NAME``.

``open_target(args)`` opens it for inspection and repair (no feature store, no
producing) and turns every way of not getting there -- redis-py missing, the
server unreachable or refusing, no queue of that name -- into a ``TargetError``
whose message names the URL (password hidden) and the queue, which the
commands print and exit with status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import urllib.parse
from collections.abc import Iterator
from typing import Any

__all__ = ["TargetError", "add_target_arguments", "list_target_queues", "open_target", "positive_float", "redact"]

# An operator command gives up on an unreachable server after this long (a queue's own default is 30 s).
RECONNECT_TIMEOUT = 2.0


class TargetError(Exception):
    """The queue cannot be reached or does not exist; the message says which and where."""


def add_target_arguments(parser: argparse.ArgumentParser, *, name_required: bool = True) -> None:
    """``--redis URL`` (default ``$FEATURESTREAM_REDIS_URL``), ``--name NAME`` and ``--json``."""
    default_url = os.environ.get("FEATURESTREAM_REDIS_URL")
    parser.add_argument(
        "--redis",
        metavar="redis://HOST:PORT/DB",
        default=default_url,
        required=default_url is None,
        help="the Redis server holding the queue (default: $FEATURESTREAM_REDIS_URL)",
    )
    parser.add_argument(
        "--name",
        required=name_required,
        help="the queue name (RedisSampleRefQueue(name=...))"
        + ("" if name_required else "; omit it to list the queues"),
    )
    parser.add_argument("--json", action="store_true", help="print JSON for scripts instead of a table")


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


@contextlib.contextmanager
def open_target(args: argparse.Namespace) -> Iterator[Any]:
    """Open the queue ``args.name`` at ``args.redis``; connection errors inside the block become ``TargetError``.

    The handle is disconnected when the block ends.
    """
    where = f"queue {args.name!r} at {redact(args.redis)}"
    try:
        import redis
        from featurestream.backends.redis.link import NotRedisServer, RedisUnreachable
        from featurestream.backends.redis.queue import RedisSampleRefQueue
    except ImportError as exc:
        raise TargetError(f"cannot open {where}: {exc}") from None
    try:
        queue = RedisSampleRefQueue.open(args.redis, args.name, reconnect_timeout=RECONNECT_TIMEOUT)
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
    """The queues on the server ``args.redis`` (name -> lifecycle state); every failure is a ``TargetError``."""
    where = f"the queues at {redact(args.redis)}"
    try:
        import redis
        from featurestream.backends.redis.link import NotRedisServer, RedisUnreachable
        from featurestream.backends.redis.queue import list_queues
    except ImportError as exc:
        raise TargetError(f"cannot list {where}: {exc}") from None
    try:
        return list_queues(args.redis, reconnect_timeout=RECONNECT_TIMEOUT)
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

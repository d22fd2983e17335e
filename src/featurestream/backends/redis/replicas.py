"""How many replicas a queue's primary has against how many its writes need, and what to say when that is short.

Two settings make a write need replicas: the queue's ``min_replicas`` (each call waits until that many replicas
have its effect) and the server's ``min-replicas-to-write`` (the primary refuses writes, ``NOREPLICAS``, with
fewer replicas connected). A failover leaves the promoted replica with one replica fewer than the cluster had
(the lost primary was one of the copies): a cluster of a primary and one replica then has none, and every call
fails until a replica is back. ``spare_replica_warning`` says so when a queue connects (a ``RuntimeWarning``);
``TooFewReplicas`` is what a call raises when it happens.
"""

from __future__ import annotations

from dataclasses import dataclass

import redis

from featurestream.common.errors import FeatureStreamError

__all__ = [
    "ReplicaCount",
    "TooFewReplicas",
    "count",
    "refused",
    "spare_replica_warning",
]

# What every message about too few replicas tells the operator to do.
REMEDY = (
    "start a replica of it (or restart the lost primary as one); to run on through the loss of a primary, "
    "run two replicas (docs/redis.md, Replication and failover)"
)


class TooFewReplicas(FeatureStreamError, redis.ConnectionError):
    """The primary answers but refuses writes (``NOREPLICAS``): it has fewer replicas connected than its
    ``min-replicas-to-write``. Nothing ran; the message names the server, both counts and what to do."""


@dataclass(frozen=True)
class ReplicaCount:
    """The replicas a primary has connected (``None``: it could not be asked) and ``min-replicas-to-write``
    (``None``: ``CONFIG GET`` is not allowed there)."""

    connected: int | None
    min_to_write: int | None


def count(client: redis.Redis) -> ReplicaCount:
    """``client``'s server's replica figures, one attempt each; what cannot be read is ``None``."""
    try:
        connected: int | None = int(client.info("replication").get("connected_slaves", 0))
    except redis.RedisError:
        connected = None
    try:
        found = client.config_get("min-replicas-to-write")
        value = found.get("min-replicas-to-write", found.get(b"min-replicas-to-write"))
        min_to_write = None if value is None else int(value)
    except (redis.RedisError, ValueError):
        min_to_write = None
    return ReplicaCount(connected, min_to_write)


def refused(where: str, figures: ReplicaCount, reconnect_timeout: float) -> TooFewReplicas:
    """The error for writes ``where`` kept refusing with ``NOREPLICAS`` for ``reconnect_timeout`` seconds."""
    has = "an unknown number of" if figures.connected is None else str(figures.connected)
    needs = "" if figures.min_to_write is None else f" and its min-replicas-to-write needs {figures.min_to_write}"
    return TooFewReplicas(
        f"{where} answers but refuses writes for want of replicas (NOREPLICAS, for reconnect_timeout="
        f"{reconnect_timeout:g} s): it has {has} replica(s) connected{needs}; nothing ran. To go on, {REMEDY}"
    )


def spare_replica_warning(where: str, figures: ReplicaCount, min_replicas: int, reconnect_timeout: float) -> str | None:
    """Why ``where`` cannot ride out the loss of its primary with these figures, or ``None`` when it can (or its
    replicas cannot be counted)."""
    if figures.connected is None:
        return None
    need = max(min_replicas, figures.min_to_write or 0)
    left = figures.connected - 1  # the promoted replica's, once the primary is lost
    if need == 0 or left >= need:
        return None
    return (
        f"{where} has {figures.connected} replica(s), and writes need {need} (min_replicas={min_replicas}, "
        f"min-replicas-to-write {figures.min_to_write if figures.min_to_write is not None else 'unknown'}): "
        f"after the loss of the primary the promoted replica has {max(left, 0)}, and every call fails until the "
        f"lost primary is back as a replica within reconnect_timeout={reconnect_timeout:g} s. Run two replicas "
        "to run on through the loss of the primary"
    )

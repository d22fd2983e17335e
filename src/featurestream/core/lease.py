"""A lease: one delivery attempt of a sample, and its visibility timeout."""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import math
import threading
from collections.abc import Callable, Iterable

from featurestream.common.errors import NotALease
from featurestream.common.refs import SampleRef

__all__ = ["DeadLetter", "Lease", "StaleLog", "VisibilityTimeout", "check_lease", "check_leases"]

_lease_id_counter = itertools.count()

# The reason of a dead letter whose sample the store lost (``LeaseQueue.lose``); the Redis Lua spells it the same.
LOST_REASON = "lost: the store lost its bytes (it was never scrubbed); no redelivery could serve it"
# The first word of a dead letter's reason when no consumer can train the sample (``LeaseQueue.reject``).
SCHEMA_REASON = "schema"


# Mint a fresh ``Lease.lease_id``, unique process-wide: the counter's own ``__next__``, so minting one (on every
# acquire) runs no Python frame.
_next_lease_id: Callable[[], int] = _lease_id_counter.__next__


@dataclasses.dataclass(frozen=True)
class VisibilityTimeout:
    """How long an unacked lease lives before it is reclaimed (positive, finite seconds)."""

    seconds: float = 30.0

    def __post_init__(self) -> None:
        seconds = self.seconds
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)):
            raise ValueError(f"VisibilityTimeout.seconds must be a number, got {seconds!r}")
        if not math.isfinite(seconds) or seconds <= 0:
            raise ValueError(f"VisibilityTimeout.seconds must be positive and finite, got {seconds!r}")


@dataclasses.dataclass
class Lease:
    """Handle to a leased ``SampleRef``; only the object ``acquire`` returned is honoured."""

    ref: SampleRef
    deadline: float
    visibility_timeout: VisibilityTimeout
    redelivery_count: int = 0
    lease_id: int = dataclasses.field(default_factory=_next_lease_id)


@dataclasses.dataclass(frozen=True)
class DeadLetter:
    """A sample whose deliveries were spent: its ref, why, and how often it was delivered."""

    ref: SampleRef
    reason: str
    deliveries: int


def check_lease(lease: object, action: str) -> None:
    """``TypeError`` naming the value unless ``lease`` is a ``Lease``: anything else is a programming error,
    not a stale lease (a stale one is a real ``Lease`` the queue no longer honours)."""
    if not isinstance(lease, Lease):
        raise NotALease(action, lease)


def check_leases(leases: Iterable[Lease], action: str) -> list[Lease]:
    """A batch as a list, ``TypeError`` naming the first item that is not a ``Lease`` (before any settles)."""
    if isinstance(leases, Lease):
        raise TypeError(f"{action} expects an iterable of leases, got the single Lease {leases.lease_id}")
    batch = list(leases)
    for lease in batch:
        check_lease(lease, action)
    return batch


class StaleLog:
    """Logs a rejected stale lease once per lease (a retry loop acking the same stale lease logs one line).

    Remembers the last ``limit`` lease ids it logged; thread-safe.
    """

    __slots__ = ("_limit", "_lock", "_logged", "_logger")
    MESSAGE = "stale %s of lease %s (sample %r) rejected: %s; nothing changed"

    def __init__(self, logger: logging.Logger, limit: int = 4096) -> None:
        self._logger = logger
        self._limit = limit
        self._lock = threading.Lock()
        self._logged: collections.OrderedDict[int, None] = collections.OrderedDict()

    def rejected(self, action: str, lease: Lease, why: str) -> None:
        key = lease.lease_id if type(lease.lease_id) is int else id(lease)  # a forged id may be unhashable
        with self._lock:
            if key in self._logged:
                return
            self._logged[key] = None
            if len(self._logged) > self._limit:
                self._logged.popitem(last=False)
        self._logger.warning(
            self.MESSAGE,
            action,
            lease.lease_id,
            getattr(lease.ref, "sample_id", None),
            why,
        )

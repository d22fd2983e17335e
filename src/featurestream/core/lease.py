"""A lease: one delivery attempt of a sample, and its visibility timeout."""

from __future__ import annotations

import dataclasses
import itertools
import math

from featurestream.core.refs import SampleRef

__all__ = ["DeadLetter", "Lease", "VisibilityTimeout"]

_lease_id_counter = itertools.count()


def _next_lease_id() -> int:
    """Mint a fresh ``Lease.lease_id``, unique process-wide."""
    return next(_lease_id_counter)


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

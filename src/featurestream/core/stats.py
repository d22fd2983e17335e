"""``QueueStats`` and the defaults every queue backend shares (``max_deliveries``, ``dedup_window``)."""

from __future__ import annotations

import dataclasses

__all__ = ["DEFAULT_DEDUP_WINDOW", "DEFAULT_MAX_DELIVERIES", "QUEUE_STATS_GAUGES", "STATS_FIELDS", "QueueStats"]

DEFAULT_MAX_DELIVERIES = 10
DEFAULT_DEDUP_WINDOW = 100_000


@dataclasses.dataclass(frozen=True)
class QueueStats:
    """Counters since construction, plus the current gauges.

    ``store_errors`` counts store calls made by the queue that raised (each
    failed retry counts again); ``scrub_backlog`` is the gauge of settled
    samples (or refused puts) whose ``scrub`` (``unretain``) the queue still
    owes the store and retries. ``requeued`` / ``purged`` count dead letters
    sent back by ``requeue_dead_letters`` / dropped by ``purge_dead_letters``;
    ``given_back`` counts unused leases handed back by ``give_back`` (pending
    again, no delivery spent).
    """

    put: int = 0
    leased: int = 0
    acked: int = 0
    failed: int = 0
    reclaimed: int = 0
    dead_lettered: int = 0
    extended: int = 0
    stale_rejected: int = 0
    dedup_refused: int = 0
    producer_pauses: int = 0
    store_errors: int = 0
    requeued: int = 0
    purged: int = 0
    given_back: int = 0
    # Gauges: the current value, not a count since construction (marked so readers need not list them).
    pending: int = dataclasses.field(default=0, metadata={"gauge": True})
    outstanding: int = dataclasses.field(default=0, metadata={"gauge": True})
    scrub_backlog: int = dataclasses.field(default=0, metadata={"gauge": True})


STATS_FIELDS: tuple[str, ...] = tuple(field.name for field in dataclasses.fields(QueueStats))
QUEUE_STATS_GAUGES: tuple[str, ...] = tuple(f.name for f in dataclasses.fields(QueueStats) if f.metadata.get("gauge"))

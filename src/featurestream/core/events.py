"""The trace-event vocabulary: the names every queue backend passes to its ``tracer``.

Each name is the ``spec/LeaseQueue.tla`` action the event corresponds to, so
``featurestream.spec.trace`` can replay a recorded trace through TLC and the
demo can count events. Backends, the trace validator and the demo import these
constants instead of spelling the strings.
"""

from __future__ import annotations

from featurestream.core.machines import LEASE, LIFECYCLE

__all__ = [
    "ACK",
    "ACQUIRE",
    "ALL",
    "CLOSE",
    "DEAD_LETTER",
    "DEDUP_REFUSED",
    "DRAIN",
    "EXTEND",
    "FAIL",
    "GIVE_BACK",
    "PAUSE",
    "PURGE_DEAD_LETTER",
    "PUT",
    "RECLAIM",
    "REQUEUE_DEAD_LETTER",
    "RESIDENT",
    "RESUME",
    "SCRUB_RETRIED",
    "STALE_REJECTED",
    "STORE_FAULT",
    "TRIGGER_EVENTS",
]

PUT = "Put"
ACQUIRE = "Acquire"
ACK = "Ack"
FAIL = "Fail"
GIVE_BACK = "GiveBack"  # an unused lease handed back: pending again, no delivery counted
RECLAIM = "Reclaim"
EXTEND = "Extend"
DEAD_LETTER = "DeadLetter"
DEDUP_REFUSED = "DedupRefused"
STALE_REJECTED = "StaleRejected"
CLOSE = "Close"
DRAIN = "Drain"
PAUSE = "Pause"
RESUME = "Resume"
STORE_FAULT = "StoreFault"  # a store call the queue made raised (fields: call, sample_id, error)
SCRUB_RETRIED = "ScrubRetried"  # an owed scrub/unretain finally went through (fields: call, sample_id)
REQUEUE_DEAD_LETTER = "RequeueDeadLetter"  # a kept dead letter sent back with a fresh budget (fields: sample_id)
PURGE_DEAD_LETTER = "PurgeDeadLetter"  # a dead letter dropped for good (fields: sample_id)
RESIDENT = "Resident"  # a trace recorder's own observation of store residency, not a queue event

# Machine trigger name -> event name, for the lease and lifecycle transitions.
TRIGGER_EVENTS: dict[str, str] = {t.trigger: t.spec_action for table in (LEASE, LIFECYCLE) for t in table.transitions}

ALL = frozenset(
    {
        PUT, ACQUIRE, ACK, FAIL, GIVE_BACK, RECLAIM, EXTEND, DEAD_LETTER, DEDUP_REFUSED,
        STALE_REJECTED, CLOSE, DRAIN, PAUSE, RESUME, STORE_FAULT, SCRUB_RETRIED,
        REQUEUE_DEAD_LETTER, PURGE_DEAD_LETTER, RESIDENT,
    }
)  # fmt: skip

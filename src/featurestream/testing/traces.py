"""Queue traces recorded from runs of the stateful machine, for TLC trace validation."""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from featurestream.spec.trace import TraceResult
from featurestream.testing.machine import QueueMachine

Trace = list[tuple[str, dict[str, object]]]


def record_machine_traces(machine: type[QueueMachine], runs: int, steps: int = 40) -> list[Trace]:
    """Run ``machine`` ``runs`` times (generation only: no shrinking, no example database); return each trace.

    A run that breaks an invariant raises, as the machine's own test would. Runs that traced
    nothing (only rules that arm faults or set callbacks) are left out: an empty trace proves nothing.
    """
    traces: list[Trace] = []

    class Recording(machine):  # type: ignore[misc, valid-type]
        def teardown(self) -> None:
            if self.trace.events:
                traces.append(list(self.trace.events))
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
    return traces


def duplicate_delivery_trace(machine: type[QueueMachine]) -> Trace:
    """Ack ``s0``, put it again and lease it again, through ``machine``'s own actions; return the trace.

    With a queue that keeps its dedup window this raises (the re-put is refused);
    with a seeded defect C it yields a trace the spec must reject, which shows a
    trace validator has teeth.
    """
    state = machine()
    state.do_put("s0", blocking=False)
    lease = state.do_acquire("c0")
    assert lease is not None, "the first put must be leasable"
    state.do_ack(lease)
    state.do_put("s0", blocking=False)
    assert state.do_acquire("c1") is not None, "the re-put sample was not delivered again"
    return list(state.trace.events)


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

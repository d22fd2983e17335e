"""Queue traces recorded from runs of the stateful machine, for TLC trace validation."""

from __future__ import annotations

from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from featurestream.testing.machine import QueueMachine

Trace = list[tuple[str, dict[str, object]]]


def record_machine_traces(machine: type[QueueMachine], runs: int, steps: int = 40) -> list[Trace]:
    """Run ``machine`` ``runs`` times (generation only: no shrinking, no example database); return each trace.

    A run that breaks an invariant raises, as the machine's own test would.
    """
    traces: list[Trace] = []

    class Recording(machine):  # type: ignore[misc, valid-type]
        def teardown(self) -> None:
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

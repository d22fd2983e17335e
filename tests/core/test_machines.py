"""The state machines enforce their tables: a transition a table does not allow raises, never passes silently."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
from transitions import MachineError

from featurestream import LocalFeatureStore, SampleRefQueue, VisibilityTimeout
from featurestream.backends.memory.queue import MemoryEngine
from featurestream.common.errors import IllegalTransition
from featurestream.core import machines
from featurestream.core.engine import EngineContext, Event
from featurestream.testing import FakeClock, sample_tensors


class _Model:
    def __init__(self, state: str) -> None:
        self.state = state

    def __str__(self) -> str:
        return "lease 7 of sample 's0'"


@pytest.mark.parametrize(
    ("machine", "state", "trigger"),
    [
        (machines.LEASE_MACHINE, "acked", "ack"),
        (machines.LEASE_MACHINE, "pending", "ack"),
        (machines.LEASE_MACHINE, "reclaimed", "extend"),
        (machines.LIFECYCLE_MACHINE, "drained", "close"),
        (machines.BACKPRESSURE_MACHINE, "paused", "pause"),
    ],
)
def test_fire_refuses_what_the_table_does_not_allow(machine: machines.TableMachine, state: str, trigger: str) -> None:
    model = _Model(state)
    with pytest.raises(IllegalTransition) as caught:
        machines.fire(machine, trigger, model)
    assert model.state == state
    error = caught.value
    assert (error.machine, error.subject, error.state, error.trigger) == (
        machine.table.name,
        str(model),
        state,
        trigger,
    )
    assert (
        str(error)
        == f"{machine.table.name} machine: lease 7 of sample 's0' is {state!r}, which has no {trigger!r} transition"
    )


def test_fire_moves_a_model_along_an_allowed_edge() -> None:
    model = _Model("pending")
    machines.fire(machines.LEASE_MACHINE, "lease", model)
    machines.fire(machines.LEASE_MACHINE, "extend", model)
    machines.fire(machines.LEASE_MACHINE, "ack", model)
    assert model.state == "acked"


@pytest.mark.parametrize("table", [machines.LEASE, machines.BACKPRESSURE, machines.LIFECYCLE], ids=lambda t: t.name)
def test_fire_agrees_with_the_transitions_machine_on_every_state_and_trigger(table: machines.MachineTable) -> None:
    """``fire`` takes the edges the built machine holds; ``Event.trigger`` of that same machine must agree on
    every pair: the destination, or a refusal that leaves the state as it was."""
    machine = machines.build_machine(table)
    assert machine.edges is not None
    for state in table.states:
        for trigger in {t.trigger for t in table.transitions}:
            ours, theirs = _Model(state), _Model(state)
            try:
                machine.events[trigger].trigger(theirs)
            except MachineError:
                with pytest.raises(IllegalTransition):
                    machines.fire(machine, trigger, ours)
            else:
                machines.fire(machine, trigger, ours)
            assert ours.state == theirs.state, (state, trigger)


def test_a_machine_with_a_callback_fires_through_transitions_and_still_refuses() -> None:
    machine = machines.build_machine(machines.LEASE)
    entered: list[str] = []
    machine.states["leased"].add_callback("enter", lambda: entered.append("leased"))
    machine.edges = machine._plain_edges()
    assert machine.edges is None, "taking the edge alone would skip the callback"
    model = _Model("pending")
    machines.fire(machine, "lease", model)
    assert (model.state, entered) == ("leased", ["leased"])
    with pytest.raises(IllegalTransition, match="'leased', which has no 'lease' transition"):
        machines.fire(machine, "lease", model)
    assert model.state == "leased"


class _Unforgetting(dict):  # type: ignore[type-arg]
    """Seeded defect: an index of the engine that never forgets a settled lease."""

    def __delitem__(self, key: object) -> None:
        pass


class _UnforgettingEngine(MemoryEngine):
    """Seeded defect: the live-lease and held-sample indexes never forget, so a second ack settles again."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._live = _Unforgetting()
        self._held = _Unforgetting()


class _ReportingTwiceEngine(MemoryEngine):
    """Seeded defect: the engine reports each of its events twice (an engine replaying what it did)."""

    def __init__(self, context: EngineContext, **options: Any) -> None:
        def twice(event: Event) -> None:
            context.report(event)
            context.report(event)

        super().__init__(dataclasses.replace(context, report=twice), **options)


def _queue(engine: type[MemoryEngine] = MemoryEngine) -> tuple[LocalFeatureStore, SampleRefQueue]:
    class Queue(SampleRefQueue):
        _engine_class = engine

    store = LocalFeatureStore(max_samples=None)
    return store, Queue(store, VisibilityTimeout(10.0), clock=FakeClock(1000.0))


def test_an_engine_that_settles_a_lease_twice_is_caught() -> None:
    store, queue = _queue(_UnforgettingEngine)
    queue.put(store.put("s0", sample_tensors(0)))
    lease = queue.acquire(timeout=0)
    assert lease is not None
    queue.ack(lease)
    with pytest.raises(IllegalTransition, match=rf"lease {lease.lease_id} of sample 's0' is 'acked'.*'ack'"):
        queue.ack(lease)


@pytest.mark.parametrize(("settle", "state", "trigger"), [("ack", "acked", "ack"), ("fail", "failed", "fail")])
def test_an_engine_reporting_a_settle_twice_is_caught_by_the_front_end(settle: str, state: str, trigger: str) -> None:
    store, queue = _queue(_ReportingTwiceEngine)
    queue.put(store.put("s0", sample_tensors(0)))  # an Admitted reported twice only traces twice
    with pytest.raises(IllegalTransition) as leasing:
        queue.acquire(timeout=0)  # Leased twice: the second "lease" finds the model leased
    assert (leasing.value.state, leasing.value.trigger) == ("leased", "lease")
    (model,) = queue._engine._live.values()
    assert model.lease is not None
    with pytest.raises(IllegalTransition) as caught:
        getattr(queue, settle)(model.lease)
    error = caught.value
    assert (error.machine, error.state, error.trigger) == ("lease", state, trigger)
    assert error.subject == f"lease {model.lease_id} of sample 's0'"


def test_the_queue_fires_the_lease_machine_on_every_transition(monkeypatch: pytest.MonkeyPatch) -> None:
    fired: list[str] = []

    def counting(machine: machines.TableMachine, trigger: str, model: object) -> None:
        if machine is machines.LEASE_MACHINE:
            fired.append(trigger)
        machines.fire(machine, trigger, model)

    monkeypatch.setattr("featurestream.core.effects.fire", counting)
    store, queue = _queue()
    queue.put(store.put("s0", sample_tensors(0)))
    lease = queue.acquire(timeout=0)
    assert lease is not None
    queue.ack(lease)
    assert fired == ["lease", "ack"]
    queue.close()
    queue.close()  # closing a closed queue changes nothing and fires nothing
    assert queue.lifecycle_state == "drained"

"""The state machines enforce their tables: a transition a table does not allow raises, never passes silently."""

from __future__ import annotations

import pytest

from featurestream import LocalFeatureStore, SampleRefQueue, VisibilityTimeout
from featurestream.core import machines
from featurestream.core.errors import IllegalTransition
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


class _Unforgetting(dict):  # type: ignore[type-arg]
    """Seeded defect: the queue's live-lease index never forgets a settled lease."""

    def __delitem__(self, key: object) -> None:
        pass


def _queue() -> tuple[LocalFeatureStore, SampleRefQueue]:
    store = LocalFeatureStore(max_samples=None)
    return store, SampleRefQueue(store, VisibilityTimeout(10.0), clock=FakeClock(1000.0))


def test_an_engine_that_settles_a_lease_twice_is_caught() -> None:
    store, queue = _queue()
    queue._live = _Unforgetting()
    queue.put(store.put("s0", sample_tensors(0)))
    lease = queue.acquire(timeout=0)
    assert lease is not None
    queue.ack(lease)
    with pytest.raises(IllegalTransition, match=rf"lease {lease.lease_id} of sample 's0' is 'acked'.*'ack'"):
        queue.ack(lease)


def test_the_queue_fires_the_lease_machine_on_every_transition(monkeypatch: pytest.MonkeyPatch) -> None:
    fired: list[str] = []

    def counting(machine: machines.TableMachine, trigger: str, model: object) -> None:
        if machine is machines.LEASE_MACHINE:
            fired.append(trigger)
        machines.fire(machine, trigger, model)

    monkeypatch.setattr("featurestream.core.queue.fire", counting)
    store, queue = _queue()
    queue.put(store.put("s0", sample_tensors(0)))
    lease = queue.acquire(timeout=0)
    assert lease is not None
    queue.ack(lease)
    assert fired == ["lease", "ack"]
    queue.close()
    queue.close()  # closing a closed queue changes nothing and fires nothing
    assert queue.lifecycle_state == "drained"

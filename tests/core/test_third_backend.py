"""docs/architecture.md's claim that a third backend is an engine, a factory and a test module: its example, run."""

from __future__ import annotations

import pathlib
import re
import textwrap
import threading
from typing import Any

import pytest
from hypothesis import settings
from hypothesis.stateful import run_state_machine_as_test

from featurestream import LocalFeatureStore, VisibilityTimeout
from featurestream.core.coordinator import Coordinator
from featurestream.core.engine import Engine, EngineContext
from featurestream.testing import FakeClock, MachineConfig, make_queue_machine, sample_tensors

DOC = pathlib.Path(__file__).parents[2] / "docs" / "architecture.md"


def docs_example() -> dict[str, Any]:
    """The namespace the architecture doc's ``TallyEngine`` block leaves, run as written."""
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    (example,) = [textwrap.dedent(block) for block in blocks if "class TallyEngine" in block]
    namespace: dict[str, Any] = {"__name__": "third_backend_example"}
    exec(compile(example, str(DOC), "exec"), namespace)
    return namespace


def test_the_example_is_a_lease_queue_whose_engine_sees_every_delivery() -> None:
    example = docs_example()
    store = LocalFeatureStore()
    clock = FakeClock(100.0)
    queue = example["tally_queue"](store, VisibilityTimeout(10.0), clock=clock, max_deliveries=3)
    assert isinstance(queue, Coordinator) and type(queue._engine) is example["TallyEngine"]
    queue.put(store.put("s0", sample_tensors(0)))
    first = queue.acquire(timeout=0)
    assert first is not None and queue.fail(first)
    clock.advance(0.5)
    second = queue.acquire(timeout=0)
    assert second is not None and second.redelivery_count == 1
    clock.advance(20.0)  # past its deadline: the next call reclaims it
    third = queue.acquire(timeout=0)
    assert third is not None and not queue.ack(second) and queue.ack(third)
    assert queue._engine.tally == {"s0": 3}
    assert queue.stats().acked == 1 and queue.stats().reclaimed == 1 and queue.stats().stale_rejected == 1
    assert store.health().sample_count == 0  # the coordinator scrubbed the acked sample


def test_the_front_end_checks_its_arguments_before_it_builds_the_engine() -> None:
    built: list[EngineContext] = []

    def factory(context: EngineContext) -> Any:
        built.append(context)
        raise AssertionError("not reached")

    with pytest.raises(ValueError, match="max_deliveries"):
        Coordinator(LocalFeatureStore(), engine=factory, max_deliveries=0)
    with pytest.raises(TypeError, match="store must be a FeatureStore"):
        Coordinator(object(), engine=factory)  # type: ignore[arg-type]
    assert built == []


def test_a_factory_that_raises_starts_no_reaper() -> None:
    before = set(threading.enumerate())

    def refuse(context: EngineContext) -> Any:
        assert context.max_deliveries == 4 and context.traced and context.visibility_timeout.seconds == 7.0
        raise ConnectionError("no server")

    with pytest.raises(ConnectionError, match="no server"):
        Coordinator(
            LocalFeatureStore(), VisibilityTimeout(7.0), engine=refuse, max_deliveries=4, tracer=lambda *_: None,
            reaper_interval=0.01,
        )  # fmt: skip
    assert set(threading.enumerate()) == before


def test_the_stateful_kit_passes_against_the_example() -> None:
    example = docs_example()
    machine = make_queue_machine(LocalFeatureStore, example["tally_queue"], MachineConfig(), name="TallyMachine")
    budget = settings(max_examples=40, stateful_step_count=30, deadline=None, derandomize=True, database=None)
    run_state_machine_as_test(machine, settings=budget)


def test_the_engine_contract_stays_narrow() -> None:
    """At most 15 methods, and no capability flag: ``max_batch`` (a limit) is the one attribute."""
    methods = [name for name, value in vars(Engine).items() if callable(value) and not name.startswith("_")]
    assert len(methods) <= 15, sorted(methods)
    assert set(Engine.__annotations__) == {"max_batch"}

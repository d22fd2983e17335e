"""What Coordinator writes once for every backend: the training ledger, its holds read, the operator-handle refusal."""

from __future__ import annotations

import pytest

from featurestream import LocalFeatureStore, SampleRefQueue, VisibilityTimeout
from featurestream.backends.memory.engine import MemoryEngine
from featurestream.core.coordinator import Coordinator
from featurestream.core.engine import EngineContext
from featurestream.core.operator_store import NoStore
from featurestream.testing import FakeClock, sample_tensors


def test_the_ledger_is_made_once_and_holds_pending_or_leased_samples_never_dead_letters() -> None:
    store = LocalFeatureStore()
    queue = SampleRefQueue(store, VisibilityTimeout(10.0), max_deliveries=1, clock=FakeClock(0.0))
    for index in range(3):
        queue.put(store.put(f"s{index}", sample_tensors(index)))
    ledger = queue.training_ledger()
    assert queue.training_ledger() is ledger
    dead = queue.acquire(timeout=0)
    leased = queue.acquire(timeout=0)
    assert dead is not None and leased is not None and queue.fail(dead)  # max_deliveries=1: a dead letter
    assert [letter.ref.sample_id for letter in queue.dead_letters()] == ["s0"]
    assert ledger.holds(["s0", "s1", "s2", "nothing"]) == {"s1", "s2"}


def test_an_operator_handle_neither_puts_nor_leases_and_says_whose_handle_it_is() -> None:
    def engine(context: EngineContext) -> MemoryEngine:
        return MemoryEngine(context, clock=FakeClock(0.0))

    handle = Coordinator(NoStore("jobs", "MyQueue.open"), engine=engine)
    store = LocalFeatureStore()
    ref = store.put("s0", sample_tensors(0))
    with pytest.raises(RuntimeError, match=r"handle on queue 'jobs' is an operator's handle \(MyQueue.open\)"):
        handle.put(ref)
    with pytest.raises(RuntimeError, match="neither puts nor leases"):
        handle.acquire(timeout=0)
    assert handle.stats().put == 0 and handle.dead_letters() == []

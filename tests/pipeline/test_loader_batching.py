"""FeatureDataLoader with batch_size / collate_fn / batch_type: k samples per batch, settled together."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from typing import Any

import pytest
import torch

from compat.recipe import RecipeBatch  # a recipe's own batch class: built by keyword, no from_tensors
from featurestream import Eagle3TargetBatch, FeatureDataLoader, FeatureStore, LocalFeatureStore, SampleRefQueue
from featurestream.core.lease import Lease
from support.helpers import eagle3_sample, put_eagle3, untrainable_eagle3_sample

from . import test_loader_prefetch
from .test_loader_prefetch import filled_queue

make_store = test_loader_prefetch.make_store  # the store fixture: local and shared-dir

PREFETCH = pytest.mark.parametrize("prefetch", [0, 2])


def indices(batch: Any) -> list[int]:
    return [int(v) // 100 for v in batch.input_ids[:, 0].tolist()]


class BatchCallingQueue(SampleRefQueue):
    """A queue with the batch operations, counting the calls (the loader must prefer them to per-item calls)."""

    def __init__(self, store: FeatureStore) -> None:
        super().__init__(store)
        self.calls: Counter[str] = Counter()

    def acquire(self, poll_interval: float = 0.05, *, timeout: float | None = None) -> Any:
        self.calls["acquire"] += 1
        return super().acquire(poll_interval, timeout=timeout)

    def acquire_many(self, n: int, *, timeout: float | None = None) -> list[Lease]:
        self.calls["acquire_many"] += 1
        first = super().acquire(timeout=timeout)
        leases = [first] if first is not None else []
        while leases and len(leases) < n and (lease := super().acquire(timeout=0)) is not None:
            leases.append(lease)
        return leases

    def ack_many(self, leases: list[Lease]) -> None:
        self.calls["ack_many"] += 1
        for lease in leases:
            self.ack(lease)

    def fail_many(self, leases: list[Lease]) -> None:
        self.calls["fail_many"] += 1
        for lease in leases:
            self.fail(lease)


@PREFETCH
def test_default_collate_concatenates_k_samples_and_acks_them_together(
    make_store: Callable[[], FeatureStore], prefetch: int
) -> None:
    store = make_store()
    queue = filled_queue(store, 7)
    loader = FeatureDataLoader(queue, make_store(), batch_size=3, prefetch=prefetch)
    first = next(loader)
    assert isinstance(first, Eagle3TargetBatch) and indices(first) == [0, 1, 2]
    expected = torch.cat([eagle3_sample(i)["logits"] for i in range(3)])
    assert torch.equal(first.logits, expected) and first.aux_hidden_states.shape[0] == 3
    assert [lease.ref.sample_id for lease in loader.current_leases] == ["s0", "s1", "s2"]
    assert queue.stats().acked == 0, "valid through the step"
    assert indices(next(loader)) == [3, 4, 5] and queue.stats().acked == 3
    assert [indices(batch) for batch in loader] == [[6]], "the last batch is short"
    assert queue.stats().acked == 7 and queue.lifecycle_state == "drained" and store.health().sample_count == 0


@PREFETCH
def test_batch_operations_are_used_when_the_queue_has_them(
    make_store: Callable[[], FeatureStore], prefetch: int
) -> None:
    store = make_store()
    queue = BatchCallingQueue(store)
    for index in range(4):
        queue.put(put_eagle3(store, index))
    queue.close()
    loader = FeatureDataLoader(queue, make_store(), batch_size=2, prefetch=prefetch)
    next(loader)
    loader.fail_current()
    assert [indices(batch) for batch in loader] == [[2, 3], [0, 1]]
    assert queue.calls["ack_many"] == 2 and queue.calls["fail_many"] == 1
    # A prefetching pull that tops up a batch holding one lease asks for one, through the per-item acquire (by
    # design: batching.acquire_many); whether it happens depends on the thread's timing, so it may occur at most
    # once per batch call, never in place of one.
    assert queue.calls["acquire_many"] >= 3 and queue.calls["acquire"] <= queue.calls["acquire_many"]


@PREFETCH
def test_fail_current_and_an_error_exit_give_all_k_back(make_store: Callable[[], FeatureStore], prefetch: int) -> None:
    store = make_store()
    queue = filled_queue(store, 4)
    with pytest.raises(KeyError):
        with FeatureDataLoader(queue, make_store(), batch_size=2, prefetch=prefetch) as loader:
            next(loader)
            loader.fail_current()
            assert queue.stats().failed == 2
            next(loader)
            raise KeyError("step failed")
    stats = queue.stats()
    assert (stats.acked, stats.pending, stats.outstanding) == (0, 4, 0), "all four back, none lost"


@PREFETCH
def test_unequal_shapes_are_refused_and_the_batch_goes_back(
    make_store: Callable[[], FeatureStore], prefetch: int
) -> None:
    store = make_store()
    queue = SampleRefQueue(store, max_deliveries=1)
    queue.put(put_eagle3(store, 0))
    queue.put(store.put("long", eagle3_sample(1, tokens=6)))
    queue.close()
    loader = FeatureDataLoader(queue, make_store(), batch_size=2, prefetch=prefetch)
    with pytest.raises(
        ValueError, match=r"cannot collate feature 'aux_hidden_states'.*'s0': \(\(1, 4, 2\).*'long': \(\(1, 6, 2\)"
    ):
        next(loader)
    assert sorted(d.ref.sample_id for d in queue.dead_letters()) == ["long", "s0"], "both failed back (max 1 try)"
    assert list(loader) == []


@PREFETCH
def test_a_custom_collate_gets_the_tensor_dicts_in_lease_order(
    make_store: Callable[[], FeatureStore], prefetch: int
) -> None:
    store = make_store()
    queue = filled_queue(store, 5)
    seen: list[list[str]] = []

    def collate(samples: list[dict[str, torch.Tensor]]) -> list[int]:
        seen.append(list(samples[0]))
        return [int(sample["input_ids"][0, 0]) // 100 for sample in samples]

    batches = list(FeatureDataLoader(queue, make_store(), batch_size=2, collate_fn=collate, prefetch=prefetch))
    assert batches == [[0, 1], [2, 3], [4]]
    assert seen[0] == list(eagle3_sample(0)) and queue.stats().acked == 5


@PREFETCH
def test_batch_type_builds_the_recipes_own_class(make_store: Callable[[], FeatureStore], prefetch: int) -> None:
    store = make_store()
    queue = filled_queue(store, 3)
    batches = list(FeatureDataLoader(queue, make_store(), batch_type=RecipeBatch, batch_size=2, prefetch=prefetch))
    assert [type(batch) for batch in batches] == [RecipeBatch, RecipeBatch]
    assert indices(batches[0]) == [0, 1] and batches[1].target_probs is None


@PREFETCH
def test_a_bad_sample_in_a_batch_is_raised_in_order_and_the_good_ones_carry_over(
    make_store: Callable[[], FeatureStore], prefetch: int
) -> None:
    store = make_store()
    queue = SampleRefQueue(store)
    queue.put(put_eagle3(store, 0))
    queue.put(store.put("bad", untrainable_eagle3_sample(1)))
    for index in (2, 3):
        queue.put(put_eagle3(store, index))
    queue.close()
    loader = FeatureDataLoader(queue, make_store(), batch_size=2, prefetch=prefetch)
    with pytest.raises(ValueError, match=r"'bad'.*dead-lettered \(reason schema"):
        next(loader)
    assert [indices(batch) for batch in loader] == [[0, 2], [3]]
    stats = queue.stats()
    # The bad sample's one delivery ended in its dead letter (counted failed, as a lost one is); the good samples
    # were never redelivered.
    assert (stats.acked, stats.failed, stats.dead_lettered, stats.leased) == (3, 1, 1, 4)


def test_bad_batching_arguments_are_refused() -> None:
    queue = SampleRefQueue(LocalFeatureStore())
    with pytest.raises(ValueError, match=r"batch_size must be an int >= 1, got 0"):
        FeatureDataLoader(queue, queue.store, batch_size=0)
    with pytest.raises(TypeError, match=r"collate_fn must be callable, got 3"):
        FeatureDataLoader(queue, queue.store, collate_fn=3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"batch_type must be a class, got 'x'"):
        FeatureDataLoader(queue, queue.store, batch_type="x")  # type: ignore[arg-type]

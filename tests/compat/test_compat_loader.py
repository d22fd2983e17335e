"""compat.md, loader: the batch type a recipe chooses, to_trainer_inputs(), algorithm mismatches, the drain."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest
import torch

from featurestream.eagle3 import Eagle3TargetBatch
from featurestream.loader import FeatureDataLoader
from featurestream.queue import SampleRefQueue
from featurestream.refs import FeatureAlgorithm
from featurestream.stores.local import LocalFeatureStore

from .recipe import RecipeBatch, packing, sample_tensors

FIELDS = (
    "aux_hidden_states", "input_ids", "attention_mask", "loss_mask", "logits", "target_probs", "position_mask",
    "position_ids", "seq_lens", "doc_remaining",
)  # fmt: skip


def queued(*samples: dict[str, torch.Tensor], **put_kwargs: Any) -> tuple[SampleRefQueue, LocalFeatureStore]:
    store = LocalFeatureStore()
    queue = SampleRefQueue(store)
    for index, tensors in enumerate(samples):
        queue.put(store.put(f"s{index}", tensors, **put_kwargs))
    queue.close()
    return queue, store


def test_batches_have_the_reference_fields() -> None:
    queue, store = queued(sample_tensors(0))
    with FeatureDataLoader(queue, store) as loader:
        (batch,) = list(loader)
    assert isinstance(batch, Eagle3TargetBatch)
    assert tuple(field.name for field in dataclasses.fields(batch)) == FIELDS
    assert torch.equal(batch.logits, sample_tensors(0)["logits"]) and batch.target_probs is None


def test_to_trainer_inputs_for_the_logits_encoding() -> None:
    tensors = {**sample_tensors(0), **packing()}
    queue, store = queued(tensors)
    with FeatureDataLoader(queue, store) as loader:
        inputs = next(loader).to_trainer_inputs()
    # The reference trainer's keyword for the logits is target_logits; every other feature keeps its name.
    assert set(inputs) == set(tensors) - {"logits"} | {"target_logits"} and "target_probs" not in inputs
    assert torch.equal(inputs["target_logits"], tensors["logits"])
    assert all(torch.equal(inputs[name], tensor) for name, tensor in tensors.items() if name != "logits")


def test_to_trainer_inputs_for_the_draft_vocab_encoding() -> None:
    tensors = sample_tensors(0, encoding="draft-vocab")
    queue, store = queued(tensors)
    with FeatureDataLoader(queue, store) as loader:
        inputs = next(loader).to_trainer_inputs()
    assert set(inputs) == set(tensors) and "logits" not in inputs
    assert torch.equal(inputs["target_probs"], tensors["target_probs"])
    assert torch.equal(inputs["position_mask"], tensors["position_mask"])


def test_a_recipe_chooses_its_own_batch_type() -> None:
    queue, store = queued(sample_tensors(0), sample_tensors(1, encoding="draft-vocab"))
    with FeatureDataLoader(queue, store, batch_type=RecipeBatch) as loader:
        batches = list(loader)
    assert len(batches) == 2 and all(isinstance(batch, RecipeBatch) for batch in batches)
    assert batches[0].logits is not None and batches[1].target_probs is not None
    assert set(batches[0].to_trainer_inputs()) == {"hidden_states", "input_ids"}


def test_an_algorithm_mismatch_fails_the_lease_back() -> None:
    dflash = {"hidden_states": torch.zeros(1, 6, 4), **sample_tensors(0)}
    queue, store = queued(dflash, algorithm=FeatureAlgorithm.DFLASH)
    loader = FeatureDataLoader(queue, store, prefetch=0)
    with pytest.raises(ValueError, match=r"bound to algorithm=FeatureAlgorithm\.EAGLE3"):
        next(loader)
    assert queue.outstanding_count() == 0 and queue.pending_count() == 1, "failed back, not dropped"
    assert queue.stats().failed == 1


class ObservedQueue(SampleRefQueue):
    """Signals each acquire that came back empty (a consumer polling a closed queue with nothing pending)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.empty_polls = threading.Semaphore(0)

    def acquire(self, poll_interval: float = 0.05, *, timeout: float | None = None) -> Any:
        lease = super().acquire(poll_interval, timeout=timeout)
        if lease is None:
            self.empty_polls.release()
        return lease


def test_the_loader_waits_for_the_drain_while_another_consumer_holds_a_lease() -> None:
    # A deliberate difference (docs/compatibility.md): the reference would end here and lose the redelivery.
    store = LocalFeatureStore()
    queue = ObservedQueue(store)
    queue.put(store.put("s0", sample_tensors(0)))
    other_consumer = queue.acquire(timeout=0)
    assert other_consumer is not None
    queue.close()
    got: list[Any] = []
    loader = FeatureDataLoader(queue, store, prefetch=0, acquire_poll_interval=0.01)
    reader = threading.Thread(target=lambda: got.extend(batch.input_ids.clone() for batch in loader))
    reader.start()
    assert queue.empty_polls.acquire(timeout=30), "the loader polled the closed queue and found nothing pending"
    queue.fail(other_consumer)  # the other consumer gives up: the sample is redelivered to this loader
    reader.join(30)
    assert not reader.is_alive() and len(got) == 1 and torch.equal(got[0], sample_tensors(0)["input_ids"])

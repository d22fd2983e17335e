"""FeatureProducer and FeatureDataLoader against a real tiny target model and the built-in stores."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import torch

from featurestream import (
    Eagle3TargetBatch,
    FeatureAlgorithm,
    FeatureDataLoader,
    FeatureProducer,
    LocalFeatureStore,
    SampleRefQueue,
)
from featurestream.tools.models import TinyConfig, TinyTargetModel, prompt_batches

from .helpers import eagle3_sample, put_eagle3

CONFIG = TinyConfig(vocab_size=32, hidden_size=16, num_layers=3, num_heads=2, max_seq_len=16)


class RecordingTarget(TinyTargetModel):
    """The real tiny target, remembering what each forward returned and received."""

    def __init__(self) -> None:
        super().__init__(CONFIG, seed=0)
        self.outputs: list[Eagle3TargetBatch] = []
        self.calls: list[set[str]] = []

    def generate_batch(self, **inputs: Any) -> Eagle3TargetBatch:  # type: ignore[override]
        self.calls.append(set(inputs))
        batch = super().generate_batch(**inputs)
        self.outputs.append(batch)
        return batch


def prompt() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return next(prompt_batches(1, batch_size=2, seq_len=8, vocab_size=CONFIG.vocab_size))


def same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


class TestProducer:
    def test_produce_stores_the_targets_forward(self) -> None:
        target, store = RecordingTarget(), LocalFeatureStore()
        producer = FeatureProducer(target, store, run_id="r", target_model_version="t1", draft_weight_version="d2")
        input_ids, attention_mask, loss_mask = prompt()
        ref = producer.produce(input_ids=input_ids, attention_mask=attention_mask, loss_mask=loss_mask)
        assert ref.sample_id == "sample-r-0" and producer.produce(**dict(zip(
            ("input_ids", "attention_mask", "loss_mask"), prompt(), strict=True))).sample_id == "sample-r-1"
        assert ref.algorithm is FeatureAlgorithm.EAGLE3 and ref.schema_version == 1 and ref.run_id == "r"
        assert (ref.target_model_version, ref.draft_weight_version) == ("t1", "d2")
        assert ref.num_tokens == int(attention_mask.sum())
        assert ref.feature_names() == ["aux_hidden_states", "input_ids", "attention_mask", "loss_mask", "logits"]
        logits, aux = target(input_ids, attention_mask)
        got, _ = store.get(ref)
        assert torch.allclose(got["logits"], logits) and torch.allclose(got["aux_hidden_states"], aux)
        assert got["aux_hidden_states"].shape == (2, 8, 3 * CONFIG.hidden_size)
        assert target.calls[0] == {"input_ids", "attention_mask", "loss_mask"}, "no packing keywords unless given"

    def test_computed_outputs_are_handed_over_and_the_callers_inputs_copied(self) -> None:
        target, store = RecordingTarget(), LocalFeatureStore()
        producer = FeatureProducer(target, store, run_id="r")
        input_ids, attention_mask, loss_mask = prompt()
        ref = producer.produce(input_ids=input_ids, attention_mask=attention_mask, loss_mask=loss_mask)
        kept, _ = store.get(ref, copy=False)
        assert same_memory(kept["logits"], target.outputs[0].logits), "the fresh forward output is not copied"
        assert not same_memory(kept["input_ids"], input_ids), "the caller still owns its inputs"
        expected = input_ids.clone()
        input_ids.fill_(0)
        assert torch.equal(store.get(ref)[0]["input_ids"], expected)

    def test_packing_ids_factory_and_discard(self) -> None:
        target, store = RecordingTarget(), LocalFeatureStore()
        ids = iter(["a", "b"])
        producer = FeatureProducer(target, store, run_id="r", sample_id_factory=lambda: next(ids))
        input_ids, attention_mask, loss_mask = prompt()
        packing = {
            "position_ids": torch.arange(8).repeat(2, 1),
            "seq_lens": torch.tensor([8, 8]),
            "doc_remaining": torch.zeros(2, dtype=torch.long),
        }
        ref = producer.produce(input_ids=input_ids, attention_mask=attention_mask, loss_mask=loss_mask, **packing)
        assert ref.sample_id == "a" and set(packing) <= set(ref.feature_names())
        assert set(packing) <= target.calls[0]
        producer.discard(ref)
        assert store.health().sample_count == 0 and not store.is_resident("a")

    def test_bad_construction(self) -> None:
        with pytest.raises(TypeError, match=r"generate_batch"):
            FeatureProducer(object(), LocalFeatureStore(), run_id="r")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match=r"eagle3 schema only"):
            FeatureProducer(RecordingTarget(), LocalFeatureStore(), run_id="r", algorithm=FeatureAlgorithm.DFLASH)
        with pytest.raises(ValueError, match=r"run_id"):
            FeatureProducer(RecordingTarget(), LocalFeatureStore(), run_id="")


class CountingQueue(SampleRefQueue):
    """A queue that counts how often consumers call ``acquire``."""

    acquires = 0

    def acquire(self, poll_interval: float = 0.05, *, timeout: float | None = None) -> Any:
        self.acquires += 1
        return super().acquire(poll_interval, timeout=timeout)


class TestLoader:
    def test_batches_are_acked_and_released_on_the_next_pull(self) -> None:
        store = LocalFeatureStore()
        queue = SampleRefQueue(store)
        for i in range(3):
            queue.put(put_eagle3(store, i))
        queue.close()
        loader = FeatureDataLoader(queue, store)
        first = next(loader)
        assert isinstance(first, Eagle3TargetBatch) and torch.equal(first.logits, eagle3_sample(0)["logits"])
        assert queue.stats().acked == 0 and queue.outstanding_count() == 1, "valid through the training step"
        next(loader)
        assert queue.stats().acked == 1 and not store.is_resident("s0")
        loader.consume_now()
        assert queue.stats().acked == 2 and queue.outstanding_count() == 0
        assert [b.input_ids[0, 0].item() for b in loader] == [200]
        assert queue.stats().acked == 3 and store.health().sample_count == 0 and queue.lifecycle_state == "drained"

    def test_a_waiting_loader_wakes_on_put_without_polling(self) -> None:
        store = LocalFeatureStore()
        queue = CountingQueue(store)
        loader = FeatureDataLoader(queue, store, acquire_poll_interval=60.0)
        got: list[Eagle3TargetBatch] = []
        consumer = threading.Thread(target=lambda: got.append(next(loader)))
        consumer.start()
        queue.put(put_eagle3(store, 7))
        consumer.join(30)
        assert got and torch.equal(got[0].logits, eagle3_sample(7)["logits"])
        assert queue.acquires == 1, "one blocking acquire, woken by the put"

    def test_a_ref_of_another_algorithm_is_failed(self) -> None:
        store = LocalFeatureStore()
        queue = SampleRefQueue(store)
        dflash = {"hidden_states": torch.zeros(2), **{n: torch.zeros(2) for n in ("input_ids", "attention_mask")}}
        queue.put(store.put("d", {**dflash, "loss_mask": torch.zeros(2)}, algorithm=FeatureAlgorithm.DFLASH))
        with pytest.raises(ValueError, match=r"dflash.*failed"):
            next(FeatureDataLoader(queue, store))
        assert queue.stats().failed == 1 and queue.pending_count() == 1 and store.is_resident("d")

    def test_a_schema_invalid_ref_is_dropped(self) -> None:
        store = LocalFeatureStore()
        queue = SampleRefQueue(store)
        queue.put(store.put("bad", {n: t for n, t in eagle3_sample(0).items() if n != "logits"}))
        queue.put(put_eagle3(store, 1))
        loader = FeatureDataLoader(queue, store)
        with pytest.raises(ValueError, match=r"dropped"):
            next(loader)
        assert queue.stats().acked == 1 and not store.is_resident("bad")
        assert torch.equal(next(loader).logits, eagle3_sample(1)["logits"]), "the loader carries on"

    def test_a_store_error_fails_the_lease_and_is_reraised(self, monkeypatch: pytest.MonkeyPatch) -> None:
        store = LocalFeatureStore()
        queue = SampleRefQueue(store)
        queue.put(put_eagle3(store, 0))

        def broken_get(*args: object, **kwargs: object) -> None:
            raise OSError("device unplugged")

        monkeypatch.setattr(store, "get", broken_get)
        with pytest.raises(OSError, match=r"unplugged"):
            next(FeatureDataLoader(queue, store))
        assert queue.stats().failed == 1 and queue.pending_count() == 1 and store.is_resident("s0")

    def test_fail_current_redelivers_and_close_acks_and_closes(self) -> None:
        store = LocalFeatureStore()
        queue = SampleRefQueue(store)
        for i in range(2):
            queue.put(put_eagle3(store, i))
        with FeatureDataLoader(queue, store) as loader:
            next(loader)
            loader.fail_current()
            assert queue.stats().failed == 1 and loader.current_lease is None
            batch = next(loader)
            assert loader.current_lease is not None and loader.current_lease.ref.sample_id == "s1"
            assert torch.equal(batch.logits, eagle3_sample(1)["logits"])
        assert queue.is_closed and queue.stats().acked == 1 and queue.pending_count() == 1
        assert list(loader) == [], "a closed loader yields nothing"
        loader.close()

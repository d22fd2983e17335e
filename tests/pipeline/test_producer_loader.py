"""FeatureProducer and FeatureDataLoader against a real tiny target model and the built-in stores."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any

import pytest
import torch

from featurestream import (
    Eagle3TargetBatch,
    FeatureAlgorithm,
    FeatureDataLoader,
    FeatureProducer,
    FeatureSpec,
    FeatureStore,
    LocalFeatureStore,
    SampleRef,
    SampleRefQueue,
)
from featurestream.pipeline.alignment import shift_left
from featurestream.tools.models import TinyConfig, TinyTargetModel, prompt_batches
from support.helpers import eagle3_sample, put_eagle3, untrainable_eagle3_sample

CONFIG = TinyConfig(vocab_size=32, hidden_size=16, num_layers=3, num_heads=2, max_seq_len=16)


class RecordingTarget(TinyTargetModel):
    """The real tiny target, remembering what each forward returned and received."""

    def __init__(self) -> None:
        super().__init__(CONFIG, seed=0)
        self.outputs: list[Eagle3TargetBatch] = []
        self.calls: list[dict[str, bool]] = []

    def generate_batch(self, **inputs: Any) -> Eagle3TargetBatch:  # type: ignore[override]
        self.calls.append({name: value is not None for name, value in inputs.items()})
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
        second = producer.produce(**dict(zip(("input_ids", "attention_mask", "loss_mask"), prompt(), strict=True)))
        assert ref.sample_id == "sample-r-1" and second.sample_id == "sample-r-2"
        assert ref.algorithm is FeatureAlgorithm.EAGLE3 and ref.schema_version == 1 and ref.run_id == "r"
        assert (ref.target_model_version, ref.draft_weight_version) == ("t1", "d2")
        assert ref.num_tokens == int(loss_mask.sum()) < int(attention_mask.sum()), "supervised tokens only"
        assert ref.feature_names() == ("aux_hidden_states", "input_ids", "attention_mask", "loss_mask", "logits")
        logits, aux = target(input_ids, attention_mask)
        got, _ = store.get(ref)
        # The EAGLE-3 alignment: logits, input_ids and loss_mask shifted one position left; the rest as given.
        assert torch.allclose(got["logits"], shift_left(logits)) and torch.allclose(got["aux_hidden_states"], aux)
        assert torch.equal(got["input_ids"], shift_left(input_ids))
        assert torch.equal(got["loss_mask"], shift_left(loss_mask))
        assert torch.equal(got["attention_mask"], attention_mask)
        assert got["aux_hidden_states"].shape == (2, 8, 3 * CONFIG.hidden_size)
        assert target.calls[0] == {
            "input_ids": True, "attention_mask": True, "loss_mask": True,
            "position_ids": False, "seq_lens": False, "doc_remaining": False,
        }, "every keyword is passed, None when absent"  # fmt: skip

    def test_computed_outputs_are_handed_over_and_the_callers_inputs_copied(self) -> None:
        target, store = RecordingTarget(), LocalFeatureStore()
        producer = FeatureProducer(target, store, run_id="r")
        input_ids, attention_mask, loss_mask = prompt()
        ref = producer.produce(input_ids=input_ids, attention_mask=attention_mask, loss_mask=loss_mask)
        kept, _ = store.get(ref, copy=False)
        assert same_memory(kept["logits"], target.outputs[0].logits), "the fresh forward output is not copied"
        assert not same_memory(kept["attention_mask"], attention_mask), "the caller still owns its inputs"
        expected = attention_mask.clone()
        attention_mask.fill_(0)  # passed through unshifted, so the stored one would be the caller's without a copy
        assert torch.equal(store.get(ref)[0]["attention_mask"], expected)

    def test_packing_ids_factory_and_discard(self) -> None:
        target, store = RecordingTarget(), LocalFeatureStore()
        seen: list[int] = []
        producer = FeatureProducer(target, store, run_id="r", sample_id_factory=lambda n: seen.append(n) or "ab"[n - 1])
        input_ids, attention_mask, loss_mask = prompt()
        packing = {
            "position_ids": torch.arange(8).repeat(2, 1),
            "seq_lens": torch.tensor([[8], [8]]),
            "doc_remaining": torch.arange(7, -1, -1).repeat(2, 1),
        }
        ref = producer.produce(input_ids=input_ids, attention_mask=attention_mask, loss_mask=loss_mask, **packing)
        assert ref.sample_id == "a" and seen == [1] and set(packing) <= set(ref.feature_names())
        assert all(target.calls[0][name] for name in packing)
        producer.discard(ref)
        assert store.health().sample_count == 0 and not store.is_resident("a")

    def test_bad_construction(self) -> None:
        with pytest.raises(ValueError, match=r"cannot infer FeatureAlgorithm for target_backend of type object"):
            FeatureProducer(object(), LocalFeatureStore(), run_id="r")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match=r"generate_batch"):
            FeatureProducer(object(), LocalFeatureStore(), run_id="r", algorithm=FeatureAlgorithm.EAGLE3)  # type: ignore[arg-type]
        with pytest.raises(
            ValueError, match=r"no feature schema is registered for algorithm 'msd'.*register_algorithm"
        ):
            FeatureProducer(RecordingTarget(), LocalFeatureStore(), run_id="r", algorithm="msd")
        with pytest.raises(ValueError, match=r"run_id"):
            FeatureProducer(RecordingTarget(), LocalFeatureStore(), run_id="")

    def test_inputs_and_outputs_the_schema_refuses_store_nothing(self) -> None:
        target, store = RecordingTarget(), LocalFeatureStore()
        producer = FeatureProducer(target, store, run_id="r")
        input_ids, attention_mask, loss_mask = prompt()
        with pytest.raises(ValueError, match=r"position_ids, seq_lens, and doc_remaining together"):
            producer.produce(
                input_ids=input_ids, attention_mask=attention_mask, loss_mask=loss_mask, seq_lens=torch.tensor([8, 8])
            )
        assert target.calls == [], "partial packing is refused before the forward"

        class UnsupervisedTarget(RecordingTarget):
            def generate_batch(self, **inputs: Any) -> dict[str, torch.Tensor]:  # type: ignore[override]
                batch = super().generate_batch(**inputs)
                return {name: batch[name] for name in batch.keys() if name != "logits"}

        producer = FeatureProducer(UnsupervisedTarget(), store, run_id="r")
        with pytest.raises(ValueError, match=r"no supervision encoding: it needs 'logits' or the pair"):
            producer.produce(input_ids=input_ids, attention_mask=attention_mask, loss_mask=loss_mask)
        assert store.health().sample_count == 0

    def test_a_ref_that_misdescribes_the_tensors_is_evicted(self) -> None:
        class MisdescribingStore(LocalFeatureStore):
            def put(self, sample_id: str, tensors: Any, **kwargs: Any) -> SampleRef:
                ref = super().put(sample_id, tensors, **kwargs)
                specs = dict(ref.feature_specs)
                specs["logits"] = FeatureSpec((1,), torch.float16)
                return dataclasses.replace(ref, feature_specs=specs)

        store = MisdescribingStore()
        producer = FeatureProducer(RecordingTarget(), store, run_id="r")
        input_ids, attention_mask, loss_mask = prompt()
        with pytest.raises(RuntimeError, match=r"'sample-r-1'.*logits \(1,\)/torch.float16.*evicted"):
            producer.produce(input_ids=input_ids, attention_mask=attention_mask, loss_mask=loss_mask)
        assert store.health().sample_count == 0 and not store.is_resident("sample-r-1")

    def test_a_reference_contract_store_without_take_ownership_or_scrub_works(self) -> None:
        class ReferenceStore(FeatureStore):
            """A user store written against the reference contract: no take_ownership, no scrub."""

            def __init__(self) -> None:
                self.inner = LocalFeatureStore()
                self.store_uri = self.inner.store_uri
                self.put_keywords: list[set[str]] = []

            def put(self, sample_id: str, tensors: Any, **kwargs: Any) -> SampleRef:  # type: ignore[override]
                self.put_keywords.append(set(kwargs))
                return self.inner.put(sample_id, tensors, **kwargs)

            def get(self, ref: SampleRef, device: Any = None) -> Any:
                return self.inner.get(ref, device)

            def release(self, handle: Any) -> None:
                self.inner.release(handle)

            def gc(self) -> int:
                return self.inner.gc()

            def health(self) -> Any:
                return self.inner.health()

            def close(self) -> None:
                self.inner.close()

        store = ReferenceStore()
        producer = FeatureProducer(RecordingTarget(), store, run_id="r")
        input_ids, attention_mask, loss_mask = prompt()
        ref = producer.produce(input_ids=input_ids, attention_mask=attention_mask, loss_mask=loss_mask)
        assert "take_ownership" not in store.put_keywords[0]
        assert store.health().sample_count == 1
        producer.discard(ref)
        assert store.health().sample_count == 0, "discard falls back to get + release without a scrub hook"

    def test_algorithm_inference_forwarding_and_close(self) -> None:
        class DuckTarget:
            def generate_batch(self, **inputs: Any) -> Any:
                raise AssertionError("never called")

        with pytest.raises(ValueError, match=r"cannot infer FeatureAlgorithm for target_backend of type DuckTarget"):
            FeatureProducer(DuckTarget(), LocalFeatureStore(), run_id="r")
        producer = FeatureProducer(DuckTarget(), LocalFeatureStore(), run_id="r", algorithm=FeatureAlgorithm.EAGLE3)
        assert producer.algorithm is FeatureAlgorithm.EAGLE3
        target = RecordingTarget()
        producer = FeatureProducer(target, LocalFeatureStore(), run_id="r")
        assert producer.algorithm is FeatureAlgorithm.EAGLE3
        assert producer.get_input_embeddings() is target.get_input_embeddings()
        calls: list[tuple[torch.Tensor, torch.Tensor]] = []
        target.set_vocab_mapping = lambda ids, mask: calls.append((ids, mask))  # type: ignore[method-assign]
        ids, mask = torch.tensor([1, 2]), torch.ones(CONFIG.vocab_size, dtype=torch.bool)
        producer.set_vocab_mapping(ids, mask)
        assert calls == [(ids, mask)]
        producer.close()
        producer.close()
        with pytest.raises(RuntimeError, match=r"closed"):
            producer.produce(**dict(zip(("input_ids", "attention_mask", "loss_mask"), prompt(), strict=True)))


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
        loader = FeatureDataLoader(queue, store, prefetch=0)
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
        loader = FeatureDataLoader(queue, store, acquire_poll_interval=60.0, prefetch=0)
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
        with pytest.raises(ValueError, match=r"bound to algorithm=FeatureAlgorithm\.EAGLE3.*dflash.*failed"):
            next(FeatureDataLoader(queue, store, prefetch=0))
        assert queue.stats().failed == 1 and queue.pending_count() == 1 and store.is_resident("d")

    def test_a_schema_invalid_ref_is_dead_lettered(self) -> None:
        store = LocalFeatureStore()
        queue = SampleRefQueue(store)
        queue.put(store.put("bad", untrainable_eagle3_sample(0)))
        queue.put(put_eagle3(store, 1))
        loader = FeatureDataLoader(queue, store, prefetch=0)
        with pytest.raises(ValueError, match=r"dead-lettered \(reason schema"):
            next(loader)
        assert queue.stats().acked == 0 and queue.stats().dead_lettered == 1 and not store.is_resident("bad")
        assert torch.equal(next(loader).logits, eagle3_sample(1)["logits"]), "the loader carries on"

    def test_a_store_error_fails_the_lease_and_is_reraised(self, monkeypatch: pytest.MonkeyPatch) -> None:
        store = LocalFeatureStore()
        queue = SampleRefQueue(store)
        queue.put(put_eagle3(store, 0))

        def broken_get(*args: object, **kwargs: object) -> None:
            raise OSError("device unplugged")

        monkeypatch.setattr(store, "get", broken_get)
        with pytest.raises(OSError, match=r"unplugged"):
            next(FeatureDataLoader(queue, store, prefetch=0))
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

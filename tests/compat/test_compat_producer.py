"""compat.md, producer: signature, ids, algorithm inference, forwarding and produce's contract."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from typing import Any

import pytest
import torch

from featurestream.async_pipeline import AsyncFeaturePipeline
from featurestream.producer import FeatureProducer
from featurestream.queue import SampleRefQueue
from featurestream.refs import FeatureAlgorithm, FeatureSpec, SampleRef
from featurestream.stores.local import LocalFeatureStore

from .conftest import PREFIX
from .recipe import VOCAB, EchoTarget, packing, prompt


def test_signature() -> None:
    parameters = inspect.signature(FeatureProducer).parameters
    assert list(parameters) == [
        "target_backend", "store", "run_id", "algorithm", "target_model_version", "draft_weight_version",
        "sample_id_factory", "fp8",
    ]  # fmt: skip
    assert [p.kind for p in parameters.values()][:2] == [inspect.Parameter.POSITIONAL_OR_KEYWORD] * 2
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in list(parameters.values())[2:])
    defaults = {name: p.default for name, p in parameters.items() if p.default is not inspect.Parameter.empty}
    assert defaults == {
        "algorithm": None, "target_model_version": "0", "draft_weight_version": "0", "sample_id_factory": None,
        "fp8": False,
    }  # fmt: skip


def test_default_ids_start_at_one() -> None:
    producer = FeatureProducer(EchoTarget(), LocalFeatureStore(), run_id="run7")
    assert [producer.produce(**prompt(i)).sample_id for i in range(3)] == [
        "sample-run7-1", "sample-run7-2", "sample-run7-3",
    ]  # fmt: skip


def test_sample_id_factory_gets_the_one_based_sequence_number() -> None:
    seen: list[int] = []

    def factory(n: int) -> str:
        seen.append(n)
        return f"custom-{n}"

    producer = FeatureProducer(EchoTarget(), LocalFeatureStore(), run_id="r", sample_id_factory=factory)
    assert [producer.produce(**prompt(i)).sample_id for i in range(2)] == ["custom-1", "custom-2"]
    assert seen == [1, 2]


def test_an_eagle3_target_backend_is_inferred_as_eagle3() -> None:
    assert FeatureProducer(EchoTarget(), LocalFeatureStore(), run_id="r").algorithm is FeatureAlgorithm.EAGLE3


def test_a_backend_with_only_generate_batch_cannot_be_inferred() -> None:
    class DuckTarget:
        def generate_batch(self, **inputs: Any) -> Any:
            return EchoTarget().generate_batch(**inputs)

    with pytest.raises(ValueError, match="cannot infer FeatureAlgorithm"):
        FeatureProducer(DuckTarget(), LocalFeatureStore(), run_id="r")
    with pytest.raises(ValueError, match="cannot infer FeatureAlgorithm"):
        FeatureProducer(object(), LocalFeatureStore(), run_id="r")  # type: ignore[arg-type]
    overridden = FeatureProducer(DuckTarget(), LocalFeatureStore(), run_id="r", algorithm=FeatureAlgorithm.EAGLE3)
    assert overridden.produce(**prompt()).algorithm is FeatureAlgorithm.EAGLE3


@pytest.mark.parametrize("backend", [EchoTarget(), object()], ids=["eagle3-backend", "not-a-backend"])
def test_an_empty_run_id_is_reported_before_the_algorithm_is_inferred(backend: Any) -> None:
    with pytest.raises(ValueError, match=r"run_id must be a non-empty str, got ''"):
        FeatureProducer(backend, LocalFeatureStore(), run_id="")


def test_vocab_mapping_and_input_embeddings_forward_to_the_backend() -> None:
    target = EchoTarget()
    producer = FeatureProducer(target, LocalFeatureStore(), run_id="r")
    ids, mask = torch.tensor([0, 3]), torch.tensor([True, False, False, True, False, False, False, False])
    producer.set_vocab_mapping(ids, mask)
    assert target.vocab_mapping is not None and target.vocab_mapping[0] is ids and target.vocab_mapping[1] is mask
    assert producer.get_input_embeddings() is target.embedding


def test_close_exists() -> None:
    producer = FeatureProducer(EchoTarget(), LocalFeatureStore(), run_id="r")
    producer.close()
    producer.close()


@pytest.mark.parametrize("with_packing", [False, True])
def test_produce_passes_every_keyword_none_when_absent(with_packing: bool) -> None:
    target = EchoTarget()
    given = {**prompt(), **(packing() if with_packing else {})}
    FeatureProducer(target, LocalFeatureStore(), run_id="r").produce(**given)
    (call,) = target.calls
    assert set(call) == {"input_ids", "attention_mask", "loss_mask", "position_ids", "seq_lens", "doc_remaining"}
    for name, value in call.items():
        assert value is given[name] if name in given else value is None


def test_partial_packing_is_rejected_before_the_forward() -> None:
    target = EchoTarget()
    producer = FeatureProducer(target, LocalFeatureStore(), run_id="r")
    with pytest.raises(ValueError, match="position_ids, seq_lens, and doc_remaining together"):
        producer.produce(**prompt(), position_ids=packing()["position_ids"])
    assert target.calls == []


class UnsupervisedTarget(EchoTarget):
    def generate_batch(self, **inputs: Any) -> dict[str, Any]:  # type: ignore[override]
        batch = super().generate_batch(**inputs)
        return {name: getattr(batch, name) for name in batch.keys() if name != "logits"}


def test_a_batch_without_supervision_is_refused() -> None:
    # The store would take it (as the reference's does); the producer refuses it first, naming what is missing.
    store = LocalFeatureStore()
    with pytest.raises(ValueError, match="no supervision encoding: it needs 'logits' or the pair"):
        FeatureProducer(UnsupervisedTarget(), store, run_id="r").produce(**prompt())
    assert store.health().sample_count == 0


def test_an_async_pipeline_stores_and_queues_nothing_of_a_batch_without_supervision() -> None:
    store = LocalFeatureStore()
    queue = SampleRefQueue(store)
    producer = FeatureProducer(UnsupervisedTarget(), store, run_id="r")
    source = iter([tuple(prompt().values())])
    pipeline = AsyncFeaturePipeline(producer, queue, source).start()
    pipeline.join(30)
    with pytest.raises(ValueError, match="no supervision encoding"):
        pipeline.stop()
    assert store.health().sample_count == 0 and queue.stats().put == 0 and queue.is_closed


def test_num_tokens_is_the_loss_mask_sum() -> None:
    given = prompt()
    ref = FeatureProducer(EchoTarget(), LocalFeatureStore(), run_id="r").produce(**given)
    assert ref.num_tokens == int(given["loss_mask"].sum()) == 4


def test_a_spec_mismatch_after_the_put_evicts_the_sample() -> None:
    class LyingStore(LocalFeatureStore):
        def put(self, sample_id: str, tensors: Any, **kwargs: Any) -> SampleRef:
            ref = super().put(sample_id, tensors, **kwargs)
            specs = {**ref.feature_specs, "logits": FeatureSpec((9,), torch.float64)}
            return dataclasses.replace(ref, feature_specs=specs)

    store = LyingStore()
    with pytest.raises(RuntimeError):
        FeatureProducer(EchoTarget(), store, run_id="r").produce(**prompt())
    assert store.health().sample_count == 0 and not store.is_resident("sample-r-1")


# -- the reference's DFlash and DSpark wrappers, unchanged -------------------------------------------------------


def reference_wrapper(reference: Any, algorithm: FeatureAlgorithm) -> Any:
    """The reference's ``HFDFlashTargetModel`` / ``HFDSparkTargetModel`` over a tiny random Llama (no download)."""
    pytest.importorskip("transformers", reason="the reference's HF wrappers need transformers")
    from featurestream.tools.models import TinyConfig, tiny_hf_causal_lm

    model = tiny_hf_causal_lm("llama", TinyConfig(vocab_size=VOCAB, hidden_size=32, num_heads=4), num_layers=4)
    if algorithm is FeatureAlgorithm.DFLASH:
        return importlib.import_module(f"{PREFIX}.dflash.target").HFDFlashTargetModel(model, [1, 3])
    return importlib.import_module(f"{PREFIX}.dspark.target").HFDSparkTargetModel(model, [-1, 2])


@pytest.mark.parametrize("algorithm", [FeatureAlgorithm.DFLASH, FeatureAlgorithm.DSPARK])
def test_the_references_dflash_and_dspark_wrappers_are_inferred_and_stream_bit_for_bit(
    reference: Any, algorithm: FeatureAlgorithm
) -> None:
    from featurestream.loader import FeatureDataLoader
    from featurestream.queue import SampleRefQueue

    wrapper = reference_wrapper(reference, algorithm)
    store = LocalFeatureStore()
    queue = SampleRefQueue(store)
    producer = FeatureProducer(wrapper, store, run_id="r")
    # The reference's producer attributes, with its meaning: the backend, the store and the algorithm.
    assert producer._target is wrapper and producer._store is store and producer._algorithm is algorithm
    inputs = prompt(0)
    expected = wrapper.generate_batch(**inputs)
    queue.put(producer.produce(**inputs))
    queue.close()
    with FeatureDataLoader(queue, store, algorithm=algorithm, prefetch=0) as loader:
        (batch,) = list(loader)
    assert isinstance(batch, type(expected)), "the reference's batch class, since its module is imported"
    for field in dataclasses.fields(expected):
        mine, theirs = getattr(batch, field.name), getattr(expected, field.name)
        assert (mine is None) == (theirs is None) and (mine is None or torch.equal(mine, theirs)), field.name


def test_an_explicit_algorithm_contradicting_the_references_wrapper_is_refused_naming_both(reference: Any) -> None:
    store = LocalFeatureStore()
    producer = FeatureProducer(
        reference_wrapper(reference, FeatureAlgorithm.DSPARK), store, run_id="r", algorithm=FeatureAlgorithm.DFLASH
    )
    with pytest.raises(
        ValueError, match=r"stores 'dflash' samples \(algorithm=.*returned a DSparkTargetBatch, a 'dspark'"
    ):
        producer.produce(**prompt(0))
    assert store.health().sample_count == 0


def test_a_store_misdescribing_the_tensors_is_reported_in_the_references_phrase() -> None:
    class Misdescribing(LocalFeatureStore):
        def put(self, sample_id: str, tensors: Any, **kwargs: Any) -> SampleRef:
            ref = super().put(sample_id, tensors, **kwargs)
            specs = {**ref.feature_specs, "logits": FeatureSpec((1,), torch.float16)}
            return dataclasses.replace(ref, feature_specs=specs)

    store = Misdescribing()
    with pytest.raises(RuntimeError, match=r"feature_specs does not match"):
        FeatureProducer(EchoTarget(), store, run_id="r").produce(**prompt(0))
    assert store.health().sample_count == 0

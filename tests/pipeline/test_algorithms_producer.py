"""FeatureProducer over DFlash, DSpark and EAGLE-1/2 backends: the algorithm inferred from the backend's base class
or from the batch class generate_batch is annotated to return, an explicit algorithm= contradicting the output
refused naming both, and an output lacking a required feature refused naming it, before anything is stored."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from featurestream import (
    DFlashTargetBatch,
    DSparkTargetBackend,
    DSparkTargetBatch,
    FeatureAlgorithm,
    FeatureProducer,
    LocalFeatureStore,
)
from support.algorithm_samples import dflash_sample, dspark_sample


def prompt(tokens: int = 4) -> dict[str, torch.Tensor]:
    return {
        "input_ids": torch.zeros((1, tokens), dtype=torch.int64),
        "attention_mask": torch.ones((1, tokens), dtype=torch.int64),
        "loss_mask": torch.ones((1, tokens), dtype=torch.int64),
    }


class AnnotatedDFlash:
    """Subclasses no backend base, as the reference's HFDFlashTargetModel: only its annotation says DFlash."""

    def generate_batch(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor, **packing: Any
    ) -> DFlashTargetBatch:
        return DFlashTargetBatch(**dflash_sample(0))


class Returns:
    """An unannotated backend returning what it was given."""

    def __init__(self, output: object) -> None:
        self.output = output

    def generate_batch(self, **inputs: Any) -> Any:
        return self.output


def test_the_algorithm_is_inferred_from_generate_batchs_annotated_batch_class() -> None:
    store = LocalFeatureStore()
    producer = FeatureProducer(AnnotatedDFlash(), store, run_id="r")
    assert producer.algorithm is FeatureAlgorithm.DFLASH and producer._algorithm is FeatureAlgorithm.DFLASH
    ref = producer.produce(**prompt())
    assert ref.algorithm is FeatureAlgorithm.DFLASH and list(ref.feature_keys) == list(dflash_sample(0))
    with pytest.raises(ValueError, match=r"cannot infer FeatureAlgorithm.*not annotated to return"):
        FeatureProducer(Returns(None), store, run_id="r")


def test_the_references_attribute_names_read_what_the_producer_holds() -> None:
    store, backend = LocalFeatureStore(), AnnotatedDFlash()
    producer = FeatureProducer(backend, store, run_id="r")
    assert producer._target is backend and producer.target_backend is backend
    assert producer._store is store and producer.store is store


@pytest.mark.parametrize("explicit", [True, False], ids=["algorithm=", "inferred"])
def test_an_output_of_another_algorithm_is_refused_naming_both_and_nothing_is_stored(explicit: bool) -> None:
    store = LocalFeatureStore()
    dspark_output = DSparkTargetBatch(**dspark_sample(0))
    if explicit:
        producer = FeatureProducer(Returns(dspark_output), store, run_id="r", algorithm="dflash")
    else:

        class Backend(DSparkTargetBackend):
            def generate_batch(self, **inputs: Any) -> Any:
                return DFlashTargetBatch(**dflash_sample(0))

        producer = FeatureProducer(Backend(), store, run_id="r")
    ours, theirs = ("dflash", "dspark") if explicit else ("dspark", "dflash")
    with pytest.raises(
        ValueError, match=rf"next sample: FeatureProducer stores '{ours}' samples .* a '{theirs}' batch; nothing"
    ):
        producer.produce(**prompt())
    assert store.health().sample_count == 0


@pytest.mark.parametrize("missing", ["hidden_states", "loss_mask"])
def test_an_output_lacking_a_required_feature_is_refused_naming_it_before_anything_is_stored(missing: str) -> None:
    store = LocalFeatureStore()
    output = {name: tensor for name, tensor in dflash_sample(0).items() if name != missing}
    producer = FeatureProducer(Returns(output), store, run_id="r", algorithm=FeatureAlgorithm.DFLASH)
    with pytest.raises(
        ValueError, match=rf"sample 'p-1': dflash sample is missing required features \['{missing}'\]; nothing"
    ):
        producer.produce(**prompt(), sample_id="p-1")
    assert store.health().sample_count == 0


def test_an_output_breaking_a_dtype_rule_is_refused_naming_sample_feature_expected_and_got() -> None:
    store = LocalFeatureStore()
    output = {**dflash_sample(0), "hidden_states": torch.zeros((1, 4, 12), dtype=torch.int32)}
    producer = FeatureProducer(Returns(output), store, run_id="r", algorithm="dflash")
    with pytest.raises(
        ValueError,
        match=r"run 'r''s next sample: .*'hidden_states' expected dtype \[B, S, \*\] of floating, got torch.int32",
    ):
        producer.produce(**prompt())
    assert store.health().sample_count == 0

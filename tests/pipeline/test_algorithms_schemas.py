"""DFlash, DSpark and EAGLE-1/2 schemas: registered, their batches checked, streamed producer -> queue -> loader,
and a sample whose dtype or shape breaks its algorithm's rules refused at put and at get, naming what broke."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import torch

from featurestream import (
    DFlashTargetBackend,
    DFlashTargetBatch,
    DSparkTargetBackend,
    DSparkTargetBatch,
    EagleTargetBackend,
    EagleTargetBatch,
    FeatureAlgorithm,
    FeatureDataLoader,
    FeatureProducer,
    LocalFeatureStore,
    SampleRefQueue,
)
from featurestream.common.refs import REQUIRED_FEATURES
from featurestream.pipeline import schemas
from support.algorithm_samples import dflash_sample, packing, sample_of

BUILTINS = {
    FeatureAlgorithm.DFLASH: (DFlashTargetBatch, DFlashTargetBackend),
    FeatureAlgorithm.DSPARK: (DSparkTargetBatch, DSparkTargetBackend),
    FeatureAlgorithm.EAGLE: (EagleTargetBatch, EagleTargetBackend),
}
ALGORITHMS = list(BUILTINS)


def backend_of(algorithm: FeatureAlgorithm, outputs: list[dict[str, torch.Tensor]]) -> Any:
    """A backend of ``algorithm``'s base class returning ``outputs`` in turn (as that algorithm's batch)."""
    batch_type, base = BUILTINS[algorithm]

    class Backend(base):  # type: ignore[misc,valid-type]
        def generate_batch(self, **inputs: torch.Tensor | None) -> object:
            return batch_type.from_tensors(outputs.pop(0))

    return Backend()


def prompt(tokens: int = 4) -> dict[str, torch.Tensor]:
    return {
        "input_ids": torch.zeros((1, tokens), dtype=torch.int64),
        "attention_mask": torch.ones((1, tokens), dtype=torch.int64),
        "loss_mask": torch.ones((1, tokens), dtype=torch.int64),
    }


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_each_builtin_algorithm_has_a_schema_with_the_control_planes_core_set(algorithm: FeatureAlgorithm) -> None:
    batch_type, backend_type = BUILTINS[algorithm]
    schema = schemas.schema_for(algorithm.value)
    assert schema.algorithm is algorithm and schema.batch_type is batch_type and schema.backend_type is backend_type
    assert schema.required_features == REQUIRED_FEATURES[algorithm]
    assert set(schema.optional_features) >= {"position_ids", "seq_lens", "doc_remaining"}


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_sample_streams_producer_to_loader_unchanged(algorithm: FeatureAlgorithm, packed: bool) -> None:
    samples = [{**sample_of(algorithm, index), **(packing() if packed else {})} for index in range(2)]
    store = LocalFeatureStore()
    queue = SampleRefQueue(store)
    producer = FeatureProducer(backend_of(algorithm, [dict(s) for s in samples]), store, run_id="r")
    assert producer.algorithm is algorithm, "inferred from the backend's base class"
    for _ in samples:
        queue.put(producer.produce(**prompt()))
    queue.close()
    with FeatureDataLoader(queue, store, algorithm=algorithm, prefetch=0) as loader:
        batches = list(loader)
    batch_type = BUILTINS[algorithm][0]
    # Once the reference's module is imported in this process (an earlier compat test may have), the loader
    # yields the reference's class, a subclass of ours.
    assert len(batches) == 2 and all(isinstance(batch, batch_type) for batch in batches)
    for batch, expected in zip(batches, samples, strict=True):
        assert list(batch.tensors()) == [name for name in batch_type.FEATURES.order if name in expected]
        assert all(torch.equal(batch[name], tensor) for name, tensor in expected.items())
        assert pickle.loads(pickle.dumps(batch)).tensors().keys() == batch.tensors().keys()
    assert queue.stats().acked == 2 and store.health().sample_count == 0


def test_trainer_inputs_are_each_trainers_keywords() -> None:
    jetspec = DFlashTargetBatch(**dflash_sample(0, logits=True), **packing())
    # The DFlash trainers build their own block mask, and JetSpec takes the logits as target_logits.
    assert list(jetspec.to_trainer_inputs()) == [
        "hidden_states", "input_ids", "loss_mask", "target_logits", "position_ids", "seq_lens", "doc_remaining",
    ]  # fmt: skip
    dspark = DSparkTargetBatch(**sample_of(FeatureAlgorithm.DSPARK, 0))
    assert list(dspark.to_trainer_inputs()) == list(REQUIRED_FEATURES[FeatureAlgorithm.DSPARK])
    eagle = EagleTargetBatch(**sample_of(FeatureAlgorithm.EAGLE, 0))
    assert list(eagle.to_trainer_inputs()) == list(REQUIRED_FEATURES[FeatureAlgorithm.EAGLE])


@pytest.mark.parametrize(
    ("change", "match"),
    [
        (
            {"hidden_states": torch.zeros((1, 4, 12), dtype=torch.int64)},
            r"dflash feature 'hidden_states' expected dtype \[B, S, \*\] of floating, got torch.int64",
        ),
        (
            {"input_ids": torch.zeros((1, 4), dtype=torch.float32)},
            r"dflash feature 'input_ids' expected dtype \[B, S\] of integer, got torch.float32",
        ),
        (
            {"loss_mask": torch.ones((1, 5), dtype=torch.int64)},
            r"dflash feature 'loss_mask' expected shape \[B, S\] .* with S=4 \(as in 'hidden_states'\), got \[1, 5\]",
        ),
        ({"hidden_states": torch.zeros((1, 4))}, r"'hidden_states' expected shape \[B, S, \*\] .*, got \[1, 4\]"),
        ({"seq_lens": torch.tensor([[2, 2]])}, r"'seq_lens' needs \['position_ids', 'doc_remaining'\]"),
        ({"medusa_heads": torch.zeros(1)}, r"dflash has no features \['medusa_heads'\]"),
    ],
)
def test_a_batch_breaking_its_rules_is_refused_by_name(change: dict[str, torch.Tensor], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        DFlashTargetBatch.from_tensors({**dflash_sample(0), **change})


def test_a_ref_breaking_its_rules_is_refused_at_get_naming_sample_feature_expected_and_got() -> None:
    store = LocalFeatureStore()
    queue = SampleRefQueue(store)
    bad = {**dflash_sample(0), "input_ids": torch.zeros((1, 4), dtype=torch.float16)}
    queue.put(store.put("bad", bad, run_id="r", algorithm=FeatureAlgorithm.DFLASH))
    queue.put(store.put("good", dflash_sample(1), run_id="r", algorithm=FeatureAlgorithm.DFLASH))
    queue.close()
    with FeatureDataLoader(queue, store, algorithm="dflash", prefetch=0) as loader:
        with pytest.raises(
            ValueError,
            match=r"sample 'bad': dflash feature 'input_ids' expected dtype \[B, S\] of integer, got torch.float16",
        ):
            next(loader)
        assert torch.equal(next(loader).hidden_states, dflash_sample(1)["hidden_states"])
    assert store.health().sample_count == 0

"""EAGLE-3's per-feature dtype and shape rules: a sample breaking one is refused at put (by the producer, before
anything is stored) and at get (by the loader, before the store is read), with an error naming the sample, the
feature, what was expected and what came; the shapes the reference's trainer takes stream through."""

from __future__ import annotations

import re
from typing import Any

import pytest
import torch

from featurestream import (
    Eagle3TargetBackend,
    Eagle3TargetBatch,
    FeatureAlgorithm,
    FeatureDataLoader,
    FeatureProducer,
    LocalFeatureStore,
    SampleRef,
    SampleRefQueue,
    StoreHandle,
)
from featurestream.pipeline.features import TargetInputs
from support.algorithm_samples import packing
from support.helpers import eagle3_sample

TOKENS = 4
MASKS = "bool/integer/floating"


def logits_sample(index: int) -> dict[str, torch.Tensor]:
    return eagle3_sample(index, TOKENS)


def probs_sample(index: int) -> dict[str, torch.Tensor]:
    """The draft-vocab encoding, as the reference's remote server ships it: ``position_mask [B, S, 1]`` bool."""
    tensors = eagle3_sample(index, TOKENS)
    logits = tensors.pop("logits")
    tensors["target_probs"] = logits.softmax(-1)
    tensors["position_mask"] = torch.ones((1, TOKENS, 1), dtype=torch.bool)
    return tensors


def packed_sample(index: int) -> dict[str, torch.Tensor]:
    return {**logits_sample(index), **packing(TOKENS)}


# (feature, the sample it breaks, its bad tensor, the error after "sample '...': "): for every feature a wrong
# dtype and a wrong rank, plus sizes that contradict a fixed or a shared dimension.
CASES: list[tuple[str, Any, torch.Tensor, str]] = [
    ("aux_hidden_states", logits_sample, torch.zeros(1, 4, 6, dtype=torch.int64),
     "eagle3 feature 'aux_hidden_states' expected dtype [B, S, *] of floating, got torch.int64 (shape [1, 4, 6])"),
    ("aux_hidden_states", logits_sample, torch.zeros(1, 4),
     "eagle3 feature 'aux_hidden_states' expected shape [B, S, *] of floating, got [1, 4]"),
    ("input_ids", logits_sample, torch.zeros(1, 4),
     "eagle3 feature 'input_ids' expected dtype [B, S] of integer, got torch.float32 (shape [1, 4])"),
    ("input_ids", logits_sample, torch.zeros(1, 4, 1, dtype=torch.int64),
     "eagle3 feature 'input_ids' expected shape [B, S] of integer, got [1, 4, 1]"),
    ("attention_mask", logits_sample, torch.ones(1, 4, dtype=torch.complex64),
     f"eagle3 feature 'attention_mask' expected dtype [B, S] of {MASKS}, got torch.complex64 (shape [1, 4])"),
    ("attention_mask", logits_sample, torch.ones(4, dtype=torch.int64),
     f"eagle3 feature 'attention_mask' expected shape [B, S] of {MASKS}, got [4]"),
    ("loss_mask", logits_sample, torch.ones(1, 4, dtype=torch.complex64),
     f"eagle3 feature 'loss_mask' expected dtype [B, S] of {MASKS}, got torch.complex64 (shape [1, 4])"),
    ("loss_mask", logits_sample, torch.ones(1, 4, 2, dtype=torch.int64),
     f"eagle3 feature 'loss_mask' expected shape [B, S] of {MASKS}, got [1, 4, 2]"),
    ("loss_mask", logits_sample, torch.ones(1, 5, dtype=torch.int64),
     f"eagle3 feature 'loss_mask' expected shape [B, S] of {MASKS} with S=4 (as in 'aux_hidden_states'), "
     "got [1, 5]"),
    ("logits", logits_sample, torch.zeros(1, 4, 8, dtype=torch.int32),
     "eagle3 feature 'logits' expected dtype [B, S, *] of floating, got torch.int32 (shape [1, 4, 8])"),
    ("logits", logits_sample, torch.zeros(1, 4),
     "eagle3 feature 'logits' expected shape [B, S, *] of floating, got [1, 4]"),
    ("logits", logits_sample, torch.zeros(2, 4, 8),
     "eagle3 feature 'logits' expected shape [B, S, *] of floating with B=1 (as in 'aux_hidden_states'), "
     "got [2, 4, 8]"),
    ("target_probs", probs_sample, torch.zeros(1, 4, 8, dtype=torch.int64),
     "eagle3 feature 'target_probs' expected dtype [B, S, *] of floating, got torch.int64 (shape [1, 4, 8])"),
    ("target_probs", probs_sample, torch.zeros(1, 4 * 8),
     "eagle3 feature 'target_probs' expected shape [B, S, *] of floating, got [1, 32]"),
    ("position_mask", probs_sample, torch.ones(1, 4, 1, dtype=torch.complex64),
     f"eagle3 feature 'position_mask' expected dtype [B, S, 1] of {MASKS}, got torch.complex64 (shape [1, 4, 1])"),
    ("position_mask", probs_sample, torch.ones(1, 4, 1, 1, dtype=torch.bool),
     f"eagle3 feature 'position_mask' expected shape [B, S, 1] of {MASKS}, got [1, 4, 1, 1]"),
    ("position_mask", probs_sample, torch.ones(1, 4, 2, dtype=torch.bool),
     f"eagle3 feature 'position_mask' expected shape [B, S, 1] of {MASKS}, got [1, 4, 2] (dimension 2 must be 1)"),
    ("position_ids", packed_sample, torch.zeros(1, 4),
     "eagle3 feature 'position_ids' expected dtype [B, S] of integer, got torch.float32 (shape [1, 4])"),
    ("position_ids", packed_sample, torch.zeros(4, dtype=torch.int64),
     "eagle3 feature 'position_ids' expected shape [B, S] of integer, got [4]"),
    ("seq_lens", packed_sample, torch.tensor([[2.0, 2.0]]),
     "eagle3 feature 'seq_lens' expected dtype [B, *] of integer, got torch.float32 (shape [1, 2])"),
    ("seq_lens", packed_sample, torch.tensor([4]),
     "eagle3 feature 'seq_lens' expected shape [B, *] of integer, got [1]"),
    ("doc_remaining", packed_sample, torch.ones(1, 4, dtype=torch.bool),
     "eagle3 feature 'doc_remaining' expected dtype [B, S] of integer/floating, got torch.bool (shape [1, 4])"),
    ("doc_remaining", packed_sample, torch.ones(1, 4, 1, dtype=torch.int64),
     "eagle3 feature 'doc_remaining' expected shape [B, S] of integer/floating, got [1, 4, 1]"),
]  # fmt: skip
CASE_IDS = [f"{feature}-{index}" for index, (feature, *_) in enumerate(CASES)]


def broken(case: tuple[str, Any, torch.Tensor, str]) -> dict[str, torch.Tensor]:
    feature, make, tensor, _ = case
    return {**make(0), feature: tensor}


class Returning(Eagle3TargetBackend):
    """A target whose batches are the given feature dicts, in turn (as ``Eagle3TargetBatch``)."""

    def __init__(self, outputs: list[dict[str, torch.Tensor]]) -> None:
        self.outputs = outputs

    def target_batch(self, inputs: TargetInputs) -> Eagle3TargetBatch:
        return Eagle3TargetBatch.from_tensors(self.outputs.pop(0))


class ReadLog(LocalFeatureStore):
    """A local store recording which samples were read (materialised)."""

    def __init__(self) -> None:
        super().__init__()
        self.read: list[str] = []

    def get(
        self, ref: SampleRef, device: torch.device | str | None = None, *, copy: bool = True
    ) -> tuple[dict[str, torch.Tensor], StoreHandle]:
        self.read.append(ref.sample_id)
        return super().get(ref, device, copy=copy)


def prompt() -> dict[str, torch.Tensor]:
    return {name: logits_sample(0)[name] for name in ("input_ids", "attention_mask", "loss_mask")}


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_a_feature_breaking_its_rule_is_refused_at_put_and_nothing_is_stored(
    case: tuple[str, Any, torch.Tensor, str],
) -> None:
    store = LocalFeatureStore()
    store.put("resident", logits_sample(1), run_id="r")
    before = store.health()
    producer = FeatureProducer(Returning([broken(case)]), store, run_id="r")
    with pytest.raises(ValueError, match=re.escape(f"sample 's-bad': {case[3]}") + r"; nothing was stored$"):
        producer.produce(**prompt(), sample_id="s-bad")
    assert store.health() == before


@pytest.mark.parametrize("case", CASES, ids=CASE_IDS)
def test_a_ref_breaking_its_rule_is_refused_at_get_before_the_store_is_read(
    case: tuple[str, Any, torch.Tensor, str],
) -> None:
    store = ReadLog()
    queue = SampleRefQueue(store)
    # Put past the producer, as a foreign or older writer could: only the loader's check stands in the way.
    queue.put(store.put("bad", broken(case), run_id="r", algorithm=FeatureAlgorithm.EAGLE3))
    queue.put(store.put("good", logits_sample(1), run_id="r", algorithm=FeatureAlgorithm.EAGLE3))
    queue.close()
    with FeatureDataLoader(queue, store, prefetch=0) as loader:
        with pytest.raises(ValueError, match=re.escape(f"sample 'bad': {case[3]}")) as refused:
            next(loader)
        assert torch.equal(next(loader).aux_hidden_states, logits_sample(1)["aux_hidden_states"])
    # The loader's contract for a schema-invalid ref: dead-lettered (reason schema), never trained nor acked.
    assert "dead-lettered (reason schema, never trained)" in str(refused.value)
    assert store.read == ["good"], "the bad sample was never materialised"
    stats = queue.stats()
    assert (stats.acked, stats.dead_lettered, queue.outstanding_count(), queue.pending_count()) == (1, 1, 0, 0)
    [letter] = queue.dead_letters()
    assert letter.reason == f"schema: sample 'bad': {case[3]}"
    assert store.health().sample_count == 0


@pytest.mark.parametrize(
    "sample",
    [
        logits_sample(0),
        probs_sample(0),
        {**probs_sample(0), "position_mask": torch.ones(1, TOKENS, dtype=torch.int64)},  # squeezed [B, S]
        {**packed_sample(0), "doc_remaining": packing(TOKENS)["doc_remaining"].float()},
        {**packed_sample(0), "aux_hidden_states": torch.zeros(1, TOKENS, 6, dtype=torch.bfloat16)},
    ],
    ids=["logits", "draft-vocab", "squeezed-position-mask", "float-doc-remaining", "bf16-hidden"],
)
def test_samples_within_the_rules_stream_through_unchanged(sample: dict[str, torch.Tensor]) -> None:
    store = LocalFeatureStore()
    queue = SampleRefQueue(store)
    queue.put(FeatureProducer(Returning([dict(sample)]), store, run_id="r").produce(**prompt(), sample_id="s"))
    queue.close()
    with FeatureDataLoader(queue, store, prefetch=0) as loader:
        (batch,) = list(loader)
    assert batch.keys() == list(sample)
    assert all(
        torch.equal(batch[name], tensor) and batch[name].dtype == tensor.dtype for name, tensor in sample.items()
    )
    assert queue.stats().acked == 1

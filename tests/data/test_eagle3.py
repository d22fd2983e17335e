"""The EAGLE-3 v1 schema and Eagle3TargetBatch."""

from __future__ import annotations

import pytest
import torch

from featurestream import Eagle3TargetBatch, FeatureAlgorithm, LocalFeatureStore
from featurestream.pipeline.eagle3 import check_feature_names, feature_tensors, validate_ref

from .helpers import eagle3_sample

CORE = ["aux_hidden_states", "input_ids", "attention_mask", "loss_mask"]
PACKING = ["position_ids", "seq_lens", "doc_remaining"]


@pytest.mark.parametrize(
    "names",
    [
        [*CORE, "logits"],
        [*CORE, "target_probs", "position_mask"],
        [*CORE, "logits", *PACKING],
    ],
)
def test_valid_feature_sets(names: list[str]) -> None:
    check_feature_names(names)


@pytest.mark.parametrize(
    ("names", "match"),
    [
        (CORE, "no supervision encoding"),
        ([*CORE, "logits", "target_probs", "position_mask"], "both 'logits' and draft-vocab features"),
        ([*CORE, "target_probs"], "partial draft-vocab encoding"),
        ([*CORE, "logits", "position_mask"], "partial draft-vocab encoding"),
        ([*CORE, "logits", "position_ids"], "position_ids, seq_lens, and doc_remaining together"),
        ([*CORE[1:], "logits"], "missing required core features"),
        ([*CORE, "logits", "extra"], "no features"),
    ],
)
def test_invalid_feature_sets(names: list[str], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        check_feature_names(names)


def test_validate_ref_checks_algorithm_version_and_names() -> None:
    store = LocalFeatureStore()
    validate_ref(store.put("ok", eagle3_sample(0)))
    with pytest.raises(ValueError, match=r"'v2': eagle3 schema_version must be 1, got 2"):
        validate_ref(store.put("v2", eagle3_sample(0), schema_version=2))
    with pytest.raises(ValueError, match=r"'nologits'.*no supervision encoding"):
        validate_ref(store.put("nologits", {n: t for n, t in eagle3_sample(0).items() if n != "logits"}))
    dflash = {"hidden_states": torch.zeros(1), **{n: torch.zeros(1) for n in CORE[1:]}}
    with pytest.raises(ValueError, match=r"must be FeatureAlgorithm.EAGLE3 \(got <FeatureAlgorithm.DFLASH"):
        validate_ref(store.put("d", dflash, algorithm=FeatureAlgorithm.DFLASH))


def test_batch_reads_by_attribute_and_by_name_in_schema_order() -> None:
    tensors = eagle3_sample(1)
    batch = Eagle3TargetBatch.from_tensors(dict(reversed(tensors.items())))
    assert batch.logits is tensors["logits"] and batch["input_ids"] is tensors["input_ids"]
    assert list(batch) == [*CORE, "logits"] and "logits" in batch and "target_probs" not in batch
    with pytest.raises(KeyError):
        batch["target_probs"]
    with pytest.raises(ValueError, match=r"no supervision encoding"):
        Eagle3TargetBatch(**{n: tensors[n] for n in CORE})
    with pytest.raises(TypeError, match=r"must be a torch.Tensor"):
        feature_tensors({**tensors, "logits": [1.0]})

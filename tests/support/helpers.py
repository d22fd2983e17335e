"""EAGLE-3 samples with supervision, for the data-plane tests."""

from __future__ import annotations

import torch

from featurestream import FeatureStore, SampleRef
from featurestream.testing import sample_tensors


def eagle3_sample(index: int, tokens: int = 4, vocab: int = 8) -> dict[str, torch.Tensor]:
    """``sample_tensors(index)`` plus ``logits`` whose values identify the sample."""
    tensors = sample_tensors(index, tokens)
    tensors["logits"] = torch.full((1, tokens, vocab), float(index)) + torch.arange(vocab, dtype=torch.float32)
    return tensors


def untrainable_eagle3_sample(index: int) -> dict[str, torch.Tensor]:
    """``eagle3_sample(index)`` plus the draft-vocab pair: supervised (so ``put`` admits it) but by two encodings,
    which the schema refuses when a consumer loads it."""
    tensors = eagle3_sample(index)
    tensors["target_probs"] = tensors["logits"].softmax(-1)
    tensors["position_mask"] = tensors["loss_mask"].bool()
    return tensors


def put_eagle3(store: FeatureStore, index: int, **kwargs: object) -> SampleRef:
    return store.put(f"s{index}", eagle3_sample(index), run_id="run", **kwargs)  # type: ignore[arg-type]


def assert_is_sample(tensors: dict[str, torch.Tensor], index: int) -> None:
    expected = eagle3_sample(index)
    assert list(tensors) == list(expected)
    for name, tensor in expected.items():
        assert torch.equal(tensors[name], tensor), name

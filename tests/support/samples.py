"""Small EAGLE-3 samples (logits-supervised) for core tests."""

from __future__ import annotations

import torch

from featurestream import FeatureStore, SampleRef


def eagle3_tensors(tokens: int = 4, hidden: int = 8, seed: int = 0) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "aux_hidden_states": torch.randn(1, tokens, 3 * hidden, generator=generator),
        "input_ids": torch.randint(0, 100, (1, tokens), generator=generator),
        "attention_mask": torch.ones(1, tokens, dtype=torch.long),
        "loss_mask": torch.ones(1, tokens, dtype=torch.long),
        "logits": torch.randn(1, tokens, 16, generator=generator),
    }


def put_sample(store: FeatureStore, sample_id: str, **kwargs: object) -> SampleRef:
    return store.put(sample_id, eagle3_tensors(), run_id="run", **kwargs)  # type: ignore[arg-type]

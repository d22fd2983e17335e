"""Small deterministic EAGLE3 feature tensors for the stateful tests."""

from __future__ import annotations

import torch

__all__ = ["sample_tensors"]


def sample_tensors(index: int) -> dict[str, torch.Tensor]:
    """Tensors of sample ``index``: ``index + 1`` tokens, so every sample has a different byte size.

    The values depend on ``index`` so a store that hands back the wrong
    sample's bytes is caught by a content comparison.
    """
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"sample index must be an int >= 0, got {index!r}")
    tokens = index + 1
    ids = torch.arange(tokens, dtype=torch.int64).reshape(1, tokens) + 100 * index
    return {
        "aux_hidden_states": torch.full((1, tokens, 4), float(index), dtype=torch.float32),
        "input_ids": ids,
        "attention_mask": torch.ones((1, tokens), dtype=torch.int64),
        "loss_mask": torch.ones((1, tokens), dtype=torch.int64),
    }

"""Small deterministic EAGLE3 feature tensors for the stateful tests."""

from __future__ import annotations

import torch

__all__ = ["sample_tensors"]


def sample_tensors(index: int, tokens: int | None = None) -> dict[str, torch.Tensor]:
    """Tensors of sample ``index``: ``tokens`` tokens (default ``index + 1``: every sample a different size).

    Each token costs 40 bytes: float32 ``aux_hidden_states`` and ``logits`` (the supervision every EAGLE-3
    sample must carry), each of width 2, plus three int64 columns.

    The values depend on ``index`` so a store that hands back the wrong
    sample's bytes is caught by a content comparison.
    """
    if isinstance(index, bool) or not isinstance(index, int) or index < 0:
        raise ValueError(f"sample index must be an int >= 0, got {index!r}")
    if tokens is None:
        tokens = index + 1
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1:
        raise ValueError(f"tokens must be an int >= 1, got {tokens!r}")
    ids = torch.arange(tokens, dtype=torch.int64).reshape(1, tokens) + 100 * index
    return {
        "aux_hidden_states": torch.full((1, tokens, 2), float(index), dtype=torch.float32),
        "input_ids": ids,
        "attention_mask": torch.ones((1, tokens), dtype=torch.int64),
        "loss_mask": torch.ones((1, tokens), dtype=torch.int64),
        "logits": torch.full((1, tokens, 2), -float(index), dtype=torch.float32),
    }

"""Deterministic samples of every built-in algorithm (DFlash, DSpark, EAGLE-1/2, EAGLE-3), for tests that are
about the stream rather than one algorithm: values identify the sample, so a mix-up is caught by comparison."""

from __future__ import annotations

import torch

from featurestream import FeatureAlgorithm

from .helpers import eagle3_sample

HIDDEN = 4


def _hidden(index: int, tokens: int, width: int, sign: float = 1.0) -> torch.Tensor:
    return sign * (torch.full((1, tokens, width), float(index)) + torch.arange(width, dtype=torch.float32))


def _tokens(index: int, tokens: int) -> torch.Tensor:
    return torch.arange(tokens, dtype=torch.int64).reshape(1, tokens) + 100 * index


def _mask(tokens: int) -> torch.Tensor:
    return torch.ones((1, tokens), dtype=torch.int64)


def dflash_sample(index: int, tokens: int = 4, *, logits: bool = False) -> dict[str, torch.Tensor]:
    """A DFlash sample: three captured layers of width ``HIDDEN``; JetSpec's ``logits`` when asked."""
    tensors = {
        "hidden_states": _hidden(index, tokens, 3 * HIDDEN),
        "input_ids": _tokens(index, tokens),
        "attention_mask": _mask(tokens),
        "loss_mask": _mask(tokens),
    }
    if logits:
        tensors["logits"] = _hidden(index, tokens, 8, sign=-1.0)
    return tensors


def dspark_sample(index: int, tokens: int = 4) -> dict[str, torch.Tensor]:
    """A DSpark sample: two captured layers and the final norm's output."""
    return {
        "target_hidden_states": _hidden(index, tokens, 2 * HIDDEN),
        "target_last_hidden_states": _hidden(index, tokens, HIDDEN, sign=-1.0),
        "input_ids": _tokens(index, tokens),
        "loss_mask": _mask(tokens),
    }


def eagle_sample(index: int, tokens: int = 4) -> dict[str, torch.Tensor]:
    """An EAGLE-1/2 sample."""
    return {
        "input_hidden_states": _hidden(index, tokens, HIDDEN),
        "target_hidden_states": _hidden(index, tokens, HIDDEN, sign=-1.0),
        "target_logits": _hidden(index, tokens, 8, sign=0.5),
        "input_ids": _tokens(index, tokens),
        "attention_mask": _mask(tokens),
        "loss_mask": _mask(tokens),
    }


def packing(tokens: int = 4) -> dict[str, torch.Tensor]:
    """Packing metadata of one row holding two documents."""
    first = tokens // 2
    return {
        "position_ids": torch.cat([torch.arange(first), torch.arange(tokens - first)]).reshape(1, tokens),
        "seq_lens": torch.tensor([[first, tokens - first]]),
        "doc_remaining": torch.cat([torch.arange(first - 1, -1, -1), torch.arange(tokens - first - 1, -1, -1)]).reshape(
            1, tokens
        ),
    }


SAMPLES = {
    FeatureAlgorithm.EAGLE3: lambda index, tokens=4: eagle3_sample(index, tokens),
    FeatureAlgorithm.DFLASH: dflash_sample,
    FeatureAlgorithm.DSPARK: dspark_sample,
    FeatureAlgorithm.EAGLE: eagle_sample,
}


def sample_of(algorithm: FeatureAlgorithm, index: int, tokens: int = 4) -> dict[str, torch.Tensor]:
    """Sample ``index`` of ``algorithm``."""
    return SAMPLES[algorithm](index, tokens)

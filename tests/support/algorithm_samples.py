"""Deterministic samples of every built-in algorithm (DFlash, DSpark, EAGLE-1/2, EAGLE-3), for tests that are
about the stream rather than one algorithm: values identify the sample, so a mix-up is caught by comparison."""

from __future__ import annotations

import torch

from featurestream import FeatureAlgorithm
from support.helpers import eagle3_sample

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


# Per-token width of each float feature a KeyTarget returns (every other feature is one of its inputs).
_WIDTHS = {
    "aux_hidden_states": 3 * HIDDEN, "logits": 8, "hidden_states": 2 * HIDDEN, "target_hidden_states": 2 * HIDDEN,
    "target_last_hidden_states": HIDDEN, "input_hidden_states": HIDDEN, "target_logits": 8,
}  # fmt: skip
_OUTPUTS = {
    FeatureAlgorithm.EAGLE3: ("aux_hidden_states", "input_ids", "attention_mask", "loss_mask", "logits"),
    FeatureAlgorithm.DFLASH: ("hidden_states", "input_ids", "attention_mask", "loss_mask"),
    FeatureAlgorithm.DSPARK: ("target_hidden_states", "target_last_hidden_states", "input_ids", "loss_mask"),
}


class KeyTarget:
    """A deterministic target of ``algorithm`` (no model): its float features are the prompt's token ids,
    broadcast, so a batch's bytes say which prompt it came from. Needs ``FeatureProducer(..., algorithm=)``."""

    def __init__(self, algorithm: FeatureAlgorithm) -> None:
        self.outputs = _OUTPUTS[algorithm]

    def generate_batch(self, **inputs: torch.Tensor | None) -> dict[str, torch.Tensor]:
        ids = inputs["input_ids"]
        assert ids is not None
        out = {}
        for name in self.outputs:
            given = inputs.get(name)
            if given is not None:
                out[name] = given.clone()
            else:
                out[name] = ids.to(torch.float32).unsqueeze(-1).expand(*ids.shape, _WIDTHS[name]).clone()
        return out

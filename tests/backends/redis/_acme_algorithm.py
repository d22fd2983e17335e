"""A user's own algorithm, registered from outside featurestream as a user's package would (imported, not collected).

``acme.msd``: a draft hidden state per token, the token ids and loss mask, and optional multi-head logits. Every
process that produces or consumes its samples imports this module.
"""

from __future__ import annotations

import dataclasses

import torch

from featurestream import register_algorithm
from featurestream.pipeline.features import MASK_DTYPES, FeatureBatch, FeatureRule, FeatureSet, TargetBackendBase

NAME = "acme.msd"


@dataclasses.dataclass
class AcmeBatch(FeatureBatch):
    FEATURES = FeatureSet(
        NAME,
        (
            FeatureRule("draft_hidden", ("floating",), ("B", "S", "*")),
            FeatureRule("input_ids", ("integer",), ("B", "S")),
            FeatureRule("loss_mask", MASK_DTYPES, ("B", "S")),
            FeatureRule("head_logits", ("floating",), ("B", "S", 2, "*"), required=False),
        ),
    )

    draft_hidden: torch.Tensor
    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    head_logits: torch.Tensor | None = None


class AcmeBackend(TargetBackendBase):
    """The algorithm's backend base: a producer infers ``acme.msd`` from it."""


SCHEMA = register_algorithm(NAME, AcmeBatch, backend_type=AcmeBackend)


def acme_sample(index: int, tokens: int = 4) -> dict[str, torch.Tensor]:
    """Sample ``index``: values that identify it."""
    return {
        "draft_hidden": torch.full((1, tokens, 3), float(index)),
        "input_ids": torch.arange(tokens, dtype=torch.int64).reshape(1, tokens) + 100 * index,
        "loss_mask": torch.ones((1, tokens), dtype=torch.int64),
        "head_logits": torch.full((1, tokens, 2, 5), -float(index)),
    }


class CountingBackend(AcmeBackend):
    """Returns sample 1, 2, ... in turn."""

    def __init__(self) -> None:
        self.produced = 0

    def generate_batch(self, **inputs: torch.Tensor | None) -> AcmeBatch:  # type: ignore[override]
        self.produced += 1
        return AcmeBatch(**acme_sample(self.produced))

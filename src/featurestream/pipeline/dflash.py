"""The DFlash feature schema (version 1): the reference's ``DFlashTargetBatch``, streamed.

A sample carries ``hidden_states [B, S, len(target_layer_ids) * H]`` (the
captured decoder layers, concatenated along the feature dimension),
``input_ids``, ``attention_mask`` and ``loss_mask`` ``[B, S]``; optionally
the target's full-vocabulary ``logits [B, S, V]`` (JetSpec's distillation)
and the packing metadata. DFlash variants (DFlash 2, Domino, JetSpec) share
these features.

Token alignment (the reference's): nothing is shifted. Every feature keeps
the input's positions; the DFlash trainer's block mask aligns the anchors.
Importing this module registers ``DFLASH_SCHEMA``.
"""

from __future__ import annotations

import dataclasses
from types import MappingProxyType

import torch

from featurestream.common.refs import REQUIRED_FEATURES, FeatureAlgorithm
from featurestream.pipeline.features import (
    ATTENTION_MASK_RULE,
    INPUT_IDS_RULE,
    LOSS_MASK_RULE,
    PACKING_RULES,
    FeatureBatch,
    FeatureRule,
    FeatureSet,
    TargetBackendBase,
    declare_schema,
)

__all__ = ["DFLASH_CORE_FEATURES", "DFLASH_FEATURES", "DFLASH_SCHEMA", "DFlashTargetBackend", "DFlashTargetBatch"]

DFLASH_CORE_FEATURES = REQUIRED_FEATURES[FeatureAlgorithm.DFLASH]
DFLASH_FEATURES = FeatureSet(
    "dflash",
    (
        FeatureRule("hidden_states", ("floating",), ("B", "S", "*")),
        INPUT_IDS_RULE,
        ATTENTION_MASK_RULE,
        LOSS_MASK_RULE,
        FeatureRule("logits", ("floating",), ("B", "S", "*"), required=False),
        *PACKING_RULES,
    ),
)


@dataclasses.dataclass
class DFlashTargetBatch(FeatureBatch):
    """One materialised DFlash sample: the reference's fields, in its order, checked on construction.

    ``to_trainer_inputs()`` gives the DFlash trainer's forward keywords:
    ``attention_mask`` is left out (the trainer builds its own block mask) and
    ``logits`` is passed as ``target_logits`` (JetSpec's keyword).
    """

    FEATURES = DFLASH_FEATURES
    TRAINER_KEYWORDS = MappingProxyType({"logits": "target_logits"})
    TRAINER_SKIPS = frozenset({"attention_mask"})

    hidden_states: torch.Tensor
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    logits: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None
    seq_lens: torch.Tensor | None = None
    doc_remaining: torch.Tensor | None = None


class DFlashTargetBackend(TargetBackendBase[DFlashTargetBatch]):
    """A target that computes DFlash features; ``FeatureProducer`` infers DFlash from this base.

    ``generate_batch`` returns a ``DFlashTargetBatch`` (or any object or
    mapping with its fields) in the DFlash alignment: nothing shifted.
    """


DFLASH_SCHEMA = declare_schema(
    FeatureAlgorithm.DFLASH,
    DFlashTargetBatch,
    backend_type=DFlashTargetBackend,
    reference_batch_type="nemo_automodel.components.speculative.dflash.target.DFlashTargetBatch",
)

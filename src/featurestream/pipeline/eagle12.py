"""The EAGLE-1/2 feature schema (version 1): the reference's ``eagle.target_v12.EagleTargetBatch``, streamed.

A sample carries ``input_hidden_states [B, S, H]`` (the target's last
hidden states), ``target_hidden_states [B, S, H]``, ``target_logits
[B, S, V]``, ``input_ids``, ``attention_mask`` and ``loss_mask`` ``[B, S]``,
and optionally the packing metadata.

Token alignment (the reference's): ``target_hidden_states``,
``target_logits``, ``input_ids`` and ``loss_mask`` are shifted one position
left with the last position zero-filled, so position ``t`` carries what the
target saw or predicted at ``t + 1`` next to ``input_hidden_states[t]``;
``input_hidden_states``, ``attention_mask`` and the packing metadata keep
the input's positions. Importing this module registers ``EAGLE_SCHEMA``.
"""

from __future__ import annotations

import dataclasses

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

__all__ = ["EAGLE_CORE_FEATURES", "EAGLE_FEATURES", "EAGLE_SCHEMA", "EagleTargetBackend", "EagleTargetBatch"]

EAGLE_CORE_FEATURES = REQUIRED_FEATURES[FeatureAlgorithm.EAGLE]
EAGLE_FEATURES = FeatureSet(
    "eagle",
    (
        FeatureRule("input_hidden_states", ("floating",), ("B", "S", "H")),
        FeatureRule("target_hidden_states", ("floating",), ("B", "S", "H")),
        FeatureRule("target_logits", ("floating",), ("B", "S", "*")),
        INPUT_IDS_RULE,
        ATTENTION_MASK_RULE,
        LOSS_MASK_RULE,
        *PACKING_RULES,
    ),
)


@dataclasses.dataclass
class EagleTargetBatch(FeatureBatch):
    """One materialised EAGLE-1/2 sample: the reference's fields, in its order, checked on construction.

    ``to_trainer_inputs()`` gives the EAGLE-1/2 trainer's forward keywords (the feature names).
    """

    FEATURES = EAGLE_FEATURES

    input_hidden_states: torch.Tensor
    target_hidden_states: torch.Tensor
    target_logits: torch.Tensor
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    position_ids: torch.Tensor | None = None
    seq_lens: torch.Tensor | None = None
    doc_remaining: torch.Tensor | None = None


class EagleTargetBackend(TargetBackendBase[EagleTargetBatch]):
    """A target that computes EAGLE-1/2 supervision; ``FeatureProducer`` infers EAGLE-1/2 from this base.

    ``generate_batch`` returns an ``EagleTargetBatch`` (or any object or
    mapping with its fields) in the EAGLE-1/2 alignment (module docstring).
    """


EAGLE_SCHEMA = declare_schema(
    FeatureAlgorithm.EAGLE,
    EagleTargetBatch,
    backend_type=EagleTargetBackend,
    reference_batch_type="nemo_automodel.components.speculative.eagle.target_v12.EagleTargetBatch",
)

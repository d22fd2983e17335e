"""The DSpark feature schema (version 1): the reference's ``DSparkTargetBatch``, streamed.

A sample carries ``target_hidden_states [B, S, len(target_layer_ids) * H]``
(the captured layers, concatenated; layer id ``-1`` is the embedding
output), ``target_last_hidden_states [B, S, H]`` (the final norm's output),
``input_ids`` and ``loss_mask`` ``[B, S]``, and optionally the packing
metadata. There is no ``attention_mask``: the reference's batch has none.

Token alignment (the reference's): nothing is shifted. Importing this module
registers ``DSPARK_SCHEMA``.
"""

from __future__ import annotations

import dataclasses

import torch

from featurestream.common.refs import REQUIRED_FEATURES, FeatureAlgorithm
from featurestream.pipeline.features import (
    INPUT_IDS_RULE,
    LOSS_MASK_RULE,
    PACKING_RULES,
    FeatureBatch,
    FeatureRule,
    FeatureSet,
    TargetBackendBase,
    declare_schema,
)

__all__ = ["DSPARK_CORE_FEATURES", "DSPARK_FEATURES", "DSPARK_SCHEMA", "DSparkTargetBackend", "DSparkTargetBatch"]

DSPARK_CORE_FEATURES = REQUIRED_FEATURES[FeatureAlgorithm.DSPARK]
DSPARK_FEATURES = FeatureSet(
    "dspark",
    (
        FeatureRule("target_hidden_states", ("floating",), ("B", "S", "*")),
        FeatureRule("target_last_hidden_states", ("floating",), ("B", "S", "H")),
        INPUT_IDS_RULE,
        LOSS_MASK_RULE,
        *PACKING_RULES,
    ),
)


@dataclasses.dataclass
class DSparkTargetBatch(FeatureBatch):
    """One materialised DSpark sample: the reference's fields, in its order, checked on construction.

    ``to_trainer_inputs()`` gives the DSpark trainer's forward keywords (the feature names).
    """

    FEATURES = DSPARK_FEATURES

    target_hidden_states: torch.Tensor
    target_last_hidden_states: torch.Tensor
    input_ids: torch.Tensor
    loss_mask: torch.Tensor
    position_ids: torch.Tensor | None = None
    seq_lens: torch.Tensor | None = None
    doc_remaining: torch.Tensor | None = None


class DSparkTargetBackend(TargetBackendBase[DSparkTargetBatch]):
    """A target that computes DSpark features; ``FeatureProducer`` infers DSpark from this base.

    ``generate_batch`` returns a ``DSparkTargetBatch`` (or any object or
    mapping with its fields), nothing shifted.
    """


DSPARK_SCHEMA = declare_schema(
    FeatureAlgorithm.DSPARK,
    DSparkTargetBatch,
    backend_type=DSparkTargetBackend,
    reference_batch_type="nemo_automodel.components.speculative.dspark.target.DSparkTargetBatch",
)

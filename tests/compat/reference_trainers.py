"""The reference's DFlash trainer as its recipe builds it, for tests that train on featurestream's batches."""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import torch

from .conftest import PREFIX


def dflash_trainer_module(
    target: torch.nn.Module,
    *,
    layer_ids: Sequence[int],
    num_target_layers: int,
    mask_token_id: int,
    block_size: int,
    head: torch.nn.Module | None = None,
    embeddings: torch.nn.Module | None = None,
) -> Any:
    """The reference's ``DFlashTrainerModule`` over a one-layer Qwen3 DFlash draft of ``target`` (SDPA, 8 anchors),
    using ``head`` and ``embeddings`` (default: the target's own LM head and input embeddings)."""
    draft_qwen3 = importlib.import_module(f"{PREFIX}.dflash.draft_qwen3")
    core = importlib.import_module(f"{PREFIX}.dflash.core")
    config = draft_qwen3.build_qwen3_dflash_draft_config(
        target.config,
        num_draft_layers=1,
        num_target_layers=num_target_layers,
        block_size=block_size,
        dflash_config={"block_size": block_size, "mask_token_id": mask_token_id, "target_layer_ids": list(layer_ids)},
        attention_backend="sdpa",
    )
    return core.DFlashTrainerModule(
        draft_qwen3.Qwen3DFlashDraftModel(config),
        target.get_output_embeddings() if head is None else head,
        target.get_input_embeddings() if embeddings is None else embeddings,
        mask_token_id=mask_token_id,
        block_size=block_size,
        attention_backend="sdpa",
        num_anchors=8,
    )

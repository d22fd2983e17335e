"""A DSpark target backend for any Hugging Face causal LM (optional extra ``featurestream[hf]``).

``HFDSparkTargetModel(model, target_layer_ids)`` returns, per
``generate_batch``, a ``DSparkTargetBatch`` equal tensor for tensor to the
reference's ``HFDSparkTargetModel`` for the same model and inputs:

- ``target_hidden_states`` ``[B, T, len(target_layer_ids) * H]``: one state
  per id, concatenated in the order given, following Hugging Face's
  ``output_hidden_states`` offset-1 convention: ``-1`` is the embedding
  output, the last layer's entry is the final norm's output, any other ``i``
  is decoder layer ``i``'s output. A model that defines
  ``get_dspark_target_feature_modules(layer_ids)`` chooses its own capture
  points instead: the first positional input of each module it returns (a
  ``[B, T, streams, H]`` state is averaged over its streams);
- ``target_last_hidden_states`` ``[B, T, H]``: the final norm's output (what
  the LM head reads);
- ``input_ids``, ``loss_mask`` and the packing metadata, unshifted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from featurestream.pipeline.dspark import DSparkTargetBackend, DSparkTargetBatch
from featurestream.pipeline.features import TargetInputs
from featurestream.pipeline.hf_capture import HFCaptureModel, Tap, check_layer_ids, find_final_norm

__all__ = ["HFDSparkTargetModel"]

# The tap key of the final norm's output (decoder-layer taps are keyed by their int layer id).
_LAST_HIDDEN = "target_last_hidden_states"


class HFDSparkTargetModel(HFCaptureModel, DSparkTargetBackend):
    """DSpark target backend over a Hugging Face causal LM (see the module docstring for the batch it returns).

    ``target_layer_ids``: strictly increasing ids in ``-1 .. num_layers - 1``
    (``-1``: the embedding output); ``ValueError`` naming the offending id
    otherwise, or when the model's ``get_dspark_target_feature_modules``
    returns other than one module per id. ``cp_mesh``: ``None`` or a mesh of
    size 1 (``ValueError`` for a larger one).

    One no-grad eval forward per batch with forward hooks (never
    ``output_hidden_states=True``); forwards are serialised, so one wrapper
    may be shared by threads. ``FeatureProducer`` infers
    ``FeatureAlgorithm.DSPARK`` from it.
    """

    def __init__(self, model: nn.Module, target_layer_ids: Sequence[int], cp_mesh: Any = None) -> None:
        super().__init__(model, cp_mesh)
        self.target_layer_ids = check_layer_ids(
            target_layer_ids, self.num_layers, name="target_layer_ids", allow_embedding=True, increasing=True
        )
        self._final_norm = find_final_norm(model, self._layers)
        self._taps = (*self._feature_taps(), Tap(self._final_norm, key=_LAST_HIDDEN))

    def _feature_taps(self) -> list[Tap]:
        provider = getattr(self.model, "get_dspark_target_feature_modules", None)
        if callable(provider):
            modules = tuple(provider(list(self.target_layer_ids)))
            if len(modules) != len(self.target_layer_ids) or not all(isinstance(m, nn.Module) for m in modules):
                raise ValueError(
                    f"{type(self.model).__name__}.get_dspark_target_feature_modules({list(self.target_layer_ids)}) "
                    f"must return one nn.Module per layer id, got {[type(m).__name__ for m in modules]}"
                )
            return [
                Tap(module, key=layer, slot=slot, take_input=True)
                for slot, (layer, module) in enumerate(zip(self.target_layer_ids, modules, strict=True))
            ]
        last = self.num_layers - 1
        points = {-1: self.get_input_embeddings(), last: self._final_norm}
        return [
            Tap(points.get(layer, self._layers[layer]), key=layer, slot=slot)
            for slot, layer in enumerate(self.target_layer_ids)
        ]

    def get_output_embeddings(self) -> nn.Module:
        """The target's LM head (``ValueError`` when the model has none)."""
        return self._require_lm_head()

    def generate_batch(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        loss_mask: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        seq_lens: torch.Tensor | None = None,
        doc_remaining: torch.Tensor | None = None,
        **mm_kwargs: torch.Tensor,
    ) -> DSparkTargetBatch:
        """One no-grad forward over ``input_ids [B, T]``: the DSpark context states and the final hidden state.

        ``mm_kwargs``: further inputs of a multimodal target's forward, passed
        on when its forward takes them. ``ValueError`` for packing
        (``seq_lens`` given) without ``position_ids``, a model whose forward
        takes none, or a FlashAttention model given more than one row.
        """
        inputs = TargetInputs(
            input_ids, attention_mask, position_ids, seq_lens, loss_mask=loss_mask, doc_remaining=doc_remaining
        )
        captured = self.capture(inputs, self._taps, logits=False, extra=mm_kwargs)
        return inputs.batch(
            DSparkTargetBatch,
            target_hidden_states=captured.concatenated,
            target_last_hidden_states=captured.states[_LAST_HIDDEN],
        )

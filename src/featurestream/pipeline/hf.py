"""Target backends for any Hugging Face causal LM (optional extra ``featurestream[hf]``).

This module is ``featurestream.hf``: ``HFEagle3TargetModel`` (below),
``HFDFlashTargetModel`` (``pipeline/hf_dflash.py``), ``HFDSparkTargetModel``
(``pipeline/hf_dspark.py``) and ``HFEagleTargetModel`` (EAGLE-1/2,
``pipeline/hf_eagle12.py``), each under the reference's name and signature and
each returning, for the same model and inputs, the reference wrapper's tensors
bit for bit. All share the forward-hook capture of ``pipeline/hf_capture.py``.

``HFEagle3TargetModel(model)`` wraps an ``AutoModelForCausalLM``-style model
(Llama, Qwen2/3, Mistral, Gemma, ...) so that ``FeatureProducer`` can drive
it: each ``generate_batch`` call runs one no-grad forward in eval mode and
returns an ``Eagle3TargetBatch`` equal, tensor for tensor, to what the
reference's ``HFEagle3TargetModel.generate_batch`` returns for the same model
and inputs:

- ``aux_hidden_states`` ``[B, T, 3H]``: the outputs of the three auxiliary
  decoder layers, captured with forward hooks (never with
  ``output_hidden_states=True``, which would keep every layer's states
  alive), concatenated on the last axis in the order of ``aux_layer_ids``;
  not shifted;
- ``logits`` ``[B, T, V]``, ``input_ids`` and ``loss_mask``: shifted one
  position left, the last position zero (the EAGLE-3 token alignment, see
  ``featurestream.pipeline.eagle3``): position ``t`` carries the LM head's
  logits, the token id and the loss mask of position ``t + 1``;
- ``attention_mask`` and the packing metadata ``position_ids``, ``seq_lens``,
  ``doc_remaining``: passed through as given.

With packing (``seq_lens`` given) each packed document attends only to
itself: the model gets the per-document ``position_ids`` and a ``[B, 1, T,
T]`` block-causal additive mask built from ``seq_lens`` (``attention_mask``
is not fed to the model then), or, for a FlashAttention model, no mask at all
(batch size 1), FlashAttention finding the documents from ``position_ids``.

Recipe::

    from transformers import AutoModelForCausalLM
    from featurestream.pipeline.hf import HFEagle3TargetModel

    target = HFEagle3TargetModel(AutoModelForCausalLM.from_pretrained(name, dtype=torch.bfloat16, device_map="cuda"))
    producer = FeatureProducer(target, store, run_id="run-1")  # algorithm inferred: EAGLE3
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

try:
    import transformers
except ImportError as exc:
    raise ImportError(
        "featurestream.pipeline.hf needs Hugging Face transformers, which is not installed: "
        "pip install 'featurestream[hf]'"
    ) from exc

from featurestream.pipeline.eagle3 import Eagle3ForwardBackend, Eagle3TargetBatch, ForwardInputs, shift_left
from featurestream.pipeline.features import TargetInputs
from featurestream.pipeline.hf_capture import HFCaptureModel, Tap, check_layer_ids, find_decoder_layers
from featurestream.pipeline.hf_dflash import HFDFlashTargetModel
from featurestream.pipeline.hf_dspark import HFDSparkTargetModel
from featurestream.pipeline.hf_eagle12 import HFEagleTargetModel
from featurestream.pipeline.supervision import HiddenSupervised, hidden_supervised

__all__ = [
    "HFDFlashTargetModel",
    "HFDSparkTargetModel",
    "HFEagle3TargetModel",
    "HFEagleTargetModel",
    "default_aux_layer_ids",
    "find_decoder_layers",
]


def default_aux_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """The EAGLE-3 recipe's auxiliary layers ``(1, n//2 - 1, n - 4)`` for ``n`` decoder layers.

    ``ValueError`` (naming ``n``) when the model is too shallow for three
    distinct in-range layers, i.e. ``n < 7``.
    """
    ids = (1, num_layers // 2 - 1, num_layers - 4)
    if len(set(ids)) != 3 or min(ids) < 0 or max(ids) >= num_layers:
        raise ValueError(
            f"the default EAGLE-3 auxiliary layers [1, n//2 - 1, n - 4] = {list(ids)} are not three distinct "
            f"layers of a model with n={num_layers} decoder layers (the recipe needs n >= 7); "
            "pass aux_layer_ids=(low, mid, high) explicitly"
        )
    return ids


class HFEagle3TargetModel(HFCaptureModel, Eagle3ForwardBackend):
    """EAGLE-3 target backend over a Hugging Face causal LM (see the module docstring for the batch it returns).

    ``aux_layer_ids``: three distinct decoder-layer indices (low, mid, high),
    default the EAGLE-3 recipe ``[1, n//2 - 1, n - 4]``; ``ValueError`` for
    anything else. Each captured state is the layer's own output, also for
    the last layer (``n - 1``), where Hugging Face's ``hidden_states[n]`` is
    the final norm's output instead.

    ``cp_mesh``: the reference's context-parallel mesh argument; ``None`` or a
    mesh of size 1 (no sharding) is accepted, a larger one is ``ValueError``.

    ``supervision``: ``"logits"`` (the reference's batch) or ``"hidden"``:
    ``generate_batch`` returns a ``HiddenSupervised`` whose
    ``last_hidden_states [B, T, H]`` (the final norm's output, shifted
    left like the logits) stands in for the logits, with the model's
    ``TargetHead``; the base model runs instead of the causal LM, so no LM
    head does. ``ValueError`` for another value or a model whose logits are
    more than its head's output (``TargetHead.from_model``).

    Each forward runs under ``torch.no_grad()`` in eval mode (every
    submodule's train/eval flag is restored afterwards, also on error); its
    hooks are removed when it returns or raises. Forwards are serialised
    (hooks are per model), so one wrapper may be shared by threads.

    An ``Eagle3TargetBackend``: ``FeatureProducer(HFEagle3TargetModel(...),
    store, run_id=...)`` infers ``FeatureAlgorithm.EAGLE3``.
    """

    def __init__(
        self,
        model: nn.Module,
        aux_layer_ids: Sequence[int] | None = None,
        cp_mesh: Any = None,
        *,
        supervision: str = "logits",
    ) -> None:
        super().__init__(model, cp_mesh)
        self._require_lm_head()
        self.supervision = supervision
        self.target_head = self._supervision_head(supervision)
        self.aux_layer_ids: tuple[int, int, int] = (
            default_aux_layer_ids(self.num_layers)
            if aux_layer_ids is None
            else check_layer_ids(aux_layer_ids, self.num_layers, name="aux_layer_ids", count=3)  # type: ignore[assignment]
        )
        self.selected_token_ids: torch.Tensor | None = None
        self.selected_token_mask: torch.Tensor | None = None

    @property
    def config(self) -> transformers.PreTrainedConfig | None:
        """The wrapped model's config (``None`` for a model without one)."""
        return getattr(self.model, "config", None)

    @property
    def hidden_size(self) -> int:
        """Width ``H`` of one decoder layer's output (``aux_hidden_states`` is ``3H`` wide)."""
        return int(self.get_input_embeddings().weight.shape[1])

    @property
    def vocab_size(self) -> int:
        """Rows of the LM head: the last dimension of ``logits``."""
        return int(self.model.get_output_embeddings().weight.shape[0])

    def set_vocab_mapping(
        self, selected_token_ids: torch.Tensor | None, selected_token_mask: torch.Tensor | None
    ) -> None:
        """Record the draft vocabulary: the target token ids it keeps and the mask of them over the target vocab.

        The mapping is stored (``selected_token_ids``, ``selected_token_mask``)
        for the trainer side; it does not change ``generate_batch``, which
        keeps emitting the full target-vocabulary ``logits``, from which a
        draft-vocab trainer may select ``logits[..., selected_token_ids]``.
        To stream the draft-vocab supervision instead (``target_probs`` +
        ``position_mask``, which ``FeatureProducer`` stores as it stores
        ``logits``), wrap this model in ``featurestream.eagle3.DraftVocabTarget``:
        it projects each batch onto the map before anything is stored.
        ``None, None`` clears the mapping.
        """
        if selected_token_ids is None and selected_token_mask is None:
            self.selected_token_ids = self.selected_token_mask = None
            return
        for name, value in (("selected_token_ids", selected_token_ids), ("selected_token_mask", selected_token_mask)):
            if not isinstance(value, torch.Tensor):
                raise TypeError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
        assert selected_token_ids is not None and selected_token_mask is not None
        if selected_token_ids.is_floating_point() or selected_token_ids.dtype == torch.bool:
            raise ValueError(f"selected_token_ids must be an integer tensor, got {selected_token_ids.dtype}")
        if selected_token_ids.numel() and not (
            0 <= int(selected_token_ids.min()) and int(selected_token_ids.max()) < self.vocab_size
        ):
            raise ValueError(f"selected_token_ids must lie in [0, {self.vocab_size}) (the target vocabulary)")
        self.selected_token_ids = selected_token_ids
        self.selected_token_mask = selected_token_mask

    def forward_features(self, inputs: ForwardInputs) -> tuple[torch.Tensor, torch.Tensor]:
        """``(aux_hidden_states, logits)`` of one eval forward over ``inputs.input_ids [B, T]``: fresh tensors on
        the model's device, not shifted.

        Without ``seq_lens`` the model gets ``input_ids`` and
        ``attention_mask``; with it (packing), the per-document
        ``position_ids`` and the block-causal mask of ``seq_lens`` (see the
        module docstring). ``ValueError`` for packing without
        ``position_ids``, a model whose forward takes none, or a FlashAttention
        model given a batch of more than one row.
        """
        captured = self.capture(inputs, self._aux_taps(), logits=True)
        assert captured.concatenated is not None and captured.logits is not None
        return captured.concatenated, captured.logits

    def target_batch(self, inputs: TargetInputs) -> Eagle3TargetBatch | HiddenSupervised:  # type: ignore[override]
        """The EAGLE-3 batch of ``inputs`` (``Eagle3ForwardBackend``), or with ``supervision="hidden"`` its
        ``HiddenSupervised`` form: the base model's last hidden state shifted left in place of the logits."""
        if self.target_head is None:
            return super().target_batch(inputs)
        captured = self.capture(inputs, self._aux_taps(), logits=False, base=True)
        assert captured.concatenated is not None and captured.last_hidden is not None
        return hidden_supervised(
            inputs,
            self.target_head,
            aux_hidden_states=captured.concatenated,
            input_ids=shift_left(inputs.input_ids),
            loss_mask=shift_left(inputs.loss_mask),
            last_hidden_states=shift_left(captured.last_hidden),
        )

    def _aux_taps(self) -> list[Tap]:
        return [Tap(self._layers[layer], key=layer, slot=slot) for slot, layer in enumerate(self.aux_layer_ids)]

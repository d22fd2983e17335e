"""A DFlash target backend for any Hugging Face causal LM (optional extra ``featurestream[hf]``).

``HFDFlashTargetModel(model, target_layer_ids, capture_logits=False)``
returns, per ``generate_batch``, a ``DFlashTargetBatch`` equal tensor for
tensor to the reference's ``HFDFlashTargetModel`` for the same model and
inputs:

- ``hidden_states`` ``[B, T, len(target_layer_ids) * H]``: the output of each
  named decoder layer (Hugging Face's ``hidden_states[i + 1]``, the offset-1
  convention; for the last layer its own output, not the final norm's),
  concatenated in the order given; not shifted;
- ``logits`` ``[B, T, V]`` only with ``capture_logits=True`` (JetSpec's
  distillation), else ``None`` -- the LM head then runs on one position only;
- ``input_ids``, ``attention_mask``, ``loss_mask`` and the packing metadata
  ``position_ids``, ``seq_lens``, ``doc_remaining``: the inputs, unshifted
  (DFlash's block attention aligns anchors itself).

With ``capture_logits=True, supervision="hidden"`` the base model runs
instead of the causal LM (no LM head), and ``generate_batch`` returns a
``HiddenSupervised`` whose ``last_hidden_states [B, T, H]`` (the final norm's
output, unshifted) stands in for the logits, which the trainer's loader
rebuilds with the ``TargetHead``.

Packed inputs run block-causal per document, as for every wrapper here (see
``featurestream.pipeline.hf_capture``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch import nn

from featurestream.pipeline.dflash import DFlashTargetBackend, DFlashTargetBatch
from featurestream.pipeline.features import TargetInputs
from featurestream.pipeline.hf_capture import HFCaptureModel, Tap, check_layer_ids
from featurestream.pipeline.supervision import HiddenSupervised, hidden_supervised

__all__ = ["HFDFlashTargetModel"]


class HFDFlashTargetModel(HFCaptureModel, DFlashTargetBackend):
    """DFlash target backend over a Hugging Face causal LM (see the module docstring for the batch it returns).

    ``target_layer_ids``: one or more distinct decoder-layer indices in
    ``[0, num_layers)``, in the order their states are concatenated;
    ``ValueError`` naming the offending id otherwise. ``capture_logits``
    must be a bool; ``True`` needs a model with an LM head (``ValueError``).
    ``cp_mesh``: ``None`` or a mesh of size 1 (``ValueError`` for a larger one).
    ``supervision``: ``"logits"`` or ``"hidden"`` (module docstring), which
    needs ``capture_logits=True`` (``ValueError`` otherwise).

    One no-grad eval forward per batch with a forward hook per layer (never
    ``output_hidden_states=True``); forwards are serialised, so one wrapper
    may be shared by threads. ``FeatureProducer`` infers
    ``FeatureAlgorithm.DFLASH`` from it.
    """

    def __init__(
        self,
        model: nn.Module,
        target_layer_ids: Sequence[int],
        capture_logits: bool = False,
        cp_mesh: Any = None,
        *,
        supervision: str = "logits",
    ) -> None:
        super().__init__(model, cp_mesh)
        if not isinstance(capture_logits, bool):
            raise TypeError(f"capture_logits must be a bool, got {capture_logits!r}")
        self.target_layer_ids = check_layer_ids(target_layer_ids, self.num_layers, name="target_layer_ids")
        self.capture_logits = capture_logits
        if capture_logits:
            self._require_lm_head()
        elif supervision != "logits":
            raise ValueError(f"supervision={supervision!r} stands in for the logits: it needs capture_logits=True")
        self.supervision = supervision
        self.target_head = self._supervision_head(supervision)

    def target_batch(self, inputs: TargetInputs) -> DFlashTargetBatch | HiddenSupervised:  # type: ignore[override]
        """One no-grad forward over ``inputs.input_ids [B, T]`` (``generate_batch``'s arguments): the captured
        layers' states as DFlash context.

        ``ValueError`` for packing (``seq_lens`` given) without
        ``position_ids``, a model whose forward takes none, or a
        FlashAttention model given more than one row.
        """
        taps = [Tap(self._layers[layer], key=layer, slot=slot) for slot, layer in enumerate(self.target_layer_ids)]
        if self.target_head is not None:
            captured = self.capture(inputs, taps, logits=False, base=True)
            assert captured.concatenated is not None and captured.last_hidden is not None
            return hidden_supervised(
                inputs,
                self.target_head,
                hidden_states=captured.concatenated,
                last_hidden_states=captured.last_hidden,
            )
        captured = self.capture(inputs, taps, logits=self.capture_logits)
        return inputs.batch(DFlashTargetBatch, hidden_states=captured.concatenated, logits=captured.logits)

"""An EAGLE-1/2 target backend for any Hugging Face causal LM (optional extra ``featurestream[hf]``).

``HFEagleTargetModel(model)`` returns, per ``generate_batch``, an
``EagleTargetBatch`` equal tensor for tensor to the reference's
``eagle.target_v12.HFEagleTargetModel`` for the same model and inputs:

- ``input_hidden_states`` ``[B, T, H]``: the final norm's output (the base
  model's last hidden state), in the input's positions;
- ``target_hidden_states``, ``target_logits`` (the LM head applied to that
  state, ``[B, T, V]``), ``input_ids`` and ``loss_mask``: shifted one position
  left, the last position zero -- position ``t`` carries what position
  ``t + 1`` holds, the next-token supervision of the state at ``t``;
- ``attention_mask`` and the packing metadata: passed through, unshifted.

With ``supervision="hidden"`` no LM head runs: the base model's forward gives
the final state, and ``generate_batch`` returns a ``HiddenSupervised`` of the
same features but ``target_logits``, which the trainer's loader rebuilds from
``target_hidden_states`` with the ``TargetHead``.
"""

from __future__ import annotations

import torch
from torch import nn

from featurestream.pipeline.alignment import shift_left
from featurestream.pipeline.eagle12 import EagleTargetBackend, EagleTargetBatch
from featurestream.pipeline.features import TargetInputs
from featurestream.pipeline.hf_capture import HFCaptureModel, Tap, find_final_norm
from featurestream.pipeline.supervision import HiddenSupervised, hidden_supervised

__all__ = ["HFEagleTargetModel"]


class HFEagleTargetModel(HFCaptureModel, EagleTargetBackend):
    """EAGLE-1/2 target backend over a Hugging Face causal LM (see the module docstring for the batch it returns).

    ``model`` needs an LM head (``ValueError`` otherwise). One no-grad eval
    forward per batch; the final state is taken by a forward hook on the
    final norm, the full-sequence logits by the LM head applied to it (the
    model's own LM-head pass is cut to one position). Forwards are
    serialised, so one wrapper may be shared by threads. ``FeatureProducer``
    infers ``FeatureAlgorithm.EAGLE`` from it. ``supervision``: ``"logits"``
    or ``"hidden"`` (module docstring; ``ValueError`` for another value).
    """

    def __init__(self, model: nn.Module, *, supervision: str = "logits") -> None:
        super().__init__(model)
        self._lm_head = self._require_lm_head()
        self._taps = (Tap(find_final_norm(model, self._layers), key="final_norm"),)
        self.supervision = supervision
        self.target_head = self._supervision_head(supervision)

    def get_lm_head(self) -> nn.Module:
        """The target's LM head (a draft head may share it)."""
        return self._lm_head

    def target_batch(self, inputs: TargetInputs) -> EagleTargetBatch | HiddenSupervised:  # type: ignore[override]
        """One no-grad forward over ``inputs.input_ids [B, T]`` (``generate_batch``'s arguments): the final hidden
        states and their shifted supervision.

        ``ValueError`` for packing (``seq_lens`` given) without
        ``position_ids``, a model whose forward takes none, or a
        FlashAttention model given more than one row.
        """
        if self.target_head is not None:
            hidden = self.capture(inputs, (), logits=False, base=True).last_hidden
            assert hidden is not None
            return hidden_supervised(
                inputs,
                self.target_head,
                input_hidden_states=hidden,
                target_hidden_states=shift_left(hidden),
                input_ids=shift_left(inputs.input_ids),
                loss_mask=shift_left(inputs.loss_mask),
            )
        hidden = self.capture(inputs, self._taps, logits=False).states["final_norm"]
        with torch.no_grad():
            logits = self._lm_head(hidden)
        return inputs.batch(
            EagleTargetBatch,
            input_hidden_states=hidden,
            target_hidden_states=shift_left(hidden),
            target_logits=shift_left(logits),
            input_ids=shift_left(inputs.input_ids),
            loss_mask=shift_left(inputs.loss_mask),
        )

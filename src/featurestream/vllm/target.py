"""``VLLMDFlashTarget``: a DFlash target backend whose forward is a vLLM engine's capture."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import torch

from featurestream.pipeline.dflash import DFlashTargetBackend, DFlashTargetBatch
from featurestream.pipeline.features import TargetInputs
from featurestream.vllm.engine import EAGLE3_MISSING, VLLMFeatureEngine

__all__ = ["VLLMDFlashTarget"]


class VLLMDFlashTarget(DFlashTargetBackend):
    """The DFlash batch of ``engine`` (a ``"dflash"`` ``VLLMFeatureEngine``) for ``generate_batch``'s inputs, as
    ``HFDFlashTargetModel`` lays it out: ``hidden_states [B, T, len(target_layer_ids) * H]`` (zero at positions the
    attention mask leaves out), the inputs passed through unshifted, no logits.

    Each row is one request: its tokens are those ``attention_mask`` keeps, which must be a prefix of the row
    (right padding); ``ValueError`` otherwise, and for packed inputs (``seq_lens``), which the engine does not
    take. Thread-safe: the engine serialises its runs.
    """

    def __init__(self, engine: VLLMFeatureEngine) -> None:
        if engine.algorithm != "dflash":
            raise ValueError(f"VLLMDFlashTarget needs a 'dflash' engine, got {engine.algorithm!r}: {EAGLE3_MISSING}")
        self.engine = engine
        self.target_layer_ids = engine.layer_ids
        self._replay = threading.local()

    @contextlib.contextmanager
    def replaying(self, states: torch.Tensor) -> Iterator[None]:
        """Within the block, this thread's next ``generate_batch`` (of one row) takes ``states`` as its capture
        instead of running the engine: the engine's stream stores what it already captured."""
        self._replay.states = states
        try:
            yield
        finally:
            self._replay.states = None

    def target_batch(self, inputs: TargetInputs) -> DFlashTargetBatch:
        """One engine request per row, its states laid out as the Hugging Face wrapper's."""
        if inputs.seq_lens is not None:
            raise ValueError("VLLMDFlashTarget takes unpacked rows (one request each), got seq_lens")
        mask = inputs.attention_mask.bool()
        lengths = mask.sum(dim=1)
        for row, length in enumerate(lengths.tolist()):
            if not bool(mask[row, :length].all()):
                raise ValueError(
                    f"row {row}'s attention_mask {inputs.attention_mask[row].tolist()} is not a prefix of ones "
                    "(right padding); each row is one vLLM request"
                )
        replayed = getattr(self._replay, "states", None)
        if replayed is not None:
            self._replay.states = None
            captured = [replayed]
        else:
            rows = [inputs.input_ids[row, :length].tolist() for row, length in enumerate(lengths.tolist())]
            captured = self.engine.capture(rows)
        if len(captured) != len(lengths):
            raise RuntimeError(f"the engine captured {len(captured)} of {len(lengths)} rows")
        batch, width = inputs.input_ids.shape
        hidden = captured[0].new_zeros((batch, width, captured[0].shape[-1]))
        for row, states in enumerate(captured):
            hidden[row, : states.shape[0]] = states
        return inputs.batch(DFlashTargetBatch, hidden_states=hidden, logits=None)

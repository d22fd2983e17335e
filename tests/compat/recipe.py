"""What a recipe written against the reference brings along: a tiny EAGLE-3 target, its sample tensors, its batch class.

Everything here imports the reference's module paths (``featurestream.eagle3``
for ``streaming.eagle3`` and so on), as a recipe switched by its imports would.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from featurestream.eagle3 import Eagle3TargetBackend, Eagle3TargetBatch

HIDDEN, VOCAB, TOKENS = 4, 8, 6


def prompt(seed: int = 0) -> dict[str, torch.Tensor]:
    """``produce`` keywords: ``input_ids``, ``attention_mask``, ``loss_mask`` (first two tokens unsupervised)."""
    input_ids = torch.randint(0, VOCAB, (1, TOKENS), generator=torch.Generator().manual_seed(seed))
    loss_mask = torch.ones(1, TOKENS, dtype=torch.long)
    loss_mask[:, :2] = 0
    return {"input_ids": input_ids, "attention_mask": torch.ones(1, TOKENS, dtype=torch.long), "loss_mask": loss_mask}


def packing(tokens: int = TOKENS) -> dict[str, torch.Tensor]:
    """The packing metadata of one row holding one document, in the reference's shapes."""
    return {
        "position_ids": torch.arange(tokens)[None],
        "seq_lens": torch.tensor([[tokens]]),
        "doc_remaining": torch.arange(tokens - 1, -1, -1)[None],
    }


@dataclasses.dataclass
class RecipeBatch:
    """A recipe's own Eagle3TargetBatch, shaped like the reference's: no from_tensors, its own to_trainer_inputs.

    The field list mirrors the reference's on purpose: a loader given ``batch_type=RecipeBatch`` builds it by keyword.
    """

    aux_hidden_states: torch.Tensor
    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    loss_mask: torch.Tensor
    logits: torch.Tensor | None = None
    target_probs: torch.Tensor | None = None
    position_mask: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None
    seq_lens: torch.Tensor | None = None
    doc_remaining: torch.Tensor | None = None

    def to_trainer_inputs(self) -> dict[str, Any]:
        return {"hidden_states": self.aux_hidden_states, "input_ids": self.input_ids}


class EchoTarget(Eagle3TargetBackend):
    """A deterministic EAGLE-3 target: features are functions of the token ids; it records every call."""

    def __init__(self) -> None:
        self.embedding = torch.nn.Embedding(VOCAB, HIDDEN)
        self.calls: list[dict[str, torch.Tensor | None]] = []
        self.vocab_mapping: tuple[torch.Tensor, torch.Tensor] | None = None

    def generate_batch(
        self,
        *,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        loss_mask: torch.Tensor,
        position_ids: torch.Tensor | None = None,
        seq_lens: torch.Tensor | None = None,
        doc_remaining: torch.Tensor | None = None,
    ) -> Eagle3TargetBatch:
        self.calls.append(
            {
                "input_ids": input_ids,
                "attention_mask": attention_mask,
                "loss_mask": loss_mask,
                "position_ids": position_ids,
                "seq_lens": seq_lens,
                "doc_remaining": doc_remaining,
            }
        )
        hidden = self.embedding(input_ids)
        return Eagle3TargetBatch(
            aux_hidden_states=torch.cat([hidden, 2 * hidden, 3 * hidden], dim=-1),
            input_ids=input_ids,
            attention_mask=attention_mask,
            loss_mask=loss_mask,
            logits=hidden @ self.embedding.weight.T,
            position_ids=position_ids,
            seq_lens=seq_lens,
            doc_remaining=doc_remaining,
        )

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.embedding

    def set_vocab_mapping(self, selected_token_ids: torch.Tensor, selected_token_mask: torch.Tensor) -> None:
        self.vocab_mapping = (selected_token_ids, selected_token_mask)


def sample_tensors(index: int = 0, *, encoding: str = "logits") -> dict[str, torch.Tensor]:
    """An EAGLE-3 sample's tensors, supervised by ``logits`` or by the draft-vocab pair."""
    generator = torch.Generator().manual_seed(index)
    tensors = {
        "aux_hidden_states": torch.randn(1, TOKENS, 3 * HIDDEN, generator=generator),
        "input_ids": torch.randint(0, VOCAB, (1, TOKENS), generator=generator),
        "attention_mask": torch.ones(1, TOKENS, dtype=torch.long),
        "loss_mask": torch.ones(1, TOKENS, dtype=torch.long),
    }
    if encoding == "logits":
        tensors["logits"] = torch.randn(1, TOKENS, VOCAB, generator=generator)
    else:
        tensors["target_probs"] = torch.rand(1, TOKENS, VOCAB, generator=generator)
        tensors["position_mask"] = torch.ones(1, TOKENS, dtype=torch.long)
    return tensors

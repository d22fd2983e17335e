"""Tensor helpers the target backends share: the EAGLE token alignment's left shift and packed rows' attention."""

from __future__ import annotations

import torch

__all__ = ["packed_attention_allowed", "shift_left"]


def shift_left(tensor: torch.Tensor) -> torch.Tensor:
    """``tensor [B, T, ...]`` moved one position left along ``T``, the last position zero: a new tensor."""
    shifted = torch.zeros_like(tensor)
    shifted[:, :-1] = tensor[:, 1:]
    return shifted


def packed_attention_allowed(seq_lens: torch.Tensor, length: int) -> torch.Tensor:
    """``[B, T, T]`` bool: which key ``k`` query ``q`` of a packed row may attend to (causal, same document).

    ``seq_lens [B, D]`` holds each row's document lengths, zero-padded; each
    row must sum to ``length`` (trailing padding belongs to the last document),
    else ``ValueError`` naming the sums.
    """
    if seq_lens.dim() != 2:
        raise ValueError(f"seq_lens must be [batch, documents], got shape {tuple(seq_lens.shape)}")
    sums = seq_lens.sum(dim=1)
    if bool((sums != length).any()):
        raise ValueError(f"each row of seq_lens must sum to the sequence length {length}, got {sums.tolist()}")
    positions = torch.arange(length, device=seq_lens.device)
    ends = seq_lens.cumsum(dim=1)
    # A position's document: how many documents end at or before it (zero-length padding entries end nothing new).
    document = (ends[:, None, :] <= positions[None, :, None]).sum(dim=2)
    causal = torch.ones(length, length, dtype=torch.bool, device=seq_lens.device).tril()
    return (document[:, :, None] == document[:, None, :]) & causal

"""Lockstep data-parallel loading: the ranks of a ``torch.distributed`` group agree before every step.

Each rank votes what its pull gave it; one ``all_reduce(MIN)`` of a single
int over the group tells every rank the same outcome, so all ranks step, or
all stop, at the same step (a rank that stopped alone would leave the others
hanging in the step's collectives).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

__all__ = ["ERROR", "HAS_BATCH", "NO_BATCH", "agree", "check_group", "rank_of"]

# Votes, ordered so that the minimum is the outcome every rank must follow.
ERROR = 0  # this rank's pull raised: every rank stops; the others raise too
NO_BATCH = 1  # this rank's stream ended: every rank stops
HAS_BATCH = 2  # this rank has a batch: every rank steps only if all voted this


def check_group(process_group: Any) -> None:
    """``RuntimeError`` unless ``torch.distributed`` is initialised; ``TypeError`` for a non-group."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "process_group needs an initialised torch.distributed (call torch.distributed.init_process_group first)"
        )
    if not isinstance(process_group, dist.ProcessGroup):
        raise TypeError(f"process_group must be a torch.distributed.ProcessGroup, got {type(process_group).__name__}")


def agree(process_group: Any, vote: int) -> int:
    """The minimum of every rank's ``vote`` (a blocking collective: every rank of the group must call it).

    It waits at most the group's timeout (``init_process_group(timeout=)`` /
    ``new_group(timeout=)``) for a rank that never arrives, then raises; a
    peer that died usually makes it raise at once (its connections close).
    """
    device = torch.device("cpu")
    if dist.get_backend(process_group) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    flag = torch.tensor([vote], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=process_group)
    return int(flag.item())


def rank_of(process_group: Any) -> tuple[int, int]:
    """This process's rank in ``process_group`` and the group's size."""
    return dist.get_rank(process_group), dist.get_world_size(process_group)

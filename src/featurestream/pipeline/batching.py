"""Batch lease operations over any ``LeaseQueue``, and the batching loader's default collate rule.

A queue that implements ``acquire_many`` / ``ack_many`` / ``fail_many`` (one
lock hold, one Redis round trip) is called through them for more than one
lease; a single lease, or a queue without them (a reference-era queue), gets
the same semantics from the per-item calls, so a one-sample loader makes
exactly the reference loader's calls and the batching loader runs on every
backend.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

from featurestream.core.lease import Lease
from featurestream.core.protocol import LeaseQueue

__all__ = ["ack_many", "acquire_many", "concat_samples", "fail_many", "give_back_many"]


def acquire_many(queue: LeaseQueue, n: int, *, timeout: float) -> list[Lease]:
    """Up to ``n`` leases, waiting up to ``timeout`` for the first; ``[]`` when the wait ends empty-handed."""
    native = getattr(queue, "acquire_many", None)
    if native is not None and n > 1:
        return list(native(n, timeout=timeout))
    first = queue.acquire(timeout=timeout)
    if first is None:
        return []
    leases = [first]
    while len(leases) < n:
        # Only what is pending right now: the batch call returns as soon as at least one lease is out.
        lease = queue.acquire(timeout=0)
        if lease is None:
            break
        leases.append(lease)
    return leases


def ack_many(queue: LeaseQueue, leases: Sequence[Lease]) -> None:
    """Ack every lease (stale ones are rejected one by one, as ``ack`` does)."""
    _settle_each(queue, "ack", leases)


def fail_many(queue: LeaseQueue, leases: Sequence[Lease]) -> None:
    """Fail every lease back (stale ones are rejected one by one, as ``fail`` does)."""
    _settle_each(queue, "fail", leases)


def give_back_many(queue: LeaseQueue, leases: Sequence[Lease]) -> None:
    """Hand unused leases back: pending again, no delivery counted. A queue without ``give_back`` (a
    reference-era one) can only fail them back, which counts a delivery."""
    _settle_each(queue, "give_back" if hasattr(queue, "give_back") else "fail", leases)


def _settle_each(queue: LeaseQueue, settle: str, leases: Sequence[Lease]) -> None:
    """``queue.<settle>_many(leases)`` for more than one lease on a queue that has it, else ``<settle>`` each."""
    native = getattr(queue, f"{settle}_many", None)
    if native is not None and len(leases) > 1:
        native(list(leases))
        return
    single = getattr(queue, settle)
    for lease in leases:
        single(lease)


def concat_samples(samples: Sequence[Mapping[str, torch.Tensor]], sample_ids: Sequence[str]) -> dict[str, torch.Tensor]:
    """Concatenate the samples' tensors feature by feature along dim 0 (each sample is already a batch).

    The rule: every sample must carry the same features, and each feature the
    same shape apart from dim 0 and the same dtype; nothing is padded. A
    mismatch is a ``ValueError`` naming the feature and each sample's shape
    (pass your own ``collate_fn`` to pad sequences of different lengths).
    """
    names = list(samples[0])
    for tensors, sample_id in zip(samples, sample_ids, strict=True):
        if list(tensors) != names:
            raise ValueError(
                f"cannot collate: sample {sample_id!r} has features {list(tensors)}, "
                f"sample {sample_ids[0]!r} has {names}"
            )
    collated: dict[str, torch.Tensor] = {}
    for name in names:
        parts = [tensors[name] for tensors in samples]
        first = parts[0]
        if any(p.dim() == 0 or p.shape[1:] != first.shape[1:] or p.dtype != first.dtype for p in parts):
            shapes = {sid: (tuple(p.shape), str(p.dtype)) for sid, p in zip(sample_ids, parts, strict=True)}
            raise ValueError(
                f"cannot collate feature {name!r}: the default collate concatenates along dim 0 and needs "
                f"equal shapes apart from dim 0 and equal dtypes, got {shapes}; pass collate_fn= to pad"
            )
        collated[name] = torch.cat(parts, dim=0)
    return collated

"""``LocalFeatureStore``: samples held in this process's memory."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from featurestream.common.refs import SampleRef
from featurestream.stores.base import SampleLostError
from featurestream.stores.ledger import LedgerFeatureStore, StoreCaps, check_spec, location
from featurestream.stores.pool import BufferPool, carve, carved_size

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["LocalFeatureStore"]


class LocalFeatureStore(LedgerFeatureStore):
    """An in-process dict of detached, contiguous tensor copies.

    ``get`` returns copies the caller may mutate; residency follows the
    ``FeatureStore`` contract (retained samples survive releases, scrubbed
    ones are freed at once). Copies per sample: one on ``put`` and one per
    ``get`` by default; ``put(..., take_ownership=True)`` keeps the caller's
    (detached, contiguous) tensors and ``get(..., copy=False)`` returns the
    stored ones, so the fully zero-copy path moves no bytes at all. Caps and
    watermarks: the ``StoreCaps`` keywords (``featurestream.stores.ledger``).

    ``pool=True`` (the default): both copies of CPU tensors land in memory
    already faulted in (``featurestream.stores.pool``), at most ``max_bytes``
    of it plus one sample (``health().pool_bytes``). A block a stored sample
    used is reused once the sample is freed and no tensor handed out views it,
    so an older handle's tensors never see a later sample; a ``get``'s copy is
    reused once its caller drops it. ``pool=False``: fresh memory every time.
    """

    def __init__(self, *, pool: bool = True, **caps: Unpack[StoreCaps]) -> None:
        super().__init__(f"mem://local-{uuid.uuid4().hex}", **caps)
        self._pool = BufferPool(self._pool_limit()) if pool else None
        # Keyed by incarnation, not id: the ledger frees bytes after its lock is released, so a drop that
        # runs after a re-put of the same id was admitted must find only its own put's tensors.
        self._data: dict[str, dict[str, torch.Tensor]] = {}
        self._data_lock = threading.Lock()

    def _write(self, sample_id: str, ref: SampleRef, tensors: Mapping[str, torch.Tensor], take_ownership: bool) -> None:
        if take_ownership:
            # A dense tensor outside autograd is kept as it is; ``contiguous`` copies only a strided one.
            kept = {
                name: t if t.is_contiguous() and not t.requires_grad else t.detach().contiguous()
                for name, t in tensors.items()
            }
        else:
            kept = self._copy(ref, tensors)
        with self._data_lock:
            self._data[location(ref)] = kept

    def _load(self, ref: SampleRef, device: torch.device | str | None, copy: bool) -> dict[str, torch.Tensor]:
        with self._data_lock:
            stored = self._data.get(location(ref))
        if stored is None:  # tracked (get opened a handle on it) and yet not held: its bytes were lost
            raise SampleLostError(ref.sample_id, self.store_uri, "its tensors are gone from this process's memory")
        for name in ref.feature_names():
            check_spec(ref, name, stored[name])
        if device is not None:
            return {name: stored[name].to(device, copy=copy) for name in ref.feature_names()}
        return self._copy(ref, stored) if copy else {name: stored[name] for name in ref.feature_names()}

    def _copy(self, ref: SampleRef, tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Dense copies of ``tensors`` (in ``ref``'s order), carved from one pooled block when they are on the CPU."""
        if self._pool is None or any(t.device.type != "cpu" for t in tensors.values()):
            return {
                name: tensors[name].detach().clone(memory_format=torch.contiguous_format)
                for name in ref.feature_names()
            }
        out = carve(self._pool.take(carved_size(ref.feature_specs)), ref.feature_specs)
        for name, target in out.items():
            target.copy_(tensors[name].detach())
        return out

    def _pool_bytes(self) -> int:
        return 0 if self._pool is None else self._pool.held_bytes()

    def _drop(self, ref: SampleRef) -> None:
        with self._data_lock:
            self._data.pop(location(ref), None)

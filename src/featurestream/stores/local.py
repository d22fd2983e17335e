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
    """

    def __init__(self, **caps: Unpack[StoreCaps]) -> None:
        super().__init__(f"mem://local-{uuid.uuid4().hex}", **caps)
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
            kept = {name: t.detach().clone(memory_format=torch.contiguous_format) for name, t in tensors.items()}
        with self._data_lock:
            self._data[location(ref)] = kept

    def _load(self, ref: SampleRef, device: torch.device | str | None, copy: bool) -> dict[str, torch.Tensor]:
        with self._data_lock:
            stored = self._data.get(location(ref))
        if stored is None:  # tracked (get opened a handle on it) and yet not held: its bytes were lost
            raise SampleLostError(ref.sample_id, self.store_uri, "its tensors are gone from this process's memory")
        out = {}
        for name in ref.feature_names():
            tensor = stored[name]
            check_spec(ref, name, tensor)
            if device is not None:
                out[name] = tensor.to(device, copy=copy)
            else:
                out[name] = tensor.clone() if copy else tensor
        return out

    def _drop(self, ref: SampleRef) -> None:
        with self._data_lock:
            self._data.pop(location(ref), None)

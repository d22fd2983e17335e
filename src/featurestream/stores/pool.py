"""Host memory the stores reuse instead of faulting in fresh pages for every sample.

Writing a sample into memory allocated for it costs a page fault (and the
kernel zeroing the page) per 4 KiB, more than the copy itself; a pool keeps
blocks that are already faulted in and hands them out again. A block is handed
out again only once nothing references its storage: every tensor carved from
it (and every view of those) is gone, whoever held it. So a store's own copy
goes back on the store's ``_drop`` (the sample scrubbed or freed) once no
handle's tensors view it, and a ``get``'s copy once its caller drops it: a
reused block is never visible through an older handle, ref or tensor.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

import torch

from featurestream.common.refs import FeatureSpec

__all__ = ["ALIGN", "BufferPool", "aligned", "carve", "carved_size", "copy_bytes", "pinned_copy"]

ALIGN = 64  # every carved feature starts on a cache line, so any dtype can view it


def aligned(nbytes: int) -> int:
    """``nbytes`` rounded up to ``ALIGN``."""
    return -(-nbytes // ALIGN) * ALIGN


def _storage_refs(tensor: torch.Tensor) -> int:
    return int(torch._C._storage_Use_Count(tensor.untyped_storage()._cdata))


_ALONE = _storage_refs(torch.empty(1, dtype=torch.uint8))  # what a storage only its own tensor holds counts


def carve(block: torch.Tensor, specs: Mapping[str, FeatureSpec], start: int = 0) -> dict[str, torch.Tensor]:
    """One tensor per spec, views of ``block`` (uint8) laid out from ``start``, each at an ``ALIGN``ed offset."""
    out, offset = {}, aligned(start)
    for name, spec in specs.items():
        out[name] = block[offset : offset + spec.nbytes].view(spec.dtype).reshape(spec.shape)
        offset += aligned(spec.nbytes)
    return out


def carved_size(specs: Mapping[str, FeatureSpec], start: int = 0) -> int:
    """The bytes ``carve`` needs for ``specs`` after ``start``."""
    return aligned(start) + sum(aligned(spec.nbytes) for spec in specs.values())


def copy_bytes(target: torch.Tensor, source: torch.Tensor) -> None:
    """``target.copy_(source)`` for two flat uint8 tensors of one length, as 8-byte words where both start on one:
    torch copies wide elements faster than single bytes."""
    size = source.numel()
    words = size - size % 8 if target.storage_offset() % 8 == source.storage_offset() % 8 == 0 else 0
    if words:
        target[:words].view(torch.int64).copy_(source[:words].view(torch.int64))
    if words < size:
        target[words:].copy_(source[words:])


def pinned_copy(tensors: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Copies of ``tensors`` in one page-locked block (CUDA's caching host allocator: freed blocks are reused once
    the copies to a GPU that read them are done, which a pool of its own could not tell)."""
    specs = {name: FeatureSpec(tuple(t.shape), t.dtype) for name, t in tensors.items()}
    out = carve(torch.empty(carved_size(specs), dtype=torch.uint8, pin_memory=True), specs)
    for name, target in out.items():
        target.copy_(tensors[name])
    return out


class BufferPool:
    """Byte blocks handed out again once nothing references them; at most ``limit`` bytes kept, plus one block.

    ``take`` reuses a free block between the size asked for and twice it, or
    allocates one; a new block is kept only while the pool holds no more than
    ``limit`` bytes (free blocks are dropped first to make room), so the pool
    grows on demand and never holds more than ``limit`` plus one block.
    Thread-safe.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._blocks: list[torch.Tensor] = []
        self._held = 0
        self._lock = threading.Lock()

    def take(self, nbytes: int) -> torch.Tensor:
        """``nbytes`` of uint8 memory, a view of a pooled block when one is free (its old contents are left)."""
        with self._lock:  # the view is taken under the lock, so no other take can hand out the same block
            for block in self._blocks:
                if nbytes <= block.numel() <= 2 * nbytes and _storage_refs(block) == _ALONE:
                    return block[:nbytes]
            block = torch.empty(max(nbytes, 1), dtype=torch.uint8)
            self._make_room(block.numel())
            if self._held <= self._limit:
                self._blocks.append(block)
                self._held += block.numel()
            return block[:nbytes]

    def _make_room(self, nbytes: int) -> None:
        """Drop free blocks until ``nbytes`` more fit under the limit (or none is free)."""
        for block in list(self._blocks):
            if self._held + nbytes <= self._limit:
                return
            if _storage_refs(block) == _ALONE:
                self._blocks.remove(block)
                self._held -= block.numel()

    def held_bytes(self) -> int:
        """Bytes of the blocks the pool keeps, handed out or free."""
        with self._lock:
            return self._held

    def clear(self) -> None:
        """Forget every block; those handed out stay valid for whoever holds them."""
        with self._lock:
            self._blocks.clear()
            self._held = 0

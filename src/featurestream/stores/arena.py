"""One writer's arena in a shared directory: pre-sized files, kept mapped, that its puts reuse.

Writing a sample into a new file on ``/dev/shm`` allocates and zeroes every
page of it, and freeing it gives them back: a page fault's worth of work per
4 KiB on the way in, again on the next sample. An arena keeps ``slot`` files,
each mapped into the writer, and writes each sample into a free one (a plain
memory copy into pages already there), then hard-links it to the sample's
data name. The slot and the data name are then one file, so:

- a slot is free again once its data name is gone (its link count is back
  to 1), whichever process removed it (a queue's ``scrub``, a last release);
- a reader holds a shared ``flock`` on the file for as long as it reads it
  (a ``get``'s copy) or maps it (``get(copy=False)``: until every tensor of
  the mapping is gone), and the writer reuses a slot only under an exclusive,
  non-blocking lock on it, so no reader ever sees a later sample's bytes. A
  reader that opened the data name just before it was removed takes its lock
  after the writer's, and then finds the name gone or naming another file
  (``spec/Incarnation.tla``'s reuse model).

A reader copies a slot's sample out of a mapping of the slot it keeps
(``SlotMaps``): the pages stay mapped from one sample to the next, so the copy
runs at memory speed, where a ``read`` walks the page cache a page at a time
and a fresh mapping faults every page in again.

Slot files are named as the writer's temporaries (``.pool.<host>-<pid>.<n>.tmp``),
so the dead-writer sweep removes a killed writer's; ``close`` removes them.
The arena keeps at most ``limit`` bytes of slots plus one sample's: it grows
on demand, drops free slots to make room, and beyond that a put writes a file
of its own (the store's unpooled path).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import mmap
import os
import threading
from collections.abc import Sequence

import torch

from featurestream.stores.pool import BufferPool, copy_bytes
from featurestream.stores.safetensors_codec import CorruptSampleError, read_all

__all__ = ["MAX_SLOT_MAPS", "SLOT_TAG", "FileArena", "SlotMaps", "entries", "is_slot", "read_whole"]

SLOT_TAG = "pool"  # slot files are named ``.pool.<host>-<pid>.<arena>-<n>.tmp``: a writer's temporaries
MAX_SLOT_MAPS = 64  # each kept mapping holds a file descriptor, which a deep queue of small samples could use up
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS)


def is_slot(name: str) -> bool:
    """Whether a directory entry is an arena's slot file."""
    return name.startswith(f".{SLOT_TAG}.") and name.endswith(".tmp")


def entries(directory: str | os.PathLike[str]) -> list[str]:
    """The names in ``directory`` other than arena slots (what its samples, links and markers are)."""
    return [name for name in os.listdir(directory) if not is_slot(name)]


class _Slot:
    __slots__ = ("fd", "mapping", "path", "size", "view")

    def __init__(self, path: str, fd: int) -> None:
        self.path = path
        self.fd = fd
        self.size = 0
        self.mapping: mmap.mmap | None = None
        self.view = torch.empty(0, dtype=torch.uint8)

    def resize(self, size: int) -> None:
        """Make the file exactly ``size`` bytes, its pages allocated (``OSError``, e.g. ENOSPC, rather than SIGBUS)."""
        if size == self.size and os.fstat(self.fd).st_size == size:
            return  # (a file rewritten in place by some tool is sized again: a write past its end would fault)
        self.unmap()
        self.size = -1  # unknown until sized: a failure below leaves it to be sized again
        os.ftruncate(self.fd, size)
        os.posix_fallocate(self.fd, 0, size)
        self.mapping = mmap.mmap(self.fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self.view = torch.frombuffer(self.mapping, dtype=torch.uint8)
        self.size = size

    def unmap(self) -> None:
        self.view = torch.empty(0, dtype=torch.uint8)
        if self.mapping is not None:
            self.mapping.close()
            self.mapping = None

    def free(self) -> bool:
        """Whether no data name links to the file and no reader holds it; if so, this writer now holds it."""
        if os.fstat(self.fd).st_nlink != 1:
            return False
        try:
            fcntl.flock(self.fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        return True


class FileArena:
    """Slot files in ``directory`` named ``<prefix><n>.tmp``, reused for one writer's samples (thread-safe)."""

    def __init__(self, directory: str, prefix: str, limit: int) -> None:
        self._directory = directory
        self._prefix = prefix
        self._limit = limit
        self._slots: list[_Slot] = []
        self._made = 0
        self._lock = threading.Lock()

    def write(self, final: str, parts: Sequence[torch.Tensor]) -> bool:
        """Write ``parts`` (uint8 tensors, in order) as the file ``final``; ``False`` when the arena has no room.

        ``final`` appears with its whole contents at once (a hard link of a written slot). ``FileExistsError``
        when ``final`` exists; ``OSError`` (ENOSPC ...) when the slot cannot be sized; the slot stays free.
        """
        size = sum(part.numel() for part in parts)
        with self._lock:
            slot = self._take(size)
            if slot is None:
                return False
            try:
                slot.resize(size)
                offset = 0
                for part in parts:
                    copy_bytes(slot.view[offset : offset + part.numel()], part)
                    offset += part.numel()
                os.link(slot.path, final)
            finally:
                fcntl.flock(slot.fd, fcntl.LOCK_UN)
        return True

    def _take(self, size: int) -> _Slot | None:
        """A free slot, locked: one of ``size`` bytes if any, else the free one closest in size, else a new one if
        there is room."""
        chosen: _Slot | None = None
        for slot in self._slots:  # least recently taken first: samples leave in the order they came, mostly
            if chosen is not None and abs(slot.size - size) >= abs(chosen.size - size):
                continue
            if slot.free():
                if chosen is not None:
                    fcntl.flock(chosen.fd, fcntl.LOCK_UN)
                chosen = slot
                if slot.size == size:
                    break
        if chosen is not None:
            self._slots.remove(chosen)
            self._slots.append(chosen)
            return chosen
        if self._held() + size > self._limit:
            self._evict(size)
        if self._held() > self._limit:
            return None
        path = os.path.join(self._directory, f"{self._prefix}{self._made}.tmp")
        self._made += 1
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
        slot = _Slot(path, fd)
        self._slots.append(slot)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            self._remove(slot)
            if exc.errno not in _NO_LOCKS:
                raise
            self._limit = -1  # no locks here, so no reuse is safe: every put writes a file of its own
            return None
        return slot

    def _evict(self, size: int) -> None:
        """Remove free slots until ``size`` more bytes fit under the limit (or none is free)."""
        for slot in list(self._slots):
            if self._held() + size <= self._limit:
                return
            if slot.free():
                self._remove(slot)

    def _remove(self, slot: _Slot) -> None:
        self._slots.remove(slot)
        slot.unmap()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(slot.path)
        os.close(slot.fd)

    def _held(self) -> int:
        return sum(max(slot.size, 0) for slot in self._slots)

    def held_bytes(self) -> int:
        """Bytes of the slot files, samples in them included."""
        with self._lock:
            return self._held()

    def close(self) -> None:
        """Remove every slot file; samples still linked to one keep their bytes under their data names."""
        with self._lock:
            for slot in list(self._slots):
                self._remove(slot)


class _Mapped:
    __slots__ = ("fd", "size", "view")

    def __init__(self, locked: int, size: int) -> None:
        # A descriptor of its own, sharing no lock with ``locked``: its link count tells when the slot is gone.
        self.fd = os.open(f"/proc/self/fd/{locked}", os.O_RDONLY | os.O_CLOEXEC)
        self.size = size
        try:
            # Private and never written: it shows the file's current bytes; the storage unmaps it once freed.
            self.view = torch.from_file(f"/proc/self/fd/{self.fd}", shared=False, size=size, dtype=torch.uint8)
        except BaseException:
            os.close(self.fd)
            raise


class SlotMaps:
    """Mappings of the slot files a reader copied samples out of, kept for its next read of the same slot.

    Only a file with a second name (an arena slot linked to a data name) is kept: a file of its own is freed
    once its sample is, and a mapping would keep its bytes. A kept mapping holds no lock: ``copy`` reads it
    only while the caller holds the file's shared lock. Mappings of slots whose file is gone (their writer
    closed or dropped them) are let go by the next ``copy`` that maps a slot, ``prune`` or ``close``; at most
    ``limit`` bytes and ``MAX_SLOT_MAPS`` slots are kept mapped, the least recently read let go first.
    Thread-safe.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._maps: dict[tuple[int, int], _Mapped] = {}  # (device, inode) -> mapping, least recently used first
        self._closed = False
        self._lock = threading.Lock()

    def copy(self, fd: int, held: os.stat_result, target: torch.Tensor) -> bool:
        """Copy the whole file ``fd`` (``held``: its ``fstat``, locked shared by the caller) into ``target``
        from a kept mapping; ``False`` when the file is no slot, or too large to keep, or cannot be mapped."""
        if held.st_nlink < 2 or not 0 < held.st_size <= self._limit:
            return False
        key = (held.st_dev, held.st_ino)
        with self._lock:
            if self._closed:
                return False
            mapped = self._maps.pop(key, None)
            if mapped is not None and mapped.size != held.st_size:  # sized again by its writer since
                os.close(mapped.fd)
                mapped = None
            if mapped is None:
                self._prune()
                try:
                    mapped = _Mapped(fd, held.st_size)
                except (OSError, RuntimeError):
                    return False  # no /proc, or no room for the mapping: the caller reads the file
                self._evict(held.st_size)
            self._maps[key] = mapped
            view = mapped.view  # keeps the mapping alive through the copy, whoever lets it go meanwhile
        copy_bytes(target, view)
        return True

    def _evict(self, size: int) -> None:
        while self._maps and (
            len(self._maps) >= MAX_SLOT_MAPS or sum(m.size for m in self._maps.values()) + size > self._limit
        ):
            self._drop(next(iter(self._maps)))

    def _prune(self) -> None:
        for key, mapped in list(self._maps.items()):
            if os.fstat(mapped.fd).st_nlink == 0:
                self._drop(key)

    def _drop(self, key: tuple[int, int]) -> None:
        os.close(self._maps.pop(key).fd)

    def prune(self) -> None:
        """Let go of the mappings of slots whose file is gone."""
        with self._lock:
            self._prune()

    def close(self) -> None:
        """Let go of every mapping; later copies keep none."""
        with self._lock:
            self._closed = True
            for key in list(self._maps):
                self._drop(key)


def _open_locked(path: str) -> tuple[int, os.stat_result]:
    """``path`` opened read-only under a shared lock, once certain the name still names that file, and its ``fstat``.

    ``FileNotFoundError`` when the name is gone or names another file by the time the lock is held (an
    arena slot reused meanwhile). The lock lives as long as the open file: this descriptor, and every
    mapping made from it.
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
        except OSError as exc:
            if exc.errno not in _NO_LOCKS:
                raise  # a filesystem without locks holds no arena either: its writers write files of their own
        held, named = os.fstat(fd), os.stat(path)
        if (held.st_ino, held.st_dev) != (named.st_ino, named.st_dev):
            raise FileNotFoundError(errno.ENOENT, "the name was given to another file meanwhile", path)
    except BaseException:
        os.close(fd)
        raise
    return fd, held


def _map(fd: int, size: int) -> tuple[torch.Tensor, memoryview]:
    """The file ``fd`` mapped copy-on-write: an inference-mode uint8 tensor of it and its bytes.

    The mapping holds its own descriptor of the open file, so a shared lock taken on ``fd`` lasts until
    every tensor viewing the mapping is gone. An in-place write through the tensor (or a view of it)
    outside inference mode raises ``RuntimeError``; whatever it (or any other write) changed is this
    process's private copy of the page, never the file another reader sees.
    """
    mapping = mmap.mmap(fd, size, access=mmap.ACCESS_COPY)
    with torch.inference_mode():
        buffer = torch.frombuffer(mapping, dtype=torch.uint8)
    return buffer, memoryview(mapping)


def read_whole(
    path: str, sample_id: str, pool: BufferPool | None, mapped: bool, maps: SlotMaps | None = None
) -> tuple[torch.Tensor, memoryview]:
    """The whole file ``path`` as a uint8 tensor and its bytes, read under the file's shared lock.

    ``mapped``: mapped copy-on-write (``_map``), the lock held for as long as the mapping lives. Else
    copied into memory from ``pool`` (fresh memory without one), the caller's to mutate: out of a mapping
    ``maps`` keeps when the file is a slot, else read. ``FileNotFoundError`` when the name is gone
    (``_open_locked``); ``CorruptSampleError`` when the file shrinks while being read.
    """
    fd, held = _open_locked(path)
    try:
        size = held.st_size
        if mapped and size:
            return _map(fd, size)
        buffer = pool.take(size) if pool is not None else torch.empty(size, dtype=torch.uint8)
        raw = memoryview(buffer.numpy())
        if (maps is None or not maps.copy(fd, held, buffer)) and read_all(fd, raw) != size:
            raise CorruptSampleError(f"sample {sample_id!r}: {path} shrank while being read (truncated)")
        return buffer, raw
    finally:
        os.close(fd)

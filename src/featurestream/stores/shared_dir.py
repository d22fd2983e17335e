"""``SharedDirFeatureStore``: one safetensors file per sample in a directory shared by processes.

Files and what they mean (``<id>`` is the sample id, ``<inc>`` the incarnation: 32 hex
digits minted by each ``put`` and carried by its ref's feature keys, ``<id>@<inc>/<name>``):

- ``<id>@<inc>.safetensors`` — the sample, a standard safetensors file. It appears
  atomically: written to ``.<id>.<host>-<pid>.<random>.tmp`` in the same directory, then
  hard-linked to its final name (never clobbering a file there) and the temporary
  name unlinked. Every name carries the incarnation, so a ref or handle of an
  earlier put of the id (a stale reader in any instance) can neither read,
  free nor scrub a later one: its files are simply gone.
- ``.scrubbed-<random>`` — a sample on its way out. Freeing a large file's
  pages takes milliseconds, so its removal is split: the file is renamed
  here at once (its name is gone: no ``get`` finds it) and unlinked on a
  background thread (``featurestream.stores.deleter``). ``close`` waits for
  those unlinks; a new instance on the directory unlinks any left by a
  process that died before finishing them.
- ``<id>.safetensors`` — a symbolic link to the data file of the id's latest put: the
  reference's layout, so any reader that knows only it (``safetensors.torch.load_file``,
  offline tools) finds the current sample there, and ``is_resident`` of a sample another
  instance wrote is one ``stat`` rather than a directory listing. Every read, release
  and scrub of a ref goes by the ref's own incarnation. Whoever removes a data file
  removes the link too when it still names that file. A put never replaces a regular
  file there (a sample in the reference's layout): it is refused as already present.
- Incarnation-less samples: a ref in the reference's key format (``<id>/<name>``, as the
  reference's store and offline precompute tools write them) names ``<id>.safetensors``
  itself, with ``<id>.retained`` as its marker. It is read through whatever that name
  holds; its release and scrub remove the name only when it is a regular file (the
  reference's layout), never the link to a featurestream put, so a ref that names no
  put can never free one.
- ``<id>@<inc>.retained`` — an empty marker: a queue holds the sample. The queue's
  process creates it on ``retain`` (before the sample can be leased) and
  removes it on ``scrub`` (after the data file). A store instance releasing
  its last handle on a sample unlinks the file only when no marker exists, so
  a stale or slow consumer in another process can never delete a sample a
  queue is about to redeliver, and a consumer that crashes without releasing
  leaks nothing: the queue's ``scrub`` unlinks the file whoever wrote it.

Orphans: every instance holds a liveness token the OS releases when its
process dies (``featurestream.stores.orphans``: a lock on the directory, no
file), and the first 16 hex digits of each incarnation it mints name it. A
sample whose writer died before a queue took it (a producer killed between
``store.put`` and ``queue.put``) is freed by ``reclaim_orphans``, which every
instance runs every ``orphan_interval`` seconds, in ``gc`` and from its queue's
reaper, once it has seen the writer dead for ``orphan_grace`` seconds; a marked
sample only when the queue holds it no more (see ``reclaim_orphans``).

Residency (caps, ``health``) counts only the files this instance wrote, from
in-memory counters; ``close`` unlinks those no queue holds (no queued marker),
even with handles out. A queued one stays for its consumers, in any process,
until the queue's ``scrub`` (or the orphan reclaim) frees it.

Copies and reuse (``pool=True``, the default): ``put`` copies once, into a reused
mapped file of this writer's arena (``stores.arena``; the data file is a hard link of
it), and ``get`` reads once into pooled memory (``stores.pool``), the caller's to mutate;
``get(copy=False)`` maps the file as read-only (inference-mode) views, valid while kept.
``pool=False``: a file per put, fresh memory per get. The codec is featurestream's own
(``stores.safetensors_codec``); its files are interchangeable with ``safetensors``'.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import re
import stat
import tempfile
import threading
import uuid
import weakref
from collections.abc import Mapping
from typing import TYPE_CHECKING

import torch

from featurestream.common.checks import check_seconds
from featurestream.common.periodic import start_periodic
from featurestream.common.refs import SampleRef
from featurestream.stores.arena import SLOT_TAG, FileArena, SlotMaps, read_whole
from featurestream.stores.base import SampleLostError
from featurestream.stores.deleter import BackgroundDeleter, remove_reporting
from featurestream.stores.directory import HOST, TEMP_SUFFIX, prepare_directory, sweep_dead_temporaries
from featurestream.stores.ledger import (
    INCARNATION_SEP,
    LedgerFeatureStore,
    StoreCaps,
)
from featurestream.stores.orphans import (
    DEFAULT_ORPHAN_GRACE,
    DEFAULT_ORPHAN_INTERVAL,
    TOKEN_DIGITS,
    Holds,
    OrphanClock,
    WriterToken,
)
from featurestream.stores.pointer import point_at, unpoint
from featurestream.stores.pool import BufferPool
from featurestream.stores.safetensors_codec import CorruptSampleError, decode, encode_header, write_all

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["CorruptSampleError", "SharedDirFeatureStore"]

logger = logging.getLogger(__name__)

DATA_SUFFIX = ".safetensors"
RETAINED_SUFFIX = ".retained"
POINTER_SUFFIX = DATA_SUFFIX  # ``<id>.safetensors``: the reference's name of the sample, a link here
SCRUBBED_PREFIX = ".scrubbed-"


_INCARNATION = re.compile(r"[0-9a-f]{32}")
# A data file or queued marker of an incarnation (what a link to a data file names, too).
_OWNED_NAME = re.compile(
    rf"(?P<id>.+){INCARNATION_SEP}(?P<inc>[0-9a-f]{{32}})(?:{re.escape(DATA_SUFFIX)}|{re.escape(RETAINED_SUFFIX)})"
)
_INCARNATION_TAIL = re.compile(rf"{INCARNATION_SEP}[0-9a-f]{{32}}$")


class SharedDirFeatureStore(LedgerFeatureStore):
    """Samples as ``<sample_id>@<incarnation>.safetensors`` files in ``directory``, shared by processes or nodes,
    each current put also at the reference's ``<sample_id>.safetensors`` (a link); refs keyed ``<id>/<name>`` (the
    reference's format) read, queue and scrub that file as an incarnation-less sample.

    ``store_uri`` is ``file://<absolute directory>``, so every instance on the
    same directory can ``get`` and ``release`` the others' samples. A missing
    ``directory`` is created when its parent exists; a missing parent raises
    ``FileNotFoundError`` (a typo would otherwise give a private directory)
    unless ``create=True``, which creates the whole path. The directory must be
    writable: ``PermissionError`` (or the ``OSError`` met) naming it, at
    construction rather than at the first put. Errors: a ``sample_id`` with ``/``,
    ``..`` or NUL, or beginning ``.scrubbed-`` (the store's own files on their
    way out) -> ``ValueError``; an unknown or freed sample -> ``KeyError``;
    an undecodable file -> ``CorruptSampleError``; the directory gone, a full
    disk or a permission problem -> the ``OSError`` subclass, naming the
    sample and the path. A failed ``put`` stores nothing
    and leaves no file behind. Caps and watermarks: the ``StoreCaps`` keywords.

    Orphans: the samples of a writer (an instance on the directory, in any process) that died before a
    queue took them are freed ``orphan_grace`` seconds (default 10) after a sweep first finds the writer
    dead; a sweep runs every ``orphan_interval`` seconds (default 5; ``None``: only in ``gc`` and the
    queue's reaper). A writer's samples are freed at most ``orphan_grace + 2 * orphan_interval`` seconds
    after its death. ``ValueError`` for a negative grace or a non-positive interval.

    ``pool`` (default ``True``): writes reuse this writer's arena of files, reads pooled memory, each at most
    ``max_bytes`` plus one sample (``health().pool_bytes``); ``get(copy=False)`` maps the file read-only.
    """

    adopts_foreign = True

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        create: bool = False,
        orphan_grace: float = DEFAULT_ORPHAN_GRACE,
        orphan_interval: float | None = DEFAULT_ORPHAN_INTERVAL,
        pool: bool = True,
        **caps: Unpack[StoreCaps],
    ) -> None:
        check_seconds("orphan_grace", orphan_grace)
        if orphan_interval is not None:
            check_seconds("orphan_interval", orphan_interval, positive=True)
        self.directory = os.path.abspath(os.fspath(directory))
        self._unlink_later: dict[str, None] = {}  # paths whose unlink failed, retried by scrub/gc/close
        self._deleter = BackgroundDeleter(self._unlink_failed)
        super().__init__(f"file://{self.directory}", **caps)
        prepare_directory(self.directory, create)
        for name in os.listdir(self.directory):
            if name.startswith(SCRUBBED_PREFIX):  # left by a process that died before unlinking it
                self._deleter.submit(os.path.join(self.directory, name))
        sweep_dead_temporaries(self.directory)
        self._writer = WriterToken(self.directory)
        arena_name, limit = f"{self._temp_name(SLOT_TAG)}{uuid.uuid4().hex[:8]}-", self._pool_limit()
        self._arena = FileArena(self.directory, arena_name, limit) if pool else None
        self._pool = BufferPool(limit) if pool else None
        self._maps = SlotMaps(limit) if pool else None
        if self._arena is not None:
            weakref.finalize(self, self._arena.close)  # an instance never closed still leaves no slot at exit
        self._orphans = OrphanClock(orphan_grace, orphan_interval or DEFAULT_ORPHAN_INTERVAL)
        self._sweep_stop = threading.Event()
        self._drained: Holds | None = None  # the answer of a drained queue this instance swept with, for its close
        self.reclaim_orphans(force=True)  # notes the writers already dead: their samples go a grace later
        if orphan_interval is not None:
            start_periodic(
                self,
                SharedDirFeatureStore.reclaim_orphans,
                orphan_interval,
                self._sweep_stop,
                name="featurestream-orphans",
            )

    # -- paths ------------------------------------------------------------
    def _check_sample_id(self, sample_id: object) -> None:
        super()._check_sample_id(sample_id)
        assert isinstance(sample_id, str)
        if "/" in sample_id or ".." in sample_id or "\0" in sample_id:
            raise ValueError(
                f"sample_id {sample_id!r} may not contain '/', '..' or NUL: it names a file, and would escape "
                "the store directory"
            )
        if sample_id.startswith(SCRUBBED_PREFIX):
            raise ValueError(
                f"sample_id {sample_id!r} may not begin with {SCRUBBED_PREFIX!r}: the store names its files on "
                "their way out so, and the next instance to open the directory would delete the sample's"
            )
        if _INCARNATION_TAIL.search(sample_id):
            raise ValueError(
                f"sample_id {sample_id!r} may not end in {INCARNATION_SEP}<32 hex digits>: its file "
                f"{sample_id}{DATA_SUFFIX} would be the data file of an incarnation of another sample"
            )

    def _stem(self, ref: SampleRef) -> str:
        """``<id>@<inc>`` of ``ref``'s put, or ``<id>`` for a ref in the reference's key format (``<id>/<name>``:
        an incarnation-less sample); ``ValueError`` for an id that would escape the directory, ``KeyError`` for
        feature keys in neither format (a forged or foreign ref)."""
        self._check_sample_id(ref.sample_id)
        name, key = next(iter(ref.feature_keys.items()))
        prefix, suffix = f"{ref.sample_id}{INCARNATION_SEP}", f"/{name}"
        if key == ref.sample_id + suffix:
            return ref.sample_id
        incarnation = key[len(prefix) : -len(suffix)] if key.startswith(prefix) and key.endswith(suffix) else ""
        if not _INCARNATION.fullmatch(incarnation):
            raise KeyError(
                f"sample {ref.sample_id!r}: feature key {key!r} names no incarnation of {self.store_uri} "
                f"(expected {prefix}<32 hex digits>{suffix}, or {ref.sample_id}{suffix} for an incarnation-less sample)"
            )
        return prefix + incarnation

    def data_path(self, ref: SampleRef) -> str:
        """Where the file of ``ref``'s incarnation lives (``ValueError``/``KeyError`` as ``_stem``)."""
        return os.path.join(self.directory, self._stem(ref) + DATA_SUFFIX)

    def is_resident(self, sample_id: str) -> bool:
        """Samples this instance wrote: from its counters. Another instance's (same directory), or one in the
        reference's layout: whether ``<id>.safetensors`` (the link to the id's latest put, or the file itself)
        leads to data (one ``stat``, whatever the directory holds).
        """
        if super().is_resident(sample_id):
            return True
        try:
            self._check_sample_id(sample_id)
        except ValueError:
            return False
        return os.path.exists(self._pointer_path(sample_id))

    def _pointer_path(self, sample_id: str) -> str:
        return os.path.join(self.directory, sample_id + POINTER_SUFFIX)

    def _temp_name(self, sample_id: str) -> str:
        """A temporary name prefix the dead-writer sweep recognises (``.<id>.<host>-<pid>.``)."""
        return f".{sample_id}.{HOST}-{os.getpid()}."

    def _aside(self, sample_id: str) -> str:
        return os.path.join(self.directory, f"{self._temp_name(sample_id)}{uuid.uuid4().hex}{TEMP_SUFFIX}")

    def _point_at(self, sample_id: str, data_name: str) -> None:
        """Make ``<id>.safetensors`` name ``data_name`` (``stores.pointer.point_at``)."""
        point_at(self._pointer_path(sample_id), data_name, self._aside(sample_id), f"sample {sample_id!r}")

    def _unpoint(self, ref: SampleRef) -> None:
        """Remove ``<id>.safetensors`` if it links to ``ref``'s data file (``stores.pointer.unpoint``). An
        incarnation-less ref's name is its data file: removing that removed the name."""
        if self._stem(ref) != ref.sample_id:
            self._unpoint_stem(ref.sample_id, self._stem(ref))

    def _unpoint_stem(self, sample_id: str, stem: str) -> None:
        """``_unpoint`` of the put ``stem`` (``<id>@<inc>``) of ``sample_id``: a reclaimed orphan has no ref."""
        unpoint(self._pointer_path(sample_id), stem + DATA_SUFFIX, self._aside(sample_id))

    def _marker_path(self, ref: SampleRef) -> str:
        return os.path.join(self.directory, self._stem(ref) + RETAINED_SUFFIX)

    def _io_error(self, exc: OSError, action: str, path: str) -> OSError:
        """The same kind of ``OSError``, with a message naming what failed and where."""
        if isinstance(exc, FileNotFoundError) and not os.path.isdir(self.directory):
            reason = f"the store directory {self.directory} is missing"
        elif exc.errno == errno.ENOSPC:
            reason = f"the disk holding {self.directory} is full"
        else:
            reason = exc.strerror or str(exc)
        return type(exc)(exc.errno, f"cannot {action}: {reason}", path)

    # -- ledger hooks -----------------------------------------------------
    def _mint_incarnation(self) -> str:
        # The writer's liveness token first: a sample's file names the instance whose death makes it an orphan.
        return self._writer.hex + uuid.uuid4().hex[TOKEN_DIGITS:]

    def _write(self, sample_id: str, ref: SampleRef, tensors: Mapping[str, torch.Tensor], take_ownership: bool) -> None:
        final = self.data_path(ref)
        # ``contiguous``/``cpu`` copy only when a tensor is strided or on a device; dense CPU ones are written as-is.
        dense = {name: t.detach().cpu().contiguous() for name, t in tensors.items()}
        prefix, order = encode_header(dense)
        parts = [torch.frombuffer(bytearray(prefix), dtype=torch.uint8)]
        parts += [dense[name].reshape(-1).view(torch.uint8) for name in order]
        action = f"write sample {sample_id!r}"
        try:
            if self._arena is None or not self._arena.write(final, parts):
                self._write_file(sample_id, final, parts)
        except FileExistsError:  # only a forged incarnation can collide: a fresh one is 128 random bits
            raise ValueError(
                f"sample {sample_id!r} is already in {self.store_uri} as {final}: "
                "a sample already present is never overwritten"
            ) from None
        except OSError as exc:
            raise self._io_error(exc, action, exc.filename or final) from exc
        try:
            self._point_at(sample_id, os.path.basename(final))
        except BaseException as exc:
            with contextlib.suppress(OSError):
                os.unlink(final)  # a failed put stores nothing
            if isinstance(exc, OSError):
                raise self._io_error(exc, action, self._pointer_path(sample_id)) from exc
            raise

    def _write_file(self, sample_id: str, final: str, parts: list[torch.Tensor]) -> None:
        """``final`` as a file of its own: written under a temporary name, then linked (it appears whole)."""
        fd, temp = tempfile.mkstemp(dir=self.directory, prefix=self._temp_name(sample_id), suffix=TEMP_SUFFIX)
        try:
            try:
                write_all(fd, [memoryview(part.numpy()) for part in parts])
            finally:
                os.close(fd)
            os.link(temp, final)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)

    def _load(self, ref: SampleRef, device: torch.device | str | None, copy: bool) -> dict[str, torch.Tensor]:
        path = self.data_path(ref)
        mapped = not copy and device is None
        try:
            buffer, raw = read_whole(path, ref.sample_id, self._pool, mapped, self._maps)
        except FileNotFoundError as exc:
            if not os.path.isdir(self.directory):
                raise self._io_error(exc, f"read sample {ref.sample_id!r}", path) from exc
            if os.path.exists(self._marker_path(ref)):  # a queue holds it, and only its scrub removes the file
                raise SampleLostError(
                    ref.sample_id, self.store_uri, f"{path} is gone while a queue holds the sample (deleted by hand?)"
                ) from None
            raise KeyError(f"sample {ref.sample_id!r} is not resident in {self.store_uri} ({path} is gone)") from None
        except OSError as exc:
            raise self._io_error(exc, f"read sample {ref.sample_id!r}", path) from exc
        with torch.inference_mode(mapped):  # views of a mapping stay inference tensors: in-place writes raise
            tensors = decode(buffer, raw, ref, path)
        if device is not None:
            tensors = {name: t.to(device) for name, t in tensors.items()}
        return tensors

    def _pool_bytes(self) -> int:
        arena = 0 if self._arena is None else self._arena.held_bytes()
        return arena + (0 if self._pool is None else self._pool.held_bytes())

    def _drop(self, ref: SampleRef) -> None:
        # Data first, marker second: whoever still sees the marker finds the data gone or keeps it.
        self._unlink(self.data_path(ref), data=True)
        self._unpoint(ref)
        self._unlink(self._marker_path(ref))

    def _drop_scrubbed(self, ref: SampleRef) -> None:
        # scrub moved the data file out already
        self._unpoint(ref)
        self._unlink(self._marker_path(ref))

    def _drop_released(self, ref: SampleRef) -> None:
        marker = self._marker_path(ref)
        with self._lock:
            # A marker this instance failed to remove (its put was refused, its marker never written, something
            # in the way) holds nothing: no queue retains the sample.
            owed = marker in self._unlink_later
        if not owed and os.path.exists(marker):
            return  # a queue (maybe in another process) holds it; its scrub will unlink the file
        self._unlink(self.data_path(ref), data=True)
        self._unpoint(ref)

    def _remove_data(self, path: str) -> None:
        """Take a data file out of the directory now; the background deleter frees its bytes (an arena slot's
        file keeps them: its name goes at once). A link found under the name (an incarnation-less ref's
        ``<id>.safetensors`` that names a put) goes back unless a newer one is there: only its put's refs free it.
        """
        held = os.lstat(path)
        if stat.S_ISREG(held.st_mode) and held.st_nlink > 1:  # an arena slot (a second name) keeps the bytes
            os.unlink(path)
            return
        out = os.path.join(self.directory, f"{SCRUBBED_PREFIX}{uuid.uuid4().hex}")
        os.rename(path, out)
        if os.path.islink(out):
            with contextlib.suppress(FileExistsError):
                os.link(out, path, follow_symlinks=False)
        if os.path.islink(out) or os.lstat(out).st_nlink > 1:
            self._unlink(out)
            return
        self._deleter.submit(out)

    def _unlink(self, path: str, *, data: bool = False) -> None:
        remove_reporting(path, self._unlink_failed, self._remove_data if data else None)

    def _unlink_failed(self, path: str, exc: OSError) -> None:
        # A leftover file is never forgotten: it is retried on the next scrub, gc and close.
        logger.warning("could not unlink %s (%s); retrying it later", path, exc)
        with self._lock:
            self._unlink_later[path] = None

    def _retry_unlinks(self) -> int:
        """Unlink again every path whose unlink failed before; return how many are gone now.

        Under the store's lock, so a ``retain`` that re-creates a marker cannot race with the retry.
        """
        gone = 0
        with self._lock:
            for path in list(self._unlink_later):
                try:
                    os.unlink(path)
                except FileNotFoundError:
                    pass
                except OSError:
                    continue
                del self._unlink_later[path]
                gone += 1
        return gone

    def gc(self) -> int:
        """Forget orphan handles, retry failed unlinks, sweep dead writers' temporaries and reclaim their
        unqueued samples (``reclaim_orphans``, whatever the interval); return how many."""
        swept = super().gc() + self._retry_unlinks() + sweep_dead_temporaries(self.directory)
        return swept + self.reclaim_orphans(force=True)

    def reclaim_orphans(self, held: Holds | None = None, *, force: bool = False, drained: bool = False) -> int:
        """Free what writers seen dead for ``orphan_grace`` seconds left that no queue holds; return how many
        incarnations were freed.

        ``drained`` (``held`` answers for a closed, drained queue: no enqueue can land any more): every writer no
        longer alive (dead, or closed) is ripe at once, no grace; dead writers' temporaries and files on their way
        out go too, all unlinked on return; this instance's ``close`` sweeps so once more (writers dead since).

        A writer is a store instance on this directory, dead once its process is (``stores.orphans``). Of a
        dead writer's samples, one without a queued marker is freed; a marked one (its writer died between
        ``retain`` and the enqueue, or the queue dead-lettered it with its bytes kept and has purged it since)
        only when ``held`` -- a queue's answer, which its reaper passes -- says the queue holds it neither
        pending, leased nor as a dead letter; without ``held``, or when it raises, marked samples stay. A marker
        or ``<id>.safetensors`` link whose data file is gone (a scrub killed halfway) goes as well. Runs at most
        every ``orphan_interval`` seconds unless ``force``; a sweep is one directory listing, a ``readlink`` per
        link no file of its id explains and a probe per other writer. Each is freed as ``scrub`` frees: the data
        file, its link, its marker.
        """
        if drained and held is not None:
            self._drained = held
            freed = self._sweep(held, drained=True)
            self._deleter.flush()
            return freed
        if not force and not self._orphans.due(held is not None):
            return 0
        return self._sweep(held)

    def _sweep(self, held: Holds | None, *, drained: bool = False) -> int:
        """``reclaim_orphans``' sweep (``drained``: without the grace period, leftovers included); it lets go of
        the kept mappings of slots whose file is gone, too."""
        if self._maps is not None:
            self._maps.prune()
        if drained:
            sweep_dead_temporaries(self.directory)
            for name in os.listdir(self.directory):
                if name.startswith(SCRUBBED_PREFIX):  # renamed out already: garbage, whoever is unlinking it
                    self._unlink(os.path.join(self.directory, name))
        names = set(os.listdir(self.directory))  # before the probes: a writer found dead adds no file after them
        found: dict[str, dict[str, str]] = {}  # writer token -> {stem: sample id}
        links = []
        for name in names:
            match = _OWNED_NAME.fullmatch(name)
            if match is not None:
                found.setdefault(match["inc"][:TOKEN_DIGITS], {})[name.rsplit(".", 1)[0]] = match["id"]
            elif name.endswith(DATA_SUFFIX):
                links.append(name)
        with_data = {sample_id for stems in found.values() for sample_id in stems.values()}
        for name in links:  # only a link no data file of its id explains can dangle: one readlink each
            if name[: -len(DATA_SUFFIX)] in with_data:
                continue
            with contextlib.suppress(OSError):  # not a link (the reference's layout), or gone since
                match = _OWNED_NAME.fullmatch(os.readlink(os.path.join(self.directory, name)))
                if match is not None:
                    stem = f"{match['id']}{INCARNATION_SEP}{match['inc']}"
                    found.setdefault(match["inc"][:TOKEN_DIGITS], {})[stem] = match["id"]
        live = {token: self._writer.alive(token) for token in found}
        ripe = {token for token, up in live.items() if not up} if drained else self._orphans.ripe(live)
        orphans = {stem: sample_id for token in ripe for stem, sample_id in found[token].items()}
        queued = {stem for stem in orphans if stem + DATA_SUFFIX in names and stem + RETAINED_SUFFIX in names}
        holding = self._queue_holds(held, [orphans[stem] for stem in queued])
        freed = 0
        for stem, sample_id in orphans.items():
            if stem in queued and (holding is None or sample_id in holding):
                continue
            self._unlink(os.path.join(self.directory, stem + DATA_SUFFIX), data=True)
            self._unpoint_stem(sample_id, stem)
            self._unlink(os.path.join(self.directory, stem + RETAINED_SUFFIX))
            freed += 1
        if freed:
            logger.info("%s: reclaimed %d sample(s) dead writers left unqueued", self.store_uri, freed)
        return freed

    def _queue_holds(self, held: Holds | None, sample_ids: list[str]) -> set[str] | None:
        """``held(sample_ids)``; ``None`` (hold them all) without ``held`` or when it raises."""
        if not sample_ids:
            return set()
        if held is None:
            return None
        try:
            return held(sample_ids)
        except Exception as exc:
            logger.warning(
                "%s: the queue could not say which of %d marked orphans it holds (%r); they stay",
                self.store_uri,
                len(sample_ids),
                exc,
            )
            return None

    def close(self) -> None:
        """Unlink every sample this instance wrote that no queue holds (idempotent), retrying unlinks that failed
        before; a queued sample (its marker on disk, whichever process's queue made it) stays readable by every
        instance until the queue scrubs it.

        Once a queue of this instance swept as drained (``reclaim_orphans(drained=True)``), the close sweeps so
        once more, for writers that died since: on a drained run, the last clean close leaves nothing but kept
        dead letters. Returns once every file this instance removed is unlinked, those of earlier scrubs
        included. Its liveness token goes last: what it leaves is queued, and a queue that drops such a sample
        (or a sweep, asking the queue) frees it.
        """
        self._sweep_stop.set()
        first = not self._closed
        super().close()
        if first and self._drained is not None:
            try:
                self._sweep(self._drained, drained=True)
            except Exception:
                logger.exception("%s: the sweep of a drained run on close raised", self.store_uri)
        if self._arena is not None:
            self._arena.close()  # a sample still linked to a slot keeps its bytes under its own name
        if self._maps is not None:
            self._maps.close()
        self._deleter.flush()
        self._retry_unlinks()
        self._writer.release()

    # -- queue hooks --------------------------------------------------------
    def retain(self, ref: SampleRef) -> None:
        """A queue holds ``ref``: mark it on disk so no instance's release unlinks it before ``scrub``."""
        super().retain(ref)
        marker = self._marker_path(ref) if self._path_ok(ref) else None
        if marker is None:
            return
        with self._lock:
            self._unlink_later.pop(marker, None)  # an old marker's pending unlink must not remove the new one
        try:
            os.close(os.open(marker, os.O_CREAT | os.O_WRONLY, 0o644))
        except OSError as exc:
            raise self._io_error(exc, f"mark sample {ref.sample_id!r} as queued", marker) from exc

    def unretain(self, ref: SampleRef) -> None:
        """A put of ``ref`` was refused: drop its queued marker so releases free it again."""
        if self._path_ok(ref):
            super().unretain(ref)
            self._unlink(self._marker_path(ref))

    def scrub(self, ref: SampleRef) -> None:
        """The queue is done with ``ref``: remove its file and marker, whichever instance wrote them.

        The data file goes first, while the sample is still in this instance's bookkeeping: when moving
        it out of the directory fails (EPERM, EIO ...) the ``OSError`` propagates and the sample stays
        resident and counted by ``health``, so the queue's retry of ``scrub`` finds it again. Once moved
        out, its name is gone; the bytes are unlinked in the background (``close`` waits for them).
        """
        if self._path_ok(ref):
            self._retry_unlinks()
            path = self.data_path(ref)
            try:
                self._remove_data(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise self._io_error(exc, f"scrub sample {ref.sample_id!r}", path) from exc
            super().scrub(ref)

    def _path_ok(self, ref: SampleRef) -> bool:
        # Refs of other stores never name files here; a bad id could only come from a forged ref.
        if ref.store_uri != self.store_uri:
            return False
        self._stem(ref)
        return True

"""``MooncakeFeatureStore``: samples as objects in a Mooncake store, moved over TCP or RDMA between machines.

Mooncake (``mooncake-transfer-engine``) keeps object metadata in a master
(``mooncake_master``) and the bytes in the memory segments its clients mount;
its transfer engine moves them between processes and machines. This store
needs no shared filesystem: producers and trainers only need to reach the
master and each other.

Layout: one Mooncake object per sample, keyed ``<namespace>/<sample_id>@<incarnation>``
(a fresh incarnation per ``put``, so a stale ref or handle of an earlier put of
the same id can never read, free or scrub a later one). The object holds a
32-byte header (magic, incarnation, payload length) followed by every
feature's bytes in ``ref.feature_names()`` order; ``put`` sends them straight
from the tensors' memory and ``get`` receives them straight into the tensors it
returns (no staging copy either way). Objects are hard-pinned: the master never
evicts them, so the only way a sample's bytes vanish without a ``scrub`` is a
fault (the segment holding it unmounted or its process dead, the master
restarted without snapshots): ``get`` then raises ``SampleLostError``.

Residency as every process sees it: ``health`` reports the run's residency,
every writer's samples that Mooncake still holds, in any process of the
namespace. Each writer publishes its residency record (the keys and sizes of
the samples it wrote) as a small object in a slot ``<namespace>/.residency/<n>``
that it claims on its first ``put`` and republishes after every ``put``; every
``health`` reads the records and asks the master which of their objects still
exist, so a sample scrubbed by a trainer in another process, or lost, stops
counting everywhere at once, and backpressure pauses every producer of the run
at the run's total. The caps a ``put`` enforces (``max_samples``, ``max_bytes``)
bound what this instance writes. A reader's last ``release`` of a sample it did
not write frees nothing: the writer (its own last release) or the queue's
``scrub`` frees it, so a stale reader can never remove a sample a queue is
about to redeliver.

Where the bytes live: in the segment of a client that mounted one
(``global_segment_size > 0``). A producer-hosted segment dies with the
producer; ``close`` therefore refuses while a queue still holds samples this
instance wrote (see ``docs/data-plane.md`` for the deployment choices).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import struct
import threading
import time
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch

from featurestream.common.checks import check_count, check_seconds
from featurestream.common.periodic import start_periodic
from featurestream.common.refs import SampleRef
from featurestream.stores import mooncake_contact
from featurestream.stores.base import SampleLostError, StoreHealth
from featurestream.stores.ledger import INCARNATION_SEP, StoreCaps
from featurestream.stores.mooncake_client import (
    BUFFER_OVERFLOW,
    OBJECT_NOT_FOUND,
    TRANSFER_FAIL,
    code,
    load_mooncake,
    load_mooncake_config,
)
from featurestream.stores.mooncake_records import ResidencyRecords
from featurestream.stores.orphans import (
    DEFAULT_ORPHAN_GRACE,
    DEFAULT_ORPHAN_INTERVAL,
    Holds,
    OrphanClock,
)
from featurestream.stores.pool import BufferPool, carve, carved_size
from featurestream.stores.safetensors_codec import CorruptSampleError

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["MooncakeFeatureStore"]

logger = logging.getLogger(__name__)

_MAGIC = b"FSMOON01"
_HEADER = struct.Struct("<8s16sQ")  # magic, incarnation (uuid bytes), payload length

_TRANSFER_RETRIES = 3
_TRANSFER_RETRY_PAUSE = 0.05
_CLOSE_POLL = 0.05
# Writers' residency records: one slot each, at most this many writer instances per namespace.
RESIDENCY_SLOTS = 256
_RESIDENCY = "/.residency/"  # no sample key looks like this: every one ends in @<incarnation>
_LOST_CAUSE = (
    "Mooncake no longer holds its object: unless a queue already scrubbed it, its bytes were lost (the "
    "segment that held it is gone with its process, or the master restarted without its data)"
)


class MooncakeFeatureStore(ResidencyRecords):
    """Samples in a Mooncake store, reachable from every process that can reach its master.

    Constructed with Mooncake's own setup keywords, or from its JSON config
    file with ``from_config_file``. ``namespace`` names the run: objects are
    keyed under it and ``store_uri`` is ``mooncake://<master>/<namespace>``,
    so a ref is served only by stores of the same cluster and run. Set
    ``global_segment_size=0`` in a process that only reads (a trainer): it then
    hosts no bytes. Errors: a sample Mooncake lost -> ``SampleLostError``; an
    object whose size or header does not match its ref -> ``CorruptSampleError``;
    a transfer that keeps failing, an unreachable master -> ``OSError`` naming
    the sample and Mooncake's error code; a put Mooncake has no room for ->
    ``MemoryError``. Caps and watermarks: the ``StoreCaps`` keywords; the caps
    bound what this instance writes, ``health`` measures the run against them.

    ``get`` receives into buffers it reuses once the tensors of an earlier
    ``get`` carved from them are gone (``read_pool_bytes`` of them at most;
    0: fresh memory every time); the caller owns what it gets either way.

    ``client``: an already set-up ``mooncake.store.MooncakeDistributedStore``
    to share (e.g. the serving engine's own); the setup keywords then only name
    the cluster, and ``close`` leaves that client open.
    """

    adopts_foreign = True

    def __init__(
        self,
        *,
        master_server_address: str,
        metadata_server: str,
        local_hostname: str,
        protocol: str = "tcp",
        global_segment_size: int = 512 * 1024 * 1024,
        local_buffer_size: int = 64 * 1024 * 1024,
        device_name: str = "",
        namespace: str = "featurestream",
        close_timeout: float = 60.0,
        client: Any = None,
        read_pool_bytes: int = 256 * 1024 * 1024,
        orphan_grace: float = DEFAULT_ORPHAN_GRACE,
        orphan_interval: float = DEFAULT_ORPHAN_INTERVAL,
        **caps: Unpack[StoreCaps],
    ) -> None:
        check_seconds("close_timeout", close_timeout)
        check_seconds("orphan_grace", orphan_grace)
        check_seconds("orphan_interval", orphan_interval, positive=True)
        check_count("read_pool_bytes", read_pool_bytes)
        for name, value in (
            ("master_server_address", master_server_address),
            ("metadata_server", metadata_server),
            ("local_hostname", local_hostname),
            ("protocol", protocol),
            ("namespace", namespace),
        ):
            if not isinstance(value, str) or not value:
                raise ValueError(f"{name} must be a non-empty str, got {value!r}")
        if not isinstance(device_name, str):
            raise ValueError(f"device_name must be a str, got {device_name!r}")
        if INCARNATION_SEP in namespace:
            raise ValueError(f"namespace {namespace!r} may not contain {INCARNATION_SEP!r}")
        check_count("global_segment_size", global_segment_size)
        check_count("local_buffer_size", local_buffer_size)
        super().__init__(f"mooncake://{master_server_address}/{namespace}", **caps)
        self.namespace = namespace
        self.close_timeout = close_timeout
        self._pool = BufferPool(read_pool_bytes)
        self.master_server_address = master_server_address
        self.protocol = protocol
        self._register = protocol != "tcp"  # RDMA (and the other fabrics) read and write registered memory only
        self._config = load_mooncake().ReplicateConfig()
        self._config.with_hard_pin = True  # never evicted: only a scrub, a release or a fault removes a sample
        self._config.replica_num = 1
        self._keys: dict[str, str] = {}  # sample id -> object key, for the samples this instance wrote
        self._writer = uuid.uuid4().hex  # names this instance in its residency record
        self._slot: str | None = None  # the residency slot this instance claimed (on its first put)
        self._publish_lock = threading.Lock()  # one record upload at a time, each of the latest state
        self._slots = [f"{namespace}{_RESIDENCY}{n}" for n in range(RESIDENCY_SLOTS)]
        self._writing: set[str] = set()  # object keys whose put is in flight (not yet visible to the master)
        self._orphans = OrphanClock(orphan_grace, orphan_interval)
        self._beat_stop = threading.Event()
        self._client_lock = threading.Lock()
        self._client_closed = False
        self._owns_client = client is None
        if client is not None:
            self._client = client
            self._start_beating()
            return
        self._client = load_mooncake().MooncakeDistributedStore()
        mooncake_contact.reach(master_server_address, metadata_server)
        rc = self._client.setup(
            local_hostname,
            metadata_server,
            global_segment_size,
            local_buffer_size,
            protocol,
            device_name,
            master_server_address,
        )
        if rc != 0:
            raise ConnectionError(
                f"cannot set up a Mooncake client of master {master_server_address} (metadata {metadata_server}, "
                f"{protocol}, hostname {local_hostname}): {code(rc)}; is mooncake_master running there?"
            )
        if global_segment_size > 0:
            # Producer-hosted: what this instance writes goes to its own segment while it has room, so its exit
            # loses its own samples (those close() waits for) rather than another producer's; its record goes too.
            self._config.preferred_segment = self._client.get_hostname()
        self._start_beating()

    def _start_beating(self) -> None:
        """Republish this writer's record every ``orphan_interval`` seconds, so the other instances of the run can
        tell it lives (``reclaim_orphans``)."""
        start_periodic(
            self, MooncakeFeatureStore._beat, self._orphans.interval, self._beat_stop, name="featurestream-beat"
        )

    def _beat(self) -> None:
        if self._slot is not None:
            self._publish()

    @classmethod
    def from_config_file(cls, path: str | os.PathLike[str] | None = None, **options: Any) -> MooncakeFeatureStore:
        """Build one from Mooncake's JSON config file (default: ``$MOONCAKE_CONFIG_PATH``), as SGLang and vLLM do.

        ``options`` are this class's own keywords (``namespace``, caps, watermarks).
        """
        config_module = load_mooncake_config()
        if path is None:
            path = os.environ.get("MOONCAKE_CONFIG_PATH")
            if not path:
                raise ValueError("no config file given and MOONCAKE_CONFIG_PATH is not set")
        config = config_module.MooncakeConfig.from_file(os.fspath(path))
        return cls(
            master_server_address=config.master_server_address,
            metadata_server=config.metadata_server,
            local_hostname=config.local_hostname,
            protocol=config.protocol,
            global_segment_size=config.global_segment_size,
            local_buffer_size=config.local_buffer_size,
            device_name=config.device_name or "",
            **options,
        )

    # -- keys -------------------------------------------------------------
    def _feature_key(self, sample_id: str, name: str, incarnation: str) -> str:
        return f"{self.namespace}/{super()._feature_key(sample_id, name, incarnation)}"

    @staticmethod
    def object_key(ref: SampleRef) -> str:
        """The Mooncake key of ``ref``'s object (every feature key is it plus ``/<feature name>``)."""
        name, key = next(iter(ref.feature_keys.items()))
        return key[: -len(name) - 1]

    @staticmethod
    def _incarnation(key: str) -> bytes:
        return uuid.UUID(key.rsplit(INCARNATION_SEP, 1)[1]).bytes

    # -- ledger hooks -----------------------------------------------------
    def _write(self, sample_id: str, ref: SampleRef, tensors: Mapping[str, torch.Tensor], take_ownership: bool) -> None:
        key = self.object_key(ref)
        # ``contiguous``/``cpu`` copy only a strided or device tensor; Mooncake reads dense CPU ones in place.
        dense = [tensors[name].detach().cpu().contiguous() for name in ref.feature_names()]
        payload = sum(t.numel() * t.element_size() for t in dense)
        header = torch.frombuffer(bytearray(_HEADER.pack(_MAGIC, self._incarnation(key), payload)), dtype=torch.uint8)
        parts = [header, *(t for t in dense if t.numel())]
        with self._lock:
            self._writing.add(key)
        try:
            rc = self._transfer("put", key, parts, lambda ptrs, sizes: self._put_parts(key, ptrs, sizes))
        finally:
            with self._lock:
                self._writing.discard(key)
        if rc == 0:
            with self._lock:
                self._keys[sample_id] = key
            self._publish()
            return
        if rc in (-200, -201, -202):  # no segment has room (NO_AVAILABLE_HANDLE and its kin)
            raise MemoryError(f"sample {sample_id!r} refused: Mooncake has no room for {payload} B ({code(rc)})")
        raise OSError(f"cannot put sample {sample_id!r} into {self.store_uri}: Mooncake returned {code(rc)}")

    def _put_parts(self, key: str, ptrs: list[int], sizes: list[int]) -> int:
        return int(self._client.batch_put_from_multi_buffers([key], [ptrs], [sizes], self._config)[0])

    def _load(self, ref: SampleRef, device: torch.device | str | None, copy: bool) -> dict[str, torch.Tensor]:
        key = self.object_key(ref)
        block = self._pool.take(carved_size(ref.feature_specs, _HEADER.size))
        header, out = block[: _HEADER.size], carve(block, ref.feature_specs, _HEADER.size)
        parts = [header, *(t for t in out.values() if t.numel())]
        expected = sum(t.numel() * t.element_size() for t in parts)
        for attempt in range(_TRANSFER_RETRIES + 1):
            rc = self._transfer(
                "get",
                key,
                parts,
                lambda ptrs, sizes: int(self._client.batch_get_into_multi_buffers([key], [ptrs], [sizes])[0]),
            )
            if rc != TRANSFER_FAIL:
                break
            # A failed transfer: the object may be gone, or shorter than the buffers (a size mismatch fails so too).
            size = int(self._client.get_size(key))
            if size == OBJECT_NOT_FOUND or (size >= 0 and size != expected) or attempt == _TRANSFER_RETRIES:
                rc = size if size == OBJECT_NOT_FOUND or size < expected else rc
                break
            time.sleep(_TRANSFER_RETRY_PAUSE)
        where = f"sample {ref.sample_id!r} (object {key!r} in {self.store_uri})"
        if rc == OBJECT_NOT_FOUND:
            raise SampleLostError(ref.sample_id, self.store_uri, f"{_LOST_CAUSE} (object {key!r})")
        if rc == BUFFER_OVERFLOW:
            raise CorruptSampleError(f"{where}: the object is larger than the {expected} B its ref describes")
        if rc < 0:
            raise OSError(f"cannot read {where}: Mooncake returned {code(rc)}")
        if rc != expected:
            raise CorruptSampleError(f"{where}: read {rc} B, but its ref describes {expected} B (truncated?)")
        magic, incarnation, payload = _HEADER.unpack(header.numpy().tobytes())
        if magic != _MAGIC or incarnation != self._incarnation(key) or payload != expected - _HEADER.size:
            raise CorruptSampleError(f"{where}: its header does not match the ref (another writer's object?)")
        if device is not None:
            return {name: t.to(device) for name, t in out.items()}
        return out

    def _transfer(self, action: str, key: str, parts: list[torch.Tensor], call: Any) -> int:
        ptrs = [t.data_ptr() for t in parts]
        sizes = [t.numel() * t.element_size() for t in parts]
        with self._client_lock:
            if self._client_closed:
                raise RuntimeError(f"cannot {action} {key!r}: {type(self).__name__} {self.store_uri} is closed")
        if not self._register:
            return int(call(ptrs, sizes))
        registered = []
        try:
            for ptr, size in zip(ptrs, sizes, strict=True):
                rc = self._client.register_buffer(ptr, size)
                if rc != 0:
                    raise OSError(f"cannot register {size} B for {action} of {key!r}: Mooncake returned {code(rc)}")
                registered.append(ptr)
            return int(call(ptrs, sizes))
        finally:
            for ptr in registered:
                self._client.unregister_buffer(ptr)

    def _remove(self, key: str, what: str) -> None:
        # force: a reader's get leases the object against removal for default_kv_lease_ttl; a scrub must not wait.
        rc = int(self._client.remove(key, True))
        if rc not in (0, OBJECT_NOT_FOUND):
            raise OSError(f"cannot {what} {key!r} in {self.store_uri}: Mooncake returned {code(rc)}")

    def _drop(self, ref: SampleRef) -> None:
        with self._lock:
            key = self._keys.pop(ref.sample_id, None)
        if key is not None:
            self._remove(key, "free")

    def _drop_scrubbed(self, ref: SampleRef) -> None:
        # scrub removed the object by the ref's key already; only this instance's note of it is left
        with self._lock:
            self._keys.pop(ref.sample_id, None)

    # A reader's release frees only what this instance wrote: ``_drop`` finds no key for a foreign sample.
    _drop_released = _drop

    # -- residency as Mooncake sees it --------------------------------------
    def _reconcile(self, also: list[str] | None = None) -> list[bool]:
        """Forget the samples this instance wrote that Mooncake no longer holds (scrubbed elsewhere, or lost).

        Returns whether each key of ``also`` exists, from the same ``batch_is_exist`` call (all false once
        closed), so ``health`` asks the master about its own samples and the residency slots at once.
        """
        also = also or []
        with self._lock:
            written = {} if self._closed else {sid: key for sid, key in self._keys.items() if key not in self._writing}
        if not written and not also:
            return []
        with self._client_lock:
            if self._client_closed:
                return [False] * len(also)
            found = [int(exists) == 1 for exists in self._client.batch_is_exist([*written.values(), *also])]
        gone = [sid for sid, exists in zip(written, found, strict=False) if not exists]
        if gone:
            with self._lock:
                for sample_id in gone:
                    entry = self._resident.get(sample_id)
                    if self._keys.get(sample_id) == written[sample_id] and entry is not None:
                        del self._keys[sample_id]
                        self._forget(entry.ref)
        return found[len(written) :]

    def _admit(self, ref: SampleRef) -> None:
        try:
            super()._admit(ref)
        except (MemoryError, ValueError):
            # The caps and the duplicate check count what Mooncake still holds of this instance's samples: a
            # refusal asks the master first (one call), so a put within the caps makes none.
            self._reconcile()
            super()._admit(ref)

    def health(self) -> StoreHealth:
        """The run's residency: this instance's samples and every other writer's, as the master sees them now.

        Counts what Mooncake still holds of every writer's record (at most one ``put`` per writer, still in
        flight, is missing from it), against this store's caps and watermarks. One master call (this
        instance's keys and the residency slots in one ``batch_is_exist``) while no other writer holds a slot,
        three when some do; no sample bytes move.
        """
        others = self._others_samples(self._reconcile(self._slots))
        own = super().health()
        resident = own.resident_bytes + sum(others.values())
        return dataclasses.replace(
            own,
            resident_bytes=resident,
            sample_count=own.sample_count + len(others),
            high_watermark_hit=self.high_watermark_bytes is not None and resident >= self.high_watermark_bytes,
            low_watermark_hit=resident <= self.low_watermark_bytes,
        )

    def is_resident(self, sample_id: str) -> bool:
        """Whether Mooncake holds a put of ``sample_id`` by any writer of the run (this one: from its counters)."""
        with self._lock:
            own = sample_id in self._keys
        if own:
            # A producer's own sample (the queue's check before every put) needs only its own objects' existence,
            # not the residency slots: one small master call instead of one over every slot plus the records.
            self._reconcile()
            if super().is_resident(sample_id):
                return True
        slot_exists = self._reconcile(self._slots)
        if super().is_resident(sample_id):
            return True
        start = len(self.namespace) + 1
        others = self._others_samples(slot_exists)
        return any(key[start:].rsplit(INCARNATION_SEP, 1)[0] == sample_id for key in others)

    def scrub(self, ref: SampleRef) -> None:
        """Remove ``ref``'s object, whichever instance wrote it; an ``OSError`` leaves it counted for a retry."""
        if ref.store_uri == self.store_uri:
            self._remove(self.object_key(ref), f"scrub sample {ref.sample_id!r}:")
            super().scrub(ref)

    def reclaim_orphans(self, held: Holds | None = None, *, force: bool = False, drained: bool = False) -> int:
        """Remove the objects of writers whose record has not beaten for ``orphan_grace`` seconds (past its own
        interval) that ``held`` -- a queue's answer, which its reaper passes -- says it holds neither pending,
        leased nor as a dead letter; return how many.

        For dedicated storage processes, whose segments outlive the producers writing into them: a producer
        killed between ``put`` and its enqueue leaves objects nothing names. Mooncake keeps no queued marker, so
        only a queue can tell such an object from a queued one: without ``held`` (or when it raises) nothing is
        freed. A dead writer's record goes once none of its objects is left. Writers' clocks must agree to well
        within ``orphan_grace``. Runs at most every ``orphan_interval`` seconds unless ``force``; each sweep
        reads the residency slots and records (the master calls ``health`` makes) and removes by object key, so
        a later put of the same id is never touched. ``drained`` (the queue is closed and drained): a record is
        dead once it missed its beat, without the grace period.
        """
        if held is None or not (force or drained or self._orphans.due(True)):
            return 0
        dead = self._dead_records(0.0 if drained else self._orphans.grace)
        if not dead:
            return 0
        start = len(self.namespace) + 1
        keys = [key for samples in dead.values() for key in samples]
        try:
            holding = held(sorted({key[start:].rsplit(INCARNATION_SEP, 1)[0] for key in keys}))
        except Exception as exc:
            logger.warning("%s: the queue could not say which orphans it holds (%r); they stay", self.store_uri, exc)
            return 0
        freed = 0
        for slot, samples in dead.items():
            left = [key for key in samples if key[start:].rsplit(INCARNATION_SEP, 1)[0] in holding]
            for key in samples:
                if key not in left:
                    self._remove(key, "reclaim orphan")
                    freed += 1
            if not left:  # the dead writer holds nothing any more: its record goes too
                with self._client_lock:
                    if not self._client_closed:
                        self._client.remove(slot, True)
        if freed:
            logger.info(
                "%s: reclaimed %d object(s) of writers that died before a queue took them", self.store_uri, freed
            )
        return freed

    def _dead_records(self, grace: float) -> dict[str, list[str]]:
        """Residency slot -> the object keys still held, of the other writers whose record has not beaten for its
        interval plus ``grace``."""
        with self._client_lock:
            if self._client_closed:
                return {}
            found = self._client.batch_is_exist(self._slots)
            taken = [slot for slot, exists in zip(self._slots, found, strict=True) if int(exists) == 1]
            others = [slot for slot in taken if slot != self._slot]
            blobs = self._client.get_batch(others) if others else []
        now, dead = time.time(), {}
        for slot, blob in zip(others, blobs, strict=True):
            record = self._beating(blob) if blob else None
            if record is not None and now - record[0] > record[1] + grace:
                dead[slot] = record[2]
        if not dead:
            return {}
        keys = [key for samples in dead.values() for key in samples]
        with self._client_lock:
            if self._client_closed:
                return {}
            held = {
                key for key, exists in zip(keys, self._client.batch_is_exist(keys), strict=True) if int(exists) == 1
            }
        return {slot: [key for key in samples if key in held] for slot, samples in dead.items()}

    @staticmethod
    def _beating(blob: bytes) -> tuple[float, float, list[str]] | None:
        """A record's last beat, its interval and its object keys; ``None`` for one without beats (never taken for
        a dead writer's) or unreadable."""
        try:
            record = json.loads(blob)
            return float(record["beat"]), float(record["every"]), [str(key) for key in record["samples"]]
        except (ValueError, KeyError, TypeError):
            return None

    def queued_samples(self) -> list[str]:
        """Ids of the samples this instance wrote that a queue still holds (Mooncake still has them)."""
        self._reconcile()
        with self._lock:
            return sorted(sid for sid, entry in self._resident.items() if entry.retained)

    def close(self, *, force: bool = False) -> None:
        """Free every sample this instance wrote that no queue holds and leave the cluster (idempotent).

        Samples a queue still holds live in this process's segment and would
        vanish with it (the trainer would find them lost), so ``close`` first
        waits up to ``close_timeout`` seconds for them to be scrubbed (the
        trainer acks them), then raises ``RuntimeError`` naming them, closing
        nothing: drain the queue first, or host the bytes in a dedicated
        storage process. ``force=True`` closes at once anyway (an aborted run:
        the queue dead-letters those samples as lost when they are leased); what
        of them lives in another process's segment stays counted by every
        instance's ``health`` under this writer's last record, until a queue's
        ``scrub`` frees it or, once no queue holds it, another instance's
        ``reclaim_orphans`` does (the record stops beating here).
        """
        give_up = time.monotonic() + self.close_timeout
        queued = [] if force else self.queued_samples()
        while queued and time.monotonic() < give_up:
            time.sleep(_CLOSE_POLL)
            queued = self.queued_samples()
        if queued:
            shown = ", ".join(repr(sid) for sid in queued[:5]) + (" ..." if len(queued) > 5 else "")
            raise RuntimeError(
                f"cannot close {self.store_uri}: after {self.close_timeout} s a queue still holds {len(queued)} "
                f"sample(s) this process wrote ({shown}), and their bytes would vanish with it; wait until the "
                "trainer acks them "
                "(queue.close() then wait for the drain), host the bytes in a dedicated storage process, or "
                "close(force=True) to drop them (the queue then dead-letters them as lost)"
            )
        self._beat_stop.set()
        super().close()
        self._pool.clear()
        with self._lock:
            retained = bool(self._resident)  # what a forced close left to the queue
        if retained:  # the last record names them, for the others' health and orphan sweeps
            self._publish()
        with self._client_lock:
            if self._client_closed:
                return
            self._client_closed = True
            if self._slot is not None and not retained:  # this writer holds nothing any more: its record goes too
                self._client.remove(self._slot, True)
        if self._owns_client:
            self._client.close()

"""Residency bookkeeping shared by the built-in stores: caps, handles, retain/scrub."""

from __future__ import annotations

import abc
import threading
import uuid
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, TypedDict

import torch

from featurestream.common.refs import FeatureSpec, SampleRef
from featurestream.stores.base import REF_FIELD_DEFAULTS, FeatureStore, StoreHandle, StoreHealth, new_handle_id

if TYPE_CHECKING:
    from typing_extensions import Unpack

DEFAULT_MAX_SAMPLES = 64
DEFAULT_MAX_BYTES = 256 * 1024 * 1024
DEFAULT_HIGH_WATERMARK = 192 * 1024 * 1024
DEFAULT_LOW_WATERMARK = 64 * 1024 * 1024
INCARNATION_SEP = "@"  # between a sample id and its put's incarnation in feature keys (and names derived from them)


class _Resident:
    __slots__ = ("handles", "nbytes", "ref", "retained")

    def __init__(self, ref: SampleRef, nbytes: int) -> None:
        self.ref = ref  # the incarnation this entry tracks: refs of other puts of the id never match it
        self.nbytes = nbytes
        self.handles: set[int] = set()
        self.retained = False


class StoreCaps(TypedDict, total=False):
    """The caps and watermarks every built-in store takes, as keywords (each defaults to ``DEFAULT_<NAME>``).

    ``max_samples`` / ``max_bytes``: a ``put`` that would exceed either raises ``MemoryError`` (``None``: no
    such cap; not both). ``high_watermark_bytes`` (default ``max_bytes``) / ``low_watermark_bytes`` (default 0):
    the band of ``health()``'s watermark flags, which the queues' backpressure follows.
    """

    max_samples: int | None
    max_bytes: int | None
    high_watermark_bytes: int | None
    low_watermark_bytes: int | None


def _resolve_caps(
    *,
    max_samples: int | None = DEFAULT_MAX_SAMPLES,
    max_bytes: int | None = DEFAULT_MAX_BYTES,
    high_watermark_bytes: int | None = DEFAULT_HIGH_WATERMARK,
    low_watermark_bytes: int | None = DEFAULT_LOW_WATERMARK,
) -> tuple[int | None, int | None, int | None, int]:
    """``StoreCaps`` checked, with the watermarks' defaults filled in: ``ValueError`` naming a bad value."""
    if max_samples is None and max_bytes is None:
        raise ValueError("max_samples and max_bytes cannot both be None: set at least one of max_samples / max_bytes")
    _check_cap("max_samples", max_samples)
    _check_cap("max_bytes", max_bytes)
    _check_cap("high_watermark_bytes", high_watermark_bytes)
    if low_watermark_bytes is not None and (
        isinstance(low_watermark_bytes, bool) or not isinstance(low_watermark_bytes, int) or low_watermark_bytes < 0
    ):
        raise ValueError(f"low_watermark_bytes must be a non-negative int or None, got {low_watermark_bytes!r}")
    high = high_watermark_bytes if high_watermark_bytes is not None else max_bytes
    low = low_watermark_bytes if low_watermark_bytes is not None else 0
    if high is not None and low >= high:
        raise ValueError(
            f"low_watermark_bytes ({low}) must be strictly less than high_watermark_bytes ({high}), "
            "or no band is left below the high watermark (high defaults to max_bytes, low to 0)"
        )
    return max_samples, max_bytes, high, low


def _check_cap(name: str, value: int | None) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
        raise ValueError(f"{name} must be a positive int or None, got {value!r}")


def feature_specs(tensors: Mapping[str, torch.Tensor]) -> dict[str, FeatureSpec]:
    """The spec of each tensor, in the mapping's order."""
    specs = {}
    for name, tensor in tensors.items():
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"feature {name!r} must be a torch.Tensor, got {type(tensor).__name__}")
        specs[name] = FeatureSpec(tuple(tensor.shape), tensor.dtype)
    return specs


def location(ref: SampleRef) -> str:
    """The key of ``ref``'s first feature: it names the put (the incarnation) that minted ``ref``."""
    return next(iter(ref.feature_keys.values()))


def check_spec(ref: SampleRef, name: str, tensor: torch.Tensor) -> None:
    """Raise ``RuntimeError`` when a stored tensor no longer matches its ref's spec."""
    spec = ref.feature_specs[name]
    if tuple(tensor.shape) != spec.shape or tensor.dtype != spec.dtype:
        raise RuntimeError(
            f"sample {ref.sample_id!r} feature {name!r} is stored as {tuple(tensor.shape)}/{tensor.dtype}, "
            f"but the ref says {spec.shape}/{spec.dtype}"
        )


class LedgerFeatureStore(FeatureStore):
    """A store whose residency lives in in-memory counters; subclasses hold the bytes.

    Subclasses implement ``_write`` / ``_load`` / ``_drop``; this class owns
    the lock, the caps, the handles, and the retain/scrub coupling with queues.

    Zero-copy options (defaults keep the reference's defensive copies):
    ``put(..., take_ownership=True)`` lets the store keep the caller's tensors
    (the caller must not touch them afterwards) and ``get(..., copy=False)``
    may return the stored tensors themselves (the caller must not mutate them).

    A store whose bytes other instances can also reach (``adopts_foreign =
    True``) lets ``get`` open handles on samples it did not write: they are
    tracked apart from its own residency (caps and ``health`` count only what
    this instance wrote) and freed through ``_drop_released`` on their last
    release.
    """

    adopts_foreign = False

    def __init__(self, store_uri: str, **caps: Unpack[StoreCaps]) -> None:
        unknown = sorted(set(caps) - set(StoreCaps.__annotations__))
        if unknown:
            raise TypeError(
                f"{type(self).__name__} got unexpected keyword argument(s) {', '.join(unknown)}; "
                f"its caps are {', '.join(StoreCaps.__annotations__)}"
            )
        self.store_uri = store_uri
        self.max_samples, self.max_bytes, self.high_watermark_bytes, self.low_watermark_bytes = _resolve_caps(**caps)
        self._lock = threading.Lock()
        self._resident: dict[str, _Resident] = {}
        self._foreign: dict[str, _Resident] = {}
        self._handles: dict[int, _Resident] = {}
        self._orphan_handles: list[int] = []
        self._resident_bytes = 0
        self._closed = False

    # -- subclass hooks ---------------------------------------------------
    @abc.abstractmethod
    def _write(self, sample_id: str, ref: SampleRef, tensors: Mapping[str, torch.Tensor], take_ownership: bool) -> None:
        """Persist the tensors of a newly admitted sample (``take_ownership``: they may be kept as they are)."""

    @abc.abstractmethod
    def _load(self, ref: SampleRef, device: torch.device | str | None, copy: bool) -> dict[str, torch.Tensor]:
        """The sample's tensors (private copies unless ``copy`` is false); ``KeyError`` when its bytes are gone."""

    @abc.abstractmethod
    def _drop(self, ref: SampleRef) -> None:
        """Free the bytes of ``ref``'s incarnation (scrubbed, closed, or released by its last handle)."""

    def _drop_scrubbed(self, ref: SampleRef) -> None:
        """Free the bytes of a sample ``scrub`` just forgot; a store whose ``scrub`` freed them first overrides it."""
        self._drop(ref)

    def _drop_released(self, ref: SampleRef) -> None:
        """Free a sample whose last handle here was released and that no queue here retains.

        Stores shared between processes override this to spare a sample a
        queue elsewhere still holds.
        """
        self._drop(ref)

    # -- contract ---------------------------------------------------------
    def put(
        self, sample_id: str, tensors: Mapping[str, torch.Tensor], *, take_ownership: bool = False, **fields: Any
    ) -> SampleRef:
        """``FeatureStore.put`` (the contract): ``fields`` are its ref metadata keywords (``run_id``,
        ``algorithm``, ``schema_version``, ``target_model_version``, ``draft_weight_version``, ``num_tokens``),
        with its defaults. ``ValueError`` for bad ids or duplicates, ``MemoryError`` over a cap."""
        unknown = sorted(set(fields) - set(REF_FIELD_DEFAULTS))
        if unknown:
            raise TypeError(
                f"{type(self).__name__}.put got unexpected keyword argument(s) {', '.join(unknown)}; "
                f"a ref's fields are {', '.join(REF_FIELD_DEFAULTS)}"
            )
        self._check_sample_id(sample_id)
        if not isinstance(tensors, Mapping) or not tensors:
            raise ValueError(f"sample {sample_id!r}: tensors must be a non-empty mapping of name -> tensor")
        specs = feature_specs(tensors)
        incarnation = self._mint_incarnation()  # tells this put's bytes apart from any other put of the same id
        ref = SampleRef(
            sample_id=sample_id,
            store_uri=self.store_uri,
            feature_keys={name: self._feature_key(sample_id, name, incarnation) for name in specs},
            feature_specs=specs,
            estimated_bytes=sum(spec.nbytes for spec in specs.values()),
            **{**REF_FIELD_DEFAULTS, **fields},
        )
        self._admit(ref)
        try:
            self._write(sample_id, ref, tensors, take_ownership)
        except BaseException:
            with self._lock:
                self._forget(ref)
            raise
        return ref

    def get(
        self, ref: SampleRef, device: torch.device | str | None = None, *, copy: bool = True
    ) -> tuple[dict[str, torch.Tensor], StoreHandle]:
        """Copies of ``ref``'s tensors plus the handle to release them with.

        ``copy=False`` is for a consumer that promises not to mutate what it
        gets: the store may then return its own tensors without copying.
        """
        handle_id = self._open_handle(ref)
        try:
            tensors = self._load(ref, device, copy)
        except BaseException:
            self._abandon_handle(handle_id)
            raise
        return tensors, StoreHandle(self, ref.sample_id, ref, handle_id)

    def release(self, handle: StoreHandle) -> None:
        """Drop ``handle``; the last release frees a sample no queue retains."""
        if handle.store is not self:
            raise ValueError(
                f"handle {handle.handle_id} of sample {handle.sample_id!r} belongs to another store: it was minted "
                f"by a different store ({getattr(handle.store, 'store_uri', handle.store)!r}), not {self.store_uri}"
            )
        with self._lock:
            entry = self._handles.pop(handle.handle_id, None)
            if entry is None or self._entry(entry.ref) is not entry:
                return  # a handle of an incarnation scrubbed since: it holds nothing of a later one
            entry.handles.discard(handle.handle_id)
            if entry.handles or entry.retained:
                return
            self._forget(entry.ref)
        self._drop_released(entry.ref)

    def retain(self, ref: SampleRef) -> None:
        """Keep ``ref``'s bytes until ``scrub``, whatever handles are released."""
        with self._lock:
            entry = self._entry(ref)
            if entry is not None:
                entry.retained = True

    def unretain(self, ref: SampleRef) -> None:
        """Forget a ``retain`` whose put was refused; the bytes stay until their last handle is released."""
        with self._lock:
            entry = self._entry(ref)
            if entry is not None:
                entry.retained = False

    def scrub(self, ref: SampleRef) -> None:
        """Free ``ref``'s bytes now; handles still out become no-ops to release."""
        with self._lock:
            entry = self._entry(ref)
            if entry is None and not self.adopts_foreign:
                return
            if entry is not None:
                self._orphan_handles.extend(entry.handles)
                self._forget(ref)
        # A shared store scrubs bytes it never tracked too: the queue's instance may not be the writer.
        self._drop_scrubbed(ref)

    def gc(self) -> int:
        """Forget handles of scrubbed samples that their holders never released."""
        with self._lock:
            orphans, self._orphan_handles = self._orphan_handles, []
            return sum(self._handles.pop(handle_id, None) is not None for handle_id in orphans)

    def health(self) -> StoreHealth:
        """Residency from counters: O(1), no I/O."""
        pooled = self._pool_bytes()
        with self._lock:
            resident = self._resident_bytes
            return StoreHealth(
                resident_bytes=resident,
                capacity_bytes=self.max_bytes or 0,
                sample_count=len(self._resident),
                high_watermark_hit=self.high_watermark_bytes is not None and resident >= self.high_watermark_bytes,
                low_watermark_hit=resident <= self.low_watermark_bytes,
                sample_capacity=self.max_samples or 0,
                pool_bytes=pooled,
            )

    def _pool_bytes(self) -> int:
        """What the store keeps faulted in for reuse (``StoreHealth.pool_bytes``); stores with a pool override it."""
        return 0

    def _pool_limit(self) -> int:
        """The most a pool of this store keeps besides one sample: its byte cap (the default cap without one)."""
        return self.max_bytes if self.max_bytes is not None else DEFAULT_MAX_BYTES

    def is_resident(self, sample_id: str) -> bool:
        with self._lock:
            return sample_id in self._resident

    def close(self) -> None:
        """Free every sample no queue holds (idempotent); later puts raise ``RuntimeError``, and so do gets of
        anything but a sample a queue still holds.

        A sample a queue holds (retained, not yet scrubbed) keeps its bytes, whatever handles are out: its
        consumers, in this process or another, still read it, and the queue's ``scrub`` frees it.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
            queued = {sample_id: entry for sample_id, entry in self._resident.items() if entry.retained}
            refs = [entry.ref for sample_id, entry in self._resident.items() if sample_id not in queued]
            for entry in queued.values():
                entry.handles.clear()
            self._resident = queued
            self._resident_bytes = sum(entry.nbytes for entry in queued.values())
            self._foreign.clear()
            self._handles.clear()
            self._orphan_handles.clear()
        for ref in refs:
            self._drop_released(ref)  # a shared store spares a sample a queue elsewhere holds

    # -- internals --------------------------------------------------------
    def _check_sample_id(self, sample_id: object) -> None:
        if not isinstance(sample_id, str) or not sample_id:
            raise ValueError(f"sample_id must be a non-empty str, got {sample_id!r}")

    def _mint_incarnation(self) -> str:
        """A fresh incarnation: 32 hex digits no other put ever gets (random; a store may make it name its writer)."""
        return uuid.uuid4().hex

    def _feature_key(self, sample_id: str, name: str, incarnation: str) -> str:
        """Where feature ``name`` of this put of ``sample_id`` lives; naming the put, it matches no other put's ref."""
        return f"{sample_id}{INCARNATION_SEP}{incarnation}/{name}"

    def _require_open(self, action: str) -> None:
        if self._closed:
            raise RuntimeError(f"cannot {action}: {type(self).__name__} {self.store_uri} is closed")

    def _admit(self, ref: SampleRef) -> None:
        with self._lock:
            self._require_open(f"put sample {ref.sample_id!r}")
            if ref.sample_id in self._resident:
                raise ValueError(f"sample {ref.sample_id!r} is already present in {self.store_uri}; ids must be unique")
            if self.max_samples is not None and len(self._resident) + 1 > self.max_samples:
                raise MemoryError(
                    f"sample {ref.sample_id!r} refused: the store holds {len(self._resident)} samples, "
                    f"at its sample-count cap max_samples={self.max_samples}"
                )
            if self.max_bytes is not None and self._resident_bytes + ref.estimated_bytes > self.max_bytes:
                raise MemoryError(
                    f"sample {ref.sample_id!r} ({ref.estimated_bytes} B) refused: with {self._resident_bytes} B "
                    f"resident it would exceed the byte cap max_bytes={self.max_bytes}"
                )
            self._resident[ref.sample_id] = _Resident(ref, ref.estimated_bytes)
            self._resident_bytes += ref.estimated_bytes

    def _entry(self, ref: SampleRef) -> _Resident | None:
        """The bookkeeping of ``ref``'s own incarnation, or ``None`` (an earlier or later put's entry never matches)."""
        entry = self._resident.get(ref.sample_id)
        if entry is not None and location(entry.ref) == location(ref):
            return entry
        return self._foreign.get(location(ref))

    def _forget(self, ref: SampleRef) -> None:
        entry = self._resident.get(ref.sample_id)
        if entry is not None and location(entry.ref) == location(ref):
            del self._resident[ref.sample_id]
            self._resident_bytes -= entry.nbytes
        else:
            self._foreign.pop(location(ref), None)

    def _abandon_handle(self, handle_id: int) -> None:
        """Forget the handle of a failed ``get``: a read that failed must never free the sample."""
        with self._lock:
            entry = self._handles.pop(handle_id, None)
            if entry is None or self._entry(entry.ref) is not entry:
                return
            entry.handles.discard(handle_id)
            key = location(entry.ref)
            if self._foreign.get(key) is entry and not entry.handles and not entry.retained:
                del self._foreign[key]  # bookkeeping only: the bytes are left to whoever holds them

    def _open_handle(self, ref: SampleRef) -> int:
        with self._lock:
            if self._closed and (ref.store_uri != self.store_uri or self._entry(ref) is None):
                self._require_open(f"get sample {ref.sample_id!r}")  # only what a queue holds is read after close
            if ref.store_uri != self.store_uri:
                raise KeyError(
                    f"sample {ref.sample_id!r} lives in {ref.store_uri}, which does not match this store's URI "
                    f"{self.store_uri}"
                )
            entry = self._entry(ref)
            if entry is None:
                if not self.adopts_foreign:
                    raise KeyError(
                        f"sample {ref.sample_id!r} is not resident in {self.store_uri} (in this incarnation)"
                    )
                # Written by another instance: ``_load`` raises KeyError if its bytes are gone.
                entry = self._foreign[location(ref)] = _Resident(ref, 0)
            handle_id = new_handle_id()
            entry.handles.add(handle_id)
            self._handles[handle_id] = entry
            return handle_id

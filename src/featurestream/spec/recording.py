"""Recording what a queue and its store did, for ``spec.trace``'s validation against ``spec/LeaseQueue.tla``.

``TraceRecorder`` is a queue ``tracer`` (every action, under the queue lock); ``TraceRecorder.wrap(store)``
returns a ``TracedStore`` that records the store calls producers and consumers make too.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

import torch

from featurestream.common.refs import SampleRef
from featurestream.core import events
from featurestream.stores.base import FeatureStore, StoreHandle, StoreHealth

__all__ = ["STORE_GET", "STORE_PUT", "STORE_RELEASE", "STORE_SCRUB", "Event", "TraceRecorder", "TracedStore"]

Event = tuple[str, Mapping[str, object]]

# The recorder's own events: store calls seen through TraceRecorder.wrap (fields: sample_id, handle_id).
STORE_PUT = "StorePut"
STORE_GET = "StoreGet"
STORE_RELEASE = "StoreRelease"
STORE_SCRUB = "StoreScrub"


class TraceRecorder:
    """A queue ``tracer``: records ``(action, fields)`` pairs, thread-safe.

    ``wrap(store)`` returns the store with its put/get/release/scrub recorded
    too: give the wrapped store to the queue AND to producers and consumers.
    ``observe_residency(store)`` appends a ``Resident`` event listing which
    samples seen so far are resident (plus the store's resident bytes when the
    store is wrapped); call it between operations (it reads ``is_resident``),
    e.g. after every step of a single-threaded test.
    """

    def __init__(self) -> None:
        # Reentrant: a wrapped store call holds it while the store acts, so store events are recorded
        # in the order the store performed them.
        self._lock = threading.RLock()
        self.events: list[Event] = []
        self._samples: dict[str, None] = {}
        self._wrapped = False

    def __call__(self, action: str, fields: Mapping[str, object]) -> None:
        with self._lock:
            self.events.append((action, dict(fields)))
            sample = fields.get("sample_id")
            if action in (events.PUT, STORE_PUT) and isinstance(sample, str):
                self._samples[sample] = None

    def wrap(self, store: FeatureStore) -> TracedStore:
        """``store`` with its put/get/release/scrub recorded in this trace."""
        with self._lock:
            self._wrapped = True
        return TracedStore(store, self)

    def observe_residency(self, store: FeatureStore) -> None:
        with self._lock:
            resident = sorted(s for s in self._samples if store.is_resident(s))
            fields: dict[str, object] = {"samples": resident}
            if self._wrapped:
                fields["resident_bytes"] = store.health().resident_bytes
            self.events.append((events.RESIDENT, fields))


class TracedStore(FeatureStore):
    """A ``FeatureStore`` that forwards every call to ``store`` and records put/get/release/scrub.

    Each recorded call runs under the recorder's lock, so the trace orders
    store calls as the store performed them; a call that raises is not
    recorded. Attributes other than the contract's are the wrapped store's.
    """

    def __init__(self, store: FeatureStore, recorder: TraceRecorder) -> None:
        if not isinstance(store, FeatureStore):
            raise TypeError(f"store must be a FeatureStore, got {type(store).__name__}")
        self._store = store
        self._recorder = recorder
        self.store_uri = store.store_uri

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def put(self, sample_id: str, tensors: Mapping[str, torch.Tensor], **options: Any) -> SampleRef:
        with self._recorder._lock:
            ref = self._store.put(sample_id, tensors, **options)
            self._recorder(STORE_PUT, {"sample_id": ref.sample_id})
        return ref

    def get(self, ref: SampleRef, device: torch.device | str | None = None, **options: Any) -> Any:
        with self._recorder._lock:
            tensors, handle = self._store.get(ref, device, **options)
            self._recorder(STORE_GET, {"sample_id": ref.sample_id, "handle_id": handle.handle_id})
        return tensors, handle

    def release(self, handle: StoreHandle) -> None:
        with self._recorder._lock:
            self._store.release(handle)
            self._recorder(STORE_RELEASE, {"sample_id": handle.sample_id, "handle_id": handle.handle_id})

    def scrub(self, ref: SampleRef) -> None:
        with self._recorder._lock:
            self._store.scrub(ref)
            self._recorder(STORE_SCRUB, {"sample_id": ref.sample_id})

    def retain(self, ref: SampleRef) -> None:
        self._store.retain(ref)

    def unretain(self, ref: SampleRef) -> None:
        self._store.unretain(ref)

    def gc(self) -> int:
        return self._store.gc()

    def health(self) -> StoreHealth:
        return self._store.health()

    def close(self) -> None:
        self._store.close()

    def is_resident(self, sample_id: str) -> bool:
        return self._store.is_resident(sample_id)

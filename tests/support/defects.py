"""Known defects re-introduced one at a time as test-only subclasses.

The reference's A-E (docs/design.md); the old backpressure rule (P); an ack
whose scrub fault un-settles the sample (S); a lost sample redelivered (L, the
spec's BugLostRedelivered); a store blind to incarnations on release (I).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from featurestream import Lease, LocalFeatureStore, SampleRef, SampleRefQueue, StoreHandle
from featurestream.backends.memory.queue import MemoryEngine
from featurestream.core.engine import Reaped


class RetainIgnoringStore(LocalFeatureStore):
    """A: the store ignores ``retain``, so a stale consumer's last release frees a queued sample."""

    def retain(self, ref: SampleRef) -> None:
        pass


class IncarnationBlindStore(LocalFeatureStore):
    """I: ``release`` finds the entry by sample id, so a stale handle of a scrubbed put frees a later put of the id."""

    def release(self, handle: StoreHandle) -> None:
        with self._lock:
            self._handles.pop(handle.handle_id, None)
            entry = self._resident.get(handle.sample_id)  # whichever put of the id is resident now
            if entry is None:
                return
            entry.handles.discard(handle.handle_id)
            if entry.handles or entry.retained:
                return
            self._forget(entry.ref)
        self._drop_released(entry.ref)


class UnretainingScrubStore(LocalFeatureStore):
    """B: a settled sample is only un-retained, so a crashed consumer's unreleased handle keeps its bytes."""

    def scrub(self, ref: SampleRef) -> None:
        with self._lock:
            entry = self._entry(ref)
            if entry is None:
                return
            entry.retained = False
            if entry.handles:
                return
            self._forget(ref)
        self._drop(ref)


class NoDedupQueue(SampleRefQueue):
    """C: no dedup window, so a re-put of an acked id is accepted and delivered again.

    As in the reference, a put does not ask the store whether the bytes are still there either (the spec's
    BugNoDedup accepts the re-put whatever the store holds).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["dedup_window"] = 0
        super().__init__(*args, **kwargs)

    def _check_resident(self, ref: SampleRef) -> None:
        pass


class NoDeliveryLimitQueue(SampleRefQueue):
    """D: no delivery limit: a poison sample is redelivered forever."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["max_deliveries"] = 2**31
        super().__init__(*args, **kwargs)


class _NoReaperEngine(MemoryEngine):
    reaping = False

    def _reap_due(self) -> int:
        return super()._reap_due() if self.reaping else 0


class NoReaperQueue(SampleRefQueue):
    """E: only an explicit ``reclaim_expired()`` reclaims; ordinary calls leave expired leases live."""

    _engine_class = _NoReaperEngine
    _engine: _NoReaperEngine

    def reclaim_expired(self) -> int:
        self._engine.reaping = True
        try:
            return super().reclaim_expired()
        finally:
            self._engine.reaping = False


class _OldBackpressureEngine(MemoryEngine):
    def reap(self) -> Reaped:
        # As if the queue always held a sample: the paused producer's exception never applies.
        return dataclasses.replace(super().reap(), holds=True)


class OldBackpressureQueue(SampleRefQueue):
    """P: a paused producer waits even when the queue holds nothing, so producers' own bytes can block them for good."""

    _engine_class = _OldBackpressureEngine


class _UnsettlingEngine(MemoryEngine):
    outcome = ""

    def _release_hold(self, sample_id: str, outcome: str) -> None:
        del self._held[sample_id]
        self.outcome = outcome


class UnsettlingScrubQueue(SampleRefQueue):
    """S (as first reported): a scrub fault raises out of ``ack`` before the id is recorded as settled."""

    _engine_class = _UnsettlingEngine
    _engine: _UnsettlingEngine

    def _scrub(self, ref: SampleRef) -> None:
        self._store.scrub(ref)  # raises out of ack / fail / the reaping call: the id below is never recorded
        self._engine._recent_terminal[ref.sample_id] = self._engine.outcome
        self._not_full.notify_all()


class CountingGiveBackQueue(SampleRefQueue):
    """G: a lease handed back unused is failed back, spending one of ``max_deliveries`` (the loader's close did so)."""

    def give_back_many(self, leases: Any) -> None:
        self.fail_many(leases)


class LostRedeliveringQueue(SampleRefQueue):
    """L: ``lose`` fails the lease like any error, so bytes no redelivery can serve are delivered again."""

    def lose(self, lease: Lease) -> bool:
        return self._settle("fail", [lease])[0]


class RejectAckingQueue(SampleRefQueue):
    """U: ``reject`` acks the sample its schema refused, so it is counted as trained."""

    def reject(self, lease: Lease, why: str) -> bool:
        return self._settle("ack", [lease])[0]

"""``MachineState``: what the stateful test observed of the queue and store, and the plumbing every action shares.

The records (``SampleRecord``, ``ConsumerRecord``, ``ProducerRecord``) follow what the implementation *did*, seen
through its public API; ``MachineState`` owns them with the spec mirror and offers what each action needs: who
holds a lease or handle, which leases are due, the store-call log and the mirror's residency kept in step with
it, and ``_reaping_call`` (one queue call that reaps first, checked against the mirror). The actions are mixins
over it: ``producing.ProducerActions``, ``consuming.ConsumerActions``, ``world.WorldActions``; ``machine.QueueMachine``
builds the state and mixes them.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
from collections.abc import Callable, Collection
from typing import Any

from featurestream.common.refs import SampleRef
from featurestream.core.lease import Lease
from featurestream.core.machines import HELD, SETTLED
from featurestream.core.protocol import LeaseQueue
from featurestream.spec.mirror import LeaseToken, SpecMirror
from featurestream.spec.recording import TraceRecorder
from featurestream.stores.base import FeatureStore, StoreHandle
from featurestream.testing.clock import FakeClock
from featurestream.testing.config import MachineConfig
from featurestream.testing.faults import FailsOver, FaultyStore, LosesReplies
from featurestream.testing.invariants import QueueInvariants
from featurestream.testing.producers import BlockedPut
from featurestream.testing.report import InjectedCallbackError

__all__ = ["ConsumerRecord", "MachineState", "ProducerRecord", "SampleRecord"]


@dataclasses.dataclass
class SampleRecord:
    """What the implementation did with one sample, as observed through its public API."""

    index: int
    ref: SampleRef
    status: str = "stored"  # stored | pending | leased | acked | dead
    live: Lease | None = None
    deadline: float = 0.0  # the live lease's deadline, from the fake clock and the visibility timeout chosen here
    deliveries: int = 0  # leases of this sample that were failed or reclaimed
    acks: int = 0


@dataclasses.dataclass
class ConsumerRecord:
    """One consumer's leases and store handles; ``generation`` moves on at each crash (what it held is gone)."""

    generation: int = 0
    leases: list[Lease] = dataclasses.field(default_factory=list)
    handles: dict[str, StoreHandle] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class ProducerRecord:
    """A producer blocked in ``put_blocks_until_below`` on its own thread."""

    put: BlockedPut
    was: str  # the sample's status when the put started
    waited: bool = False  # a round of it found the queue paused and waited


class MachineState(QueueInvariants):
    """The state ``QueueMachine.__init__`` builds, and the plumbing the action mixins share."""

    config: MachineConfig
    clock: FakeClock
    trace: TraceRecorder
    inner: FeatureStore  # the store itself: the kit's own observations, never faulted or traced
    store: FaultyStore  # what the queue uses: faults armed by the rules, every call traced
    queue: LeaseQueue
    replies: LosesReplies | None
    failovers: FailsOver | None
    mirror: SpecMirror
    samples: dict[str, SampleRecord]
    pending: collections.deque[str]
    consumers: dict[str, ConsumerRecord]
    producers: dict[str, ProducerRecord]
    callback_mode: str
    closed: bool
    owed: set[str]
    owed_unretain: set[str]

    def _observe_residency(self) -> None:
        """Add the store's resident set to the trace, for trace validation (stores with ``is_resident``)."""
        if self._resident_check is not False and self.samples:
            if self._is_resident(next(iter(self.samples))) is not None:
                self.trace.observe_residency(self.inner)

    def _alive(self, owner_of: object) -> str | None:
        """The consumer that holds ``owner_of``, or ``None`` when it crashed since."""
        consumer, generation = self._owner[id(owner_of)]
        return consumer if self.consumers[consumer].generation == generation else None

    def _token(self, lease: Lease) -> LeaseToken:
        """The spec's name of ``lease``: ``(sample, redelivery_count)``. A lease given back names nothing its
        holder holds any more (the same name may be live again, leased anew): ``-1``, as a forged one."""
        return lease.ref.sample_id, -1 if id(lease) in self._given_back else lease.redelivery_count

    def _own(self, consumer: str, thing: object) -> None:
        self._owner[id(thing)] = (consumer, self.consumers[consumer].generation)
        self._keep.append(thing)

    def _holding(self, samples: Collection[str] | None = None) -> bool:
        """Whether some live consumer holds a lease (stale or live; of one of ``samples`` when given)."""
        if samples is None:
            return any(c.leases for c in self.consumers.values())
        return any(lease.ref.sample_id in samples for c in self.consumers.values() for lease in c.leases)

    def _drop_lease(self, consumer: str, lease: Lease) -> None:
        # by identity: a forged copy compares equal to the lease it copies
        leases = self.consumers[consumer].leases
        leases[:] = [held for held in leases if held is not lease]

    def _held_count(self) -> int:
        return sum(1 for s in self.samples.values() if s.status in HELD)

    def _due(self) -> list[SampleRecord]:
        """Samples whose live lease is past the deadline this test computed, in the order the reaper takes them."""
        now = self.clock.now
        due = [s for s in self.samples.values() if s.live is not None and s.deadline <= now]
        return sorted(due, key=lambda s: (s.deadline, s.live.lease_id))  # type: ignore[union-attr]

    def _requeue(self, sample: SampleRecord, dead: bool) -> None:
        sample.live = None
        sample.deliveries += 1
        if dead:
            sample.status = "dead"
        else:
            sample.status = "pending"
            self.pending.append(sample.ref.sample_id)

    def _callback(self, seen: list[Any], argument: Any) -> None:
        """A queue callback: record, then (by ``callback_mode``) raise or call the queue back from another thread.

        A re-entrant call runs on a helper thread with a bound, so a queue that runs callbacks under its
        lock is reported instead of deadlocking the test.
        """
        seen.append(argument)
        if self.callback_mode == "raise":
            raise InjectedCallbackError("a callback that raises (the queue must log it and carry on)")
        if self.callback_mode == "reenter":
            helper = threading.Thread(target=self.queue.pending_count, name="reentrant-callback", daemon=True)
            helper.start()
            helper.join(self.config.bound)
            if helper.is_alive():
                self._note("inv15_callbacks", "a callback calling the queue back blocked: it runs under the lock")

    def _sync_store(self, upto: int | None = None) -> None:
        """Account for the store calls made since last time (before log position ``upto``, default: all of them).

        Which scrubs (unretains) failed or went through; the mirror's residency follows.
        """
        log = self.store.log
        seen, self._log_seen = self._log_seen, max(self._log_seen, len(log) if upto is None else upto)
        for call, sample_id, ok in log[seen : self._log_seen]:
            owed = {"scrub": self.owed, "unretain": self.owed_unretain}.get(call)
            if owed is not None and sample_id is not None:
                (owed.discard if ok else owed.add)(sample_id)
        self._align_mirror()

    def _align_mirror(self) -> None:
        """Keep a settled sample whose scrub is owed resident (and retained) in the mirror, which has no faults.

        The mirror freed it when it settled; the store still holds it until the queue's retry goes through.
        """
        st = self.mirror.state
        owed = self.owed - self.store.lost()  # a lost sample's owed scrub holds nothing: its bytes are gone
        for sample_id, sample in self.samples.items():
            if sample.status not in SETTLED:
                continue
            s, size = sample.index, sample.ref.estimated_bytes
            if sample_id in owed and s not in st.resident:
                st = st._replace(
                    resident=st.resident | {s}, retained=st.retained | {s}, resident_bytes=st.resident_bytes + size
                )
            elif sample_id not in owed and s in st.resident:
                hcount = (*st.hcount[:s], 0, *st.hcount[s + 1 :])
                st = st._replace(
                    resident=st.resident - {s},
                    retained=st.retained - {s},
                    hcount=hcount,
                    resident_bytes=st.resident_bytes - size,
                )
        self.mirror.state = st

    def _faulted(self, since: int, *calls: str) -> bool:
        """Whether one of ``calls`` raised an injected fault in the store log after position ``since``."""
        return any(not ok and call in calls for call, _, ok in self.store.log[since:])

    def _reaping_call(
        self, what: str, call: Callable[[], Any], store_errors_ok: bool = False
    ) -> tuple[Any, BaseException | None, set[str]]:
        """Run one queue call that reaps first; observe what it reclaimed; return (result, error, new dead ids).

        The mirror reclaims the same expired leases, in the implementation's order. A store error
        raised out of the call is a violation unless ``store_errors_ok`` (a put's own retain or health).
        """
        due = self._due()
        self.mirror.reclaim_expired([s.ref.sample_id for s in due])
        before = self.queue.stats().reclaimed
        dead_before = len(self.queue.dead_letters())
        result: Any = None
        error: BaseException | None = None
        try:
            result = call()
        except (ValueError, RuntimeError, KeyError, TypeError, OSError) as exc:
            error = exc
        if isinstance(error, OSError) and not store_errors_ok:
            # Reported at once: what the queue did after the escaped error is no longer worth comparing.
            self._fail("inv14_store_faults_survivable", f"{what} raised the store's error {error!r}")
        new_dead = {d.ref.sample_id for d in self.queue.dead_letters()[dead_before:]}
        reclaimed = self.queue.stats().reclaimed - before
        if reclaimed == len(due):
            for sample in due:
                self._requeue(sample, sample.ref.sample_id in new_dead)
        elif reclaimed == 0:
            late = [f"{s.ref.sample_id} (deadline {s.deadline}, now {self.clock.now})" for s in due]
            self._note("inv10_expired_leases_reclaimed", f"{what} left expired leases live: {', '.join(late)}")
        else:
            raise AssertionError(f"{what} reclaimed {reclaimed} leases, expected the {len(due)} past their deadline")
        self._observe_residency()
        return result, error, new_dead

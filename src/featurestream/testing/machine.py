"""The stateful test: the spec's actions applied to a queue + store and to the spec mirror, step by step.

``QueueMachine`` holds the actions (its invariants are ``featurestream.testing.invariants``); ``make_queue_machine``
(``featurestream.testing.rules``) binds them to Hypothesis rules for a given
store/queue factory and returns a ``RuleBasedStateMachine`` subclass whose
``TestCase`` runs under pytest or unittest. Every rule applies one action to
the implementation and to ``featurestream.spec.mirror.SpecMirror``; the
bookkeeping here follows what the implementation *did* (observed through its
public API), the mirror says what the spec *allows*.

The machine also drives the world around the queue: the store is wrapped in a
``FaultyStore`` whose calls the rules make fail (one-shot or until cleared)
and that loses a queued sample's bytes,
blocked producers run ``put_blocks_until_below`` on real threads
(``BlockedPut``), consumers crash, the ``FakeClock`` jumps, and the queue's
callbacks record, raise, or call the queue back. The kit's own oracle covers
what the mirror does not model yet (store faults, the producer rule): a
settled sample whose scrub failed stays resident until the queue's retry
goes through, and the mirror's residency is aligned to that.

After every step the named invariants ``inv01`` ... ``inv16`` check the
invariants 1-9 and 11-13 of docs/design.md, bounded reaping (the safety side of 10), the
counters, agreement with the mirror, producer progress, survivable store
faults, the callbacks, and that incarnations of an id never cross. A failure raises ``InvariantViolation`` naming the
invariant, and Hypothesis prints the shrunk sequence of rules.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import threading
from collections.abc import Callable
from typing import Any

from hypothesis.stateful import RuleBasedStateMachine

from featurestream.common.errors import LeaseLost, QueueClosed
from featurestream.common.refs import SampleRef
from featurestream.core import events
from featurestream.core.lease import LOST_REASON, Lease, VisibilityTimeout
from featurestream.core.machines import HELD, SETTLED
from featurestream.core.protocol import LeaseQueue
from featurestream.core.queue import SampleRefQueue
from featurestream.spec.mirror import SpecConstants, SpecMirror
from featurestream.spec.trace import TraceRecorder
from featurestream.stores.base import FeatureStore, SampleLostError, StoreHandle, StoreHealth
from featurestream.testing.clock import FakeClock
from featurestream.testing.faults import FaultyStore, InjectedFault, LosesReplies
from featurestream.testing.invariants import InvariantViolation, QueueInvariants, same_tensors
from featurestream.testing.producers import BlockedPut
from featurestream.testing.report import InjectedCallbackError, quiet_injected_faults
from featurestream.testing.samples import sample_tensors

__all__ = ["BOUND", "CALLBACK_MODES", "InvariantViolation", "MachineConfig", "QueueMachine"]

CALLBACK_MODES = ("record", "raise", "reenter")
BOUND = 10.0  # seconds a producer round or a re-entrant callback gets: a hang fails an invariant, not the suite


@dataclasses.dataclass(frozen=True)
class MachineConfig:
    """Bounds of the stateful test (small on purpose: bugs live in interleavings, not in sizes).

    Sample ``i`` is ``sample_tensors(i)`` (40 * (i + 1) bytes); the watermarks are
    in bytes and passed to the queue as ``high_watermark_bytes``/``low_watermark_bytes``.
    ``producers`` bounds the blocked puts in flight at once (each on its own
    thread); a woken blocked put gets ``producer_rounds`` rounds to enqueue or
    give up once the queue lets it (the bounded-progress check).
    ``store_faults=False`` keeps the store healthy (for traces of a spec
    without faults). ``store_losses`` bounds how many queued samples the store
    may lose in one run (the spec's ``MaxLosses``; 0 for traces, whose spec
    has no lost bytes).
    """

    samples: int = 4
    consumers: int = 2
    max_deliveries: int = 2
    visibility_timeout: float = 10.0
    high_watermark_bytes: int = 200
    low_watermark_bytes: int = 80
    dedup_window: int = 1000
    sample_tokens: int | None = None  # every sample this many tokens (one size, as trace validation needs)
    producers: int = 2
    producer_rounds: int = 3
    store_faults: bool = True
    store_losses: int = 1

    def __post_init__(self) -> None:
        for name in ("samples", "consumers", "max_deliveries", "dedup_window", "producers"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"MachineConfig.{name} must be an int >= 1, got {value!r}")
        losses = self.store_losses
        if isinstance(losses, bool) or not isinstance(losses, int) or losses < 0:
            raise ValueError(f"MachineConfig.store_losses must be an int >= 0, got {losses!r}")
        rounds = self.producer_rounds
        if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 2:
            raise ValueError(f"MachineConfig.producer_rounds must be an int >= 2, got {rounds!r}")
        VisibilityTimeout(self.visibility_timeout)  # validates
        if not 0 <= self.low_watermark_bytes < self.high_watermark_bytes:
            raise ValueError(
                f"MachineConfig watermarks need 0 <= low < high, got low={self.low_watermark_bytes!r} "
                f"high={self.high_watermark_bytes!r}"
            )

    @property
    def sample_ids(self) -> tuple[str, ...]:
        return tuple(f"s{i}" for i in range(self.samples))

    @property
    def consumer_ids(self) -> tuple[str, ...]:
        return tuple(f"c{i}" for i in range(self.consumers))


@dataclasses.dataclass
class _Sample:
    """What the implementation did with one sample, as observed through its public API."""

    index: int
    ref: SampleRef
    status: str = "stored"  # stored | pending | leased | acked | dead
    live: Lease | None = None
    deadline: float = 0.0  # the live lease's deadline, from the fake clock and the visibility timeout chosen here
    deliveries: int = 0  # leases of this sample that were failed or reclaimed
    acks: int = 0


@dataclasses.dataclass
class _Consumer:
    generation: int = 0
    leases: list[Lease] = dataclasses.field(default_factory=list)
    handles: dict[str, StoreHandle] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class _Producer:
    put: BlockedPut
    was: str  # the sample's status when the put started
    waited: bool = False  # a round of it found the queue paused and waited


class QueueMachine(QueueInvariants, RuleBasedStateMachine):
    """Actions and invariants; ``make_queue_machine`` binds them to rules.

    Subclasses (or the factory) provide ``make_store()`` and ``make_queue(store, **hooks)``.
    The queue must accept ``visibility_timeout=, high_watermark_bytes=,
    low_watermark_bytes=, on_pause=, on_resume=, max_deliveries=, dedup_window=,
    on_dead_letter=, clock=, tracer=`` and implement ``featurestream.core.protocol.LeaseQueue``.
    """

    config: MachineConfig = MachineConfig()
    # Given for a backend whose replies can be lost (``make_queue_machine(replies=)``): the queue's reply faults.
    replies_of: Callable[[LeaseQueue], LosesReplies] | None = None

    def make_store(self) -> FeatureStore:
        raise NotImplementedError("pass store_factory= to make_queue_machine or override make_store()")

    def make_queue(self, store: FeatureStore, **hooks: Any) -> LeaseQueue:
        return SampleRefQueue(store, **hooks)

    def __init__(self) -> None:
        super().__init__()
        cfg = self.config
        self.clock = FakeClock()
        self.trace = TraceRecorder()
        self.inner = self.make_store()  # the kit's own observations go here, never through the faults or the trace
        # The store calls that reach the store are traced (StorePut ...): trace validation then knows every
        # resident byte, also of samples stored but not yet put, which backpressure counts.
        self.store = FaultyStore(self.trace.wrap(self.inner))
        self.callback_mode = "record"
        self.dead_seen: list[str] = []
        self.pause_seen: list[StoreHealth] = []
        self.resume_seen: list[StoreHealth] = []
        self.queue = self.make_queue(
            self.store,
            visibility_timeout=VisibilityTimeout(cfg.visibility_timeout),
            high_watermark_bytes=cfg.high_watermark_bytes,
            low_watermark_bytes=cfg.low_watermark_bytes,
            on_pause=lambda health: self._callback(self.pause_seen, health),
            on_resume=lambda health: self._callback(self.resume_seen, health),
            max_deliveries=cfg.max_deliveries,
            dedup_window=cfg.dedup_window,
            on_dead_letter=lambda dead: self._callback(self.dead_seen, dead.ref.sample_id),
            clock=self.clock,
            tracer=self.trace,
        )
        self.replies = None if self.replies_of is None else self.replies_of(self.queue)
        self.mirror = SpecMirror(
            SpecConstants(
                samples=cfg.sample_ids,
                consumers=cfg.consumer_ids,
                max_deliveries=cfg.max_deliveries,
                high_watermark=cfg.high_watermark_bytes,
                low_watermark=cfg.low_watermark_bytes,
                max_held=None,
                max_losses=cfg.store_losses,
            )
        )
        self.samples: dict[str, _Sample] = {}
        self.pending: collections.deque[str] = collections.deque()
        self.consumers = {c: _Consumer() for c in cfg.consumer_ids}
        self.producers: dict[str, _Producer] = {}
        self.woken_puts = 0  # blocked puts that waited, were woken and enqueued: how far a run got, for coverage checks
        self.stale_ops: collections.Counter[str] = collections.Counter()  # stale ops that met a later put, by op
        self.closed = False
        self.finished = False
        self.owed: set[str] = set()  # settled samples whose scrub raised and has not gone through since
        self.owed_unretain: set[str] = set()  # refused puts whose unretain raised and has not gone through since
        self._log_seen = 0  # how much of the FaultyStore's call log has been accounted for
        self._owner: dict[int, tuple[str, int]] = {}  # id(lease or handle) -> (consumer, generation)
        self._keep: list[object] = []  # keeps leases/handles alive so id() stays unique
        self._forged_ids = itertools.count(2**30)  # never issued here; below TLC's 2**31 int limit
        self._init_invariants()
        quiet_injected_faults(True, type(self))  # until teardown: logs of the faults injected here are noise

    # -- plumbing ---------------------------------------------------------------
    def _observe_residency(self) -> None:
        """Add the store's resident set to the trace, for trace validation (stores with ``is_resident``)."""
        if self._resident_check is not False and self.samples:
            if self._is_resident(next(iter(self.samples))) is not None:
                self.trace.observe_residency(self.inner)

    def _alive(self, owner_of: object) -> str | None:
        """The consumer that holds ``owner_of``, or ``None`` when it crashed since."""
        consumer, generation = self._owner[id(owner_of)]
        return consumer if self.consumers[consumer].generation == generation else None

    def _own(self, consumer: str, thing: object) -> None:
        self._owner[id(thing)] = (consumer, self.consumers[consumer].generation)
        self._keep.append(thing)

    def _holding(self) -> bool:
        """Whether some live consumer holds a lease (stale or live)."""
        return any(c.leases for c in self.consumers.values())

    def _drop_lease(self, consumer: str, lease: Lease) -> None:
        # by identity: a forged copy compares equal to the lease it copies
        leases = self.consumers[consumer].leases
        leases[:] = [held for held in leases if held is not lease]

    def _held_count(self) -> int:
        return sum(1 for s in self.samples.values() if s.status in HELD)

    def _due(self) -> list[_Sample]:
        """Samples whose live lease is past the deadline this test computed, in the order the reaper takes them."""
        now = self.clock.now
        due = [s for s in self.samples.values() if s.live is not None and s.deadline <= now]
        return sorted(due, key=lambda s: (s.deadline, s.live.lease_id))  # type: ignore[union-attr]

    def _requeue(self, sample: _Sample, dead: bool) -> None:
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
            helper.join(BOUND)
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

    # -- actions (each is one spec action) -----------------------------------------
    def do_produce(self, sample_id: str) -> None:
        """StorePut: the producer writes the sample's tensors into the store (an injected fault stores nothing)."""
        if sample_id in self.samples:
            return
        index = self.config.sample_ids.index(sample_id)
        try:
            ref = self.store.put(sample_id, sample_tensors(index, self.config.sample_tokens), run_id="machine")
        except InjectedFault:
            return
        self.samples[sample_id] = _Sample(index, ref)
        self.mirror.store_put(sample_id, ref.estimated_bytes)

    def _mirror_put(self, sample_id: str) -> None:
        status = self.mirror.status(sample_id)
        if status == "stored":
            self.mirror.put(sample_id)
        elif status in SETTLED:
            self.mirror.reput(sample_id)

    def do_put(self, sample_id: str, blocking: bool) -> None:
        """Put / Reput; ``blocking``: a producer thread enters ``put_blocks_until_below`` and stays until it can.

        A sample not produced yet is first written to the store (StorePut).
        """
        self.do_produce(sample_id)
        sample = self.samples.get(sample_id)
        if sample is None or sample_id in self.producers:
            return
        if blocking:
            producer = _Producer(BlockedPut(self.queue, sample.ref, BOUND), sample.status)
            if not producer.put.start():
                self._note("inv13_producer_progress", f"put_blocks_until_below({sample_id!r}) never started")
                return
            self.producers[sample_id] = producer
            self.do_wake(sample_id)
            return
        was = sample.status
        puts_before = self.queue.stats().put
        log_at = len(self.store.log)
        _, error, _ = self._reaping_call(f"put({sample_id!r})", lambda: self.queue.put(sample.ref), True)
        accepted = self.queue.stats().put - puts_before == 1
        if accepted:
            self._mirror_put(sample_id)
        elif not self._faulted(log_at, "retain"):
            self._mirror_put(sample_id)  # refused by the queue itself: the mirror refuses (or counts) it too
        self._put_outcome(sample_id, was, accepted, error, log_at)

    def do_put_many(self, sample_ids: list[str]) -> None:
        """Put a batch (``put_many``) of samples stored and not put yet: every one, in order, or none.

        A sample not produced yet is first written to the store (StorePut); one a blocked producer is putting
        stays out of the batch.
        """
        for sample_id in sample_ids:
            self.do_produce(sample_id)
        stored = [self.samples[i] for i in sample_ids if i in self.samples and i not in self.producers]
        batch = [sample for sample in stored if sample.status == "stored"]
        if not batch:
            return
        ids = [sample.ref.sample_id for sample in batch]
        before = self.queue.stats().put
        log_at = len(self.store.log)
        call = lambda: self.queue.put_many([sample.ref for sample in batch])  # noqa: E731
        _, error, _ = self._reaping_call(f"put_many({ids})", call, True)
        put = self.queue.stats().put - before
        if put not in (0, len(batch)):
            self._note("inv11_counters_consistent", f"put_many({ids}) put {put} of them: all or none")
        accepted = put == len(batch)
        for sample_id in ids:
            if accepted or not self._faulted(log_at, "retain"):
                self._mirror_put(sample_id)
            self._put_outcome(sample_id, "stored", accepted, error, log_at)

    def _put_outcome(self, sample_id: str, was: str, accepted: bool, error: object, log_at: int) -> None:
        """Check a finished put against the contract and record what it did."""
        sample = self.samples[sample_id]
        faulted = self._faulted(log_at, "retain", "health")
        if accepted:
            if was in SETTLED:
                self._note("inv02_exactly_once", f"re-put of {was} sample {sample_id!r} was accepted")
            elif was in HELD:
                self._note("inv02_exactly_once", f"put of {sample_id!r} accepted while it is already {was}")
            if self.closed:
                self._note("inv09_close_drain", f"put of {sample_id!r} accepted after close()")
            sample.status = "pending"
            sample.deliveries = 0
            self.pending.append(sample_id)
            self._sync_store()  # failed retries of this very call first: then the successful retain wins
            self.owed_unretain.discard(sample_id)  # the queue forgets an owed unretain once it retains again
        elif isinstance(error, OSError):
            if not faulted:
                self._note("inv14_store_faults_survivable", f"put of {sample_id!r} raised {error!r}, no store fault")
        elif was == "stored" and not self.closed and not isinstance(error, RuntimeError):
            self._note("inv11_counters_consistent", f"put of stored sample {sample_id!r} refused: {error!r}")
        elif was != "stored" and not isinstance(error, (ValueError, RuntimeError)):
            self._note("inv11_counters_consistent", f"re-put of {was} {sample_id!r} raised {error!r}")
        if isinstance(error, QueueClosed) and not self.closed:
            self._note("inv09_close_drain", f"put of {sample_id!r} refused as closed on an open queue")

    def do_wake(self, sample_id: str) -> None:
        """A blocked put is woken: it gets up to ``producer_rounds`` rounds, and must finish unless it may wait.

        It may wait only while open, paused, and the queue holds a sample (pending or leased): then
        settling that sample can lower residency. Anything else is a producer that could block for good.
        """
        for _ in range(self.config.producer_rounds):
            if sample_id not in self.producers or not self._producer_round(sample_id):
                return
        self._note(
            "inv13_producer_progress",
            f"put_blocks_until_below({sample_id!r}) kept changing state for {self.config.producer_rounds} rounds",
        )

    def _producer_round(self, sample_id: str) -> bool:
        """Let one round of the blocked put through; ``True`` when another round may do more."""
        producer = self.producers[sample_id]
        bp_before = self.queue.backpressure_state
        pauses_before = self.queue.stats().producer_pauses
        puts_before = self.queue.stats().put
        log_at = len(self.store.log)

        def one_round() -> bool:
            came_back = producer.put.step()
            if isinstance(producer.put.outcome, OSError) and not self._faulted(log_at, "retain", "health"):
                raise producer.put.outcome  # a store error that is not the put's own: reported as escaped
            return came_back

        came_back, _, _ = self._reaping_call(f"a round of put_blocks_until_below({sample_id!r})", one_round)
        if not came_back:
            self._note("inv13_producer_progress", f"a round of put_blocks_until_below({sample_id!r}) hung")
            return False
        held = self._held_count()  # what the round saw after reaping (its own sample is not counted yet)
        # The round decided on its health() read; the kit's own calls since (stats() ...) may have paid an owed
        # scrub that read counted. So the spec judges the residency of the store calls up to that read.
        reads = [n for n in range(log_at, len(self.store.log)) if self.store.log[n][0] == "health"]
        self._sync_store(upto=reads[-1] + 1 if reads else None)
        bp_after = self.queue.backpressure_state
        if bp_after != bp_before:
            spec = self.mirror.update_backpressure()
            if spec != ("Pause" if bp_after == "paused" else "Resume"):
                self._note("inv12_agrees_with_spec_mirror", f"backpressure {bp_before} -> {bp_after}, the spec: {spec}")
        self._sync_store()
        self._observe_backpressure(bp_before, pauses_before)
        outcome = producer.put.outcome
        if outcome is None:
            if bp_after != bp_before:
                return True  # the round moved the hysteresis; the next one decides
            may_wait = not self.closed and bp_after == "paused" and held > 0
            if not may_wait:
                self._note(
                    "inv13_producer_progress",
                    f"put_blocks_until_below({sample_id!r}) waits although it could go on: closed={self.closed}, "
                    f"backpressure {bp_after}, {held} samples pending or leased",
                )
            producer.waited = True
            return False
        del self.producers[sample_id]
        accepted = outcome == "enqueued"
        if accepted and producer.waited:
            self.woken_puts += 1
        if accepted and bp_after == "paused" and held > 0:
            self._note(
                "inv08_backpressure_hysteresis",
                f"a paused put of {sample_id!r} enqueued while the queue held {held} samples",
            )
        if accepted != (self.queue.stats().put - puts_before == 1):
            self._note("inv11_counters_consistent", f"put_blocks_until_below({sample_id!r}) {outcome!r} vs stats()")
        if accepted or not self._faulted(log_at, "retain", "health"):
            if accepted or not isinstance(outcome, RuntimeError):
                self._mirror_put(sample_id)
        self._put_outcome(sample_id, producer.was, accepted, None if accepted else outcome, log_at)
        return False

    def _observe_backpressure(self, before: str, pauses_before: int) -> None:
        """Check a round's hysteresis step against the residency its ``health()`` read returned."""
        after = self.queue.backpressure_state
        read = self.store.last_health
        resident = self.inner.health().resident_bytes if read is None else read.resident_bytes
        high, low = self.config.high_watermark_bytes, self.config.low_watermark_bytes
        name = "inv08_backpressure_hysteresis"
        if after not in ("flowing", "paused"):
            self._note(name, f"backpressure_state is {after!r}")
        if before == "flowing" and after == "paused" and resident < high:
            self._note(name, f"paused at {resident} B, below the high watermark {high}")
        if before == "paused" and after == "flowing" and resident > low:
            self._note(name, f"resumed at {resident} B, above the low watermark {low}")
        paused = int(before == "flowing" and after == "paused")
        if self.queue.stats().producer_pauses - pauses_before != paused:
            self._note(name, f"producer_pauses moved by {self.queue.stats().producer_pauses - pauses_before}")

    def do_acquire(self, consumer: str) -> Lease | None:
        """Acquire: lease the head of the pending FIFO (never blocks: ``timeout=0``)."""
        lease, error, _ = self._reaping_call(f"acquire() by {consumer}", lambda: self.queue.acquire(timeout=0))
        token = self.mirror.acquire(consumer)
        if error is not None:
            raise AssertionError(f"acquire(timeout=0) raised {error!r}")
        if lease is None:
            if self.pending:
                self._note("inv09_close_drain", f"acquire() returned None with {list(self.pending)} pending")
            if token is not None:
                self._note("inv12_agrees_with_spec_mirror", f"acquire() returned None, the spec leases {token}")
            return None
        self._took(consumer, lease, token)
        return lease

    def do_acquire_many(self, consumer: str, n: int) -> list[Lease]:
        """Acquire, ``n`` at a time: ``acquire_many(n, timeout=0)`` leases every pending head up to ``n``."""
        leases, error, _ = self._reaping_call(
            f"acquire_many({n}) by {consumer}", lambda: self.queue.acquire_many(n, timeout=0)
        )
        if error is not None:
            raise AssertionError(f"acquire_many({n}, timeout=0) raised {error!r}")
        want = min(n, len(self.pending))  # the reap came first: its redeliveries are pending too
        if len(leases) != want:
            self._note("inv09_close_drain", f"acquire_many({n}) leased {len(leases)}, {list(self.pending)} pending")
        for lease in leases:
            self._took(consumer, lease, self.mirror.acquire(consumer))
        return leases

    def _took(self, consumer: str, lease: Lease, token: object) -> None:
        """Record one lease ``consumer`` got; ``token`` is the one the spec leased at that step."""
        sample_id = lease.ref.sample_id
        sample = self.samples.get(sample_id)
        if sample is None:
            raise AssertionError(f"acquire() returned a sample this test never put: {sample_id!r}")
        if sample.status in SETTLED:
            self._note("inv02_exactly_once", f"{sample.status} sample {sample_id!r} was delivered again")
        if sample.status == "leased":
            self._note("inv01_one_live_lease_per_sample", f"{sample_id!r} leased again while its lease is live")
        if lease.redelivery_count >= self.config.max_deliveries:
            self._note(
                "inv07_bounded_delivery",
                f"{sample_id!r} delivered with redelivery_count {lease.redelivery_count} "
                f"(max_deliveries={self.config.max_deliveries})",
            )
        if token != (sample_id, lease.redelivery_count):
            self._note(
                "inv12_agrees_with_spec_mirror",
                f"acquire() leased {(sample_id, lease.redelivery_count)}, the spec leases {token}",
            )
        if sample_id in self.pending:
            self.pending.remove(sample_id)
        sample.status = "leased"
        sample.live = lease
        sample.deadline = self.clock.now + self.config.visibility_timeout
        if lease.deadline != sample.deadline:
            self._note("inv10_expired_leases_reclaimed", f"lease deadline {lease.deadline}, expected {sample.deadline}")
        self.consumers[consumer].leases.append(lease)
        self._own(consumer, lease)

    def do_settle_many(self, consumer: str, op: str) -> None:
        """``ack_many`` / ``fail_many`` of every lease ``consumer`` holds, live or stale, in the order it got them.

        Each live one must be settled and each stale one rejected on its own: the trace's per-item
        ``Ack``/``Fail`` events name exactly the live leases, in order.
        """
        lost = self.store.lost()  # their holder settles none of those: its read would find the bytes gone
        leases = [lease for lease in self.consumers[consumer].leases if lease.ref.sample_id not in lost]
        if not leases:
            return
        counter = "acked" if op == "ack" else "failed"
        before = getattr(self.queue.stats(), counter)
        seen = len(self.trace.events)
        call = getattr(self.queue, f"{op}_many")
        _, error, new_dead = self._reaping_call(f"{op}_many of {len(leases)} leases", lambda: call(leases))
        if error is not None:
            raise AssertionError(f"{op}_many() raised {error!r}")
        live = [lease for lease in leases if self.samples[lease.ref.sample_id].live is lease]
        settled = [f.get("lease_id") for a, f in self.trace.events[seen:] if a in (events.ACK, events.FAIL)]
        if settled and settled != [lease.lease_id for lease in live]:
            self._note("inv03_terminal_leases_never_change", f"{op}_many settled {settled}, the live ones: {live}")
        if getattr(self.queue.stats(), counter) - before != len(live):
            self._note("inv11_counters_consistent", f"{op}_many settled {counter} != {len(live)} live leases")
        for lease in leases:
            sample = self.samples[lease.ref.sample_id]
            getattr(self.mirror, op)(consumer, (lease.ref.sample_id, lease.redelivery_count))
            self._drop_lease(consumer, lease)
            if sample.live is lease:
                self._settled(sample, op, lease.ref.sample_id in new_dead)

    def _settled(self, sample: _Sample, op: str, dead: bool) -> None:
        """Record that ``op`` settled ``sample``'s live lease: acked, or (``dead``: dead-lettered) requeued."""
        if op == "ack":
            sample.acks += 1
            sample.live = None
            sample.status = "acked"
        else:
            self._requeue(sample, dead)

    def _settle(self, lease: Lease, op: str, forged: Lease | None = None) -> None:
        """Ack or fail ``forged or lease`` on behalf of the consumer holding ``lease``."""
        consumer = self._alive(lease)
        actor = consumer if consumer is not None else self.config.consumer_ids[0]
        sample = self.samples[lease.ref.sample_id]
        target = forged if forged is not None else lease
        counter = "acked" if op == "ack" else "failed"
        before = getattr(self.queue.stats(), counter)
        call = getattr(self.queue, op)
        _, error, new_dead = self._reaping_call(f"{op}(lease {lease.lease_id})", lambda: call(target))
        token = (sample.ref.sample_id, -1 if forged is not None else lease.redelivery_count)
        getattr(self.mirror, op)(actor, token)
        if error is not None and not isinstance(error, OSError):
            raise AssertionError(f"{op}() raised {error!r}")
        if consumer is not None and forged is None:
            self._drop_lease(consumer, lease)
        accepted = getattr(self.queue.stats(), counter) - before == 1
        live = sample.live is lease
        if accepted and (forged is not None or not live):
            kind = "forged" if forged is not None else "stale"
            self._note("inv03_terminal_leases_never_change", f"{kind} {op} of lease {target.lease_id} was accepted")
        if not accepted and live and forged is None:
            self._note("inv11_counters_consistent", f"{op} of the live lease {lease.lease_id} was rejected")
        if accepted:
            self._settled(sample, op, sample.ref.sample_id in new_dead)

    def do_ack(self, lease: Lease) -> None:
        """Ack (also a stale or duplicate ack, when the lease is no longer live)."""
        if self._alive(lease) is not None:
            self._settle_or_find_lost(lease, "ack")

    def do_fail(self, lease: Lease) -> None:
        """Fail (also a stale fail)."""
        if self._alive(lease) is not None:
            self._settle_or_find_lost(lease, "fail")

    def _settle_or_find_lost(self, lease: Lease, op: str) -> None:
        """Settle ``lease``, unless its holder would find the sample's bytes lost: then its read reports it."""
        consumer = self._alive(lease)
        holds = consumer is not None and any(held is lease for held in self.consumers[consumer].leases)
        if holds and lease.ref.sample_id in self.store.lost():
            self.do_get(lease)  # a consumer settles what it read; this read raises SampleLostError
        else:
            self._settle(lease, op)

    def do_store_loses(self, sample_id: str) -> None:
        """StoreLoses: the store loses a queued sample's bytes while no consumer reads it (``FaultyStore.lose``)."""
        sample = self.samples.get(sample_id)
        reading = any(sample_id in c.handles for c in self.consumers.values())
        if sample is None or sample.status not in HELD or reading or len(self.store.lost()) >= self.config.store_losses:
            return
        try:
            self.store.lose(sample_id)
        except Exception:  # a store whose scrub raises loses nothing through it: the queue's scrubs report it (inv05)
            return
        if self._still_there(sample):
            self._note("inv05_no_leak", f"{sample_id!r} is still resident; " + self._suspect(sample_id, "leaked"))
        if not self.mirror.store_loses(sample_id):
            raise AssertionError(f"the spec does not let the store lose {sample_id!r} now; the kit's guard is wrong")
        self._observe_residency()

    def do_lose(self, consumer: str, lease: Lease) -> None:
        """Lose: the consumer whose get raised ``SampleLostError`` reports it (``queue.lose``).

        The queue must dead-letter the sample at once with reason ``lost``, whatever deliveries are left (no
        redelivery could serve bytes that are gone); a stale lease changes nothing.
        """
        sample_id = lease.ref.sample_id
        sample = self.samples[sample_id]
        accepted, error, new_dead = self._reaping_call(f"lose(lease {lease.lease_id})", lambda: self.queue.lose(lease))
        self.mirror.lose(consumer, (sample_id, lease.redelivery_count))
        if error is not None and not isinstance(error, OSError):
            raise AssertionError(f"lose() raised {error!r}")
        self._drop_lease(consumer, lease)
        live = sample.live is lease
        if accepted and not live:
            self._note("inv03_terminal_leases_never_change", f"stale lose of lease {lease.lease_id} was accepted")
        if not accepted and live:
            self._note("inv11_counters_consistent", f"lose of the live lease {lease.lease_id} was rejected")
        if not accepted:
            return
        letters = [d.reason for d in self.queue.dead_letters() if d.ref.sample_id == sample_id]
        if sample_id not in new_dead:
            self._note("inv04_no_loss", f"the store lost {sample_id!r}, lose() reported it, and the queue requeued it")
        elif letters != [LOST_REASON]:
            self._note("inv04_no_loss", f"lost {sample_id!r} was dead-lettered with reasons {letters}, not lost")
        self._requeue(sample, sample_id in new_dead)

    def do_extend(self, lease: Lease, seconds: float | None, forged: Lease | None = None) -> None:
        """Extend: push the deadline of a live lease; ``LeaseLost`` for anything else."""
        consumer = self._alive(lease)
        if consumer is None and forged is None:
            return
        actor = consumer if consumer is not None else self.config.consumer_ids[0]
        sample = self.samples[lease.ref.sample_id]
        target = forged if forged is not None else lease
        before = self.queue.stats().extended
        lost = False

        def call() -> None:
            nonlocal lost
            try:
                self.queue.extend(target, seconds)
            except LeaseLost:
                lost = True

        _, error, _ = self._reaping_call(f"extend(lease {target.lease_id})", call)
        token = (sample.ref.sample_id, -1 if forged is not None else lease.redelivery_count)
        self.mirror.extend(actor, token)
        if error is not None and not isinstance(error, OSError):
            raise AssertionError(f"extend() raised {error!r}")
        granted = self.queue.stats().extended - before == 1
        if granted == lost:
            self._note("inv11_counters_consistent", f"extend() granted={granted} but LeaseLost raised={lost}")
        live = sample.live is lease and forged is None
        if granted and not live:
            self._note("inv03_terminal_leases_never_change", f"extend of a non-live lease {target.lease_id} granted")
        if not granted and live:
            self._note("inv11_counters_consistent", f"extend of the live lease {lease.lease_id} raised LeaseLost")
        if granted and live:
            sample.deadline = self.clock.now + (self.config.visibility_timeout if seconds is None else seconds)
            if lease.deadline != sample.deadline:
                self._note("inv10_expired_leases_reclaimed", f"extend set {lease.deadline}, expected {sample.deadline}")

    def do_forge(self, lease: Lease, how: str, op: str) -> None:
        """A forged lease: a ``dataclasses.replace`` copy, or a made-up ``lease_id``; always rejected."""
        if how == "copy":
            forged = dataclasses.replace(lease)
        else:
            forged = dataclasses.replace(lease, lease_id=next(self._forged_ids))
        if op == "extend":
            self.do_extend(lease, None, forged=forged)
        else:
            self._settle(lease, op, forged=forged)

    def do_get(self, lease: Lease) -> StoreHandle | None:
        """Get: the lease holder materialises the sample (a slow consumer may do so with a stale lease)."""
        consumer = self._alive(lease)
        sample_id = lease.ref.sample_id
        if consumer is None or not any(held is lease for held in self.consumers[consumer].leases):
            return None
        if sample_id in self.consumers[consumer].handles:
            return None
        sample = self.samples[sample_id]
        self._sync_store()
        try:
            tensors, handle = self.store.get(lease.ref)
        except InjectedFault:
            return None  # the read failed before reaching the store: nothing changed
        except SampleLostError as exc:
            if sample_id not in self.store.lost():  # scrubbed, but a store of remote bytes cannot tell
                return self._get_refused(consumer, sample, exc)
            self.do_lose(consumer, lease)
            return None
        except KeyError as exc:
            return self._get_refused(consumer, sample, exc)
        if not self.mirror.get(consumer, sample_id):
            self._note("inv12_agrees_with_spec_mirror", f"get of {sample_id!r} succeeded, the spec has no bytes")
        self._compare(sample, tensors, "inv04_no_loss")
        self.consumers[consumer].handles[sample_id] = handle
        self._own(consumer, handle)
        return handle

    def _get_refused(self, consumer: str, sample: _Sample, error: KeyError) -> None:
        """A get that raised ``KeyError``: right only for a sample the spec holds no bytes of."""
        sample_id = sample.ref.sample_id
        if sample.status in HELD:
            self._note(
                "inv04_no_loss",
                f"get of {sample.status} sample {sample_id!r} raised {error!r}; {self._suspect(sample_id, 'lost')}",
            )
        if self.mirror.get(consumer, sample_id):
            self._note("inv12_agrees_with_spec_mirror", f"get of {sample_id!r} failed, the spec allows it")

    def do_release(self, handle: StoreHandle) -> None:
        """Release: the consumer drops its store handle (an injected fault leaves it held)."""
        consumer = self._alive(handle)
        if consumer is None or self.consumers[consumer].handles.get(handle.sample_id) is not handle:
            return
        try:
            self.store.release(handle)
        except InjectedFault:
            return
        del self.consumers[consumer].handles[handle.sample_id]
        self.mirror.release(consumer, handle.sample_id)
        self._observe_residency()

    def _stale_candidates(self, op: str) -> list[str]:
        """The settled ids whose bytes are gone (for ``release``: of which a live consumer still has a handle)."""
        held = {sample_id for consumer in self.consumers.values() for sample_id in consumer.handles}
        return [
            sample_id
            for sample_id, sample in sorted(self.samples.items())
            if sample.status in SETTLED
            and sample_id not in self.owed
            and (op != "release" or sample_id in held)
            and not self._still_there(sample)
        ]

    def do_stale_incarnation(self, sample_id: str, op: str) -> None:
        """A handle or ref of an earlier put of ``sample_id`` meets a later put of the id.

        ``sample_id`` settled and its bytes were scrubbed; the producer puts the id into the store again (a new
        incarnation, with other bytes; the queue's dedup window would refuse it, so it goes to the store only).
        Then a consumer releases the handle it still has of the earlier put (``release``), or the earlier ref
        is retained, scrubbed or materialised (``get``). None of them may free, serve, retain or scrub the
        later put, which the consumer then reads and releases: its last handle, and nothing retains it, so
        the store frees it and the queue's world is as before the step.
        """
        sample = self.samples.get(sample_id)
        if sample is None or sample_id not in self._stale_candidates(op):
            return
        holder = next((c for c, held in self.consumers.items() if sample_id in held.handles), None)
        before = self.inner.health()
        later = sample_tensors(sample.index + self.config.samples, self.config.sample_tokens)
        try:
            fresh = self.inner.put(sample_id, later, run_id="machine")
        except MemoryError:
            return  # the store is at its cap: no room for the later put
        self.stale_ops[op] += 1
        name = "inv16_incarnations_never_cross"
        stale = f"{op} of the earlier put of {sample_id!r}"
        if fresh == sample.ref:
            self._note(name, f"two puts of {sample_id!r} returned equal refs: a ref must name its put")
        put_health = self.inner.health()
        if op == "release" and holder is not None:
            self.inner.release(self.consumers[holder].handles.pop(sample_id))
            self.mirror.release(holder, sample_id)
        elif op == "get":
            try:
                _, handle = self.inner.get(sample.ref)
            except KeyError:
                pass
            else:
                self.inner.release(handle)
                self._note(name, f"{stale} served bytes, though that put was scrubbed")
        else:
            getattr(self.inner, op)(sample.ref)  # retain / scrub: of a put the store no longer holds
        health = self.inner.health()
        if (health.sample_count, health.resident_bytes) != (put_health.sample_count, put_health.resident_bytes):
            self._note(name, f"{stale} changed health() from {put_health} to {health}")
        try:
            tensors, handle = self.inner.get(fresh)
        except KeyError as exc:
            self._note(name, f"{stale} freed the later put ({exc!r})")
            return
        if not same_tensors(tensors, later):
            self._note(name, f"after {stale}, the later put materialised other bytes")
        self.inner.release(handle)
        health = self.inner.health()
        if (health.sample_count, health.resident_bytes) != (before.sample_count, before.resident_bytes):
            why = "the stale retain retained it" if op == "retain" else "its last release did not free it"
            self._note(name, f"the later put of {sample_id!r} is still resident after {stale}: {why}")
            self.inner.scrub(fresh)

    def do_crash(self, consumer: str) -> None:
        """Crash: the consumer forgets its leases and handles without settling or releasing them."""
        state = self.consumers[consumer]
        if not state.leases and not state.handles:
            return
        state.generation += 1
        state.leases = []
        state.handles = {}
        self.mirror.crash(consumer)

    def do_drain(self, consumer: str) -> None:
        """Consumers work the queue empty while producers are blocked (Release, Ack, Acquire, Reclaim).

        Every consumer releases its handles and acks the leases it holds; then ``consumer`` leases
        and acks the pending samples one at a time, and when only leases of crashed consumers are
        left, time passes by the visibility timeout and the reaper takes them back. It stops once no
        put is blocked or the queue holds nothing. The queue wakes blocked producers on every
        settle, so after each ack or reclaim every blocked put takes its rounds (``do_wake``):
        residency falls through the hysteresis band a sample at a time, and a producer resumes
        (or, paused with nothing left in the queue, enqueues) as soon as the queue lets it; a woken
        producer's sample is drained in turn while others are still blocked. ``wake_producer``
        covers the other schedules, a producer that runs its round only later.
        """
        for name in sorted(self.consumers):
            for handle in list(self.consumers[name].handles.values()):
                self.do_release(handle)
            for lease in list(self.consumers[name].leases):
                self.do_ack(lease)
                self._wake_blocked()
        # A bound, even for a broken queue: each round settles a delivery or moves the clock on.
        for _ in range(2 * self.config.samples * (self.config.max_deliveries + 1)):
            if not self.producers or not self._held_count():
                return
            lease = self.do_acquire(consumer)
            if lease is None:
                self.do_advance_clock(self.config.visibility_timeout)
                self.do_reclaim()
            else:
                self.do_ack(lease)
            self._wake_blocked()

    def _wake_blocked(self) -> None:
        for sample_id in sorted(self.producers):
            self.do_wake(sample_id)

    def do_advance_clock(self, seconds: float) -> None:
        """Time passes (or jumps); leases past their deadline are reclaimed by the next call that reaps.

        The spec's time is abstract (its ``Reclaim`` may take any live lease), so
        the mirror moves only when the implementation reaps.
        """
        self.clock.advance(seconds)

    def do_reclaim(self) -> None:
        """Reclaim: ``reclaim_expired()`` returns how many it reclaimed."""
        due = len(self._due())
        count, error, _ = self._reaping_call("reclaim_expired()", self.queue.reclaim_expired)
        if error is not None and not isinstance(error, OSError):
            raise AssertionError(f"reclaim_expired() raised {error!r}")
        if error is None and count != due:
            self._note("inv10_expired_leases_reclaimed", f"reclaim_expired() returned {count}, {due} were due")

    def do_close(self) -> None:
        """Close: refuse puts; drained once nothing is pending or leased. Does not reap.

        Every blocked producer is woken and must give up; then a producer tries to put the first
        sample again: refused, nothing changes.
        """
        self.queue.close()
        self.mirror.close()
        self.closed = True
        self._wake_blocked()
        self.do_put(self.config.sample_ids[0], blocking=False)

    def do_arm_fault(self, call: str, until_cleared: bool) -> None:
        """A store call starts failing: once, or until ``do_clear_faults``."""
        self.store.arm(call, times=None if until_cleared else 1)

    def do_lose_reply(self, call: str, until_cleared: bool) -> None:
        """The network starts losing the replies of ``call``: its next one, or every one until ``do_clear_faults``.

        The call runs on the server and the client retries it; the machine checks it as the one call it is.
        """
        assert self.replies is not None, "only a backend that declares lost replies (replies=) gets this rule"
        self.replies.arm(call, times=None if until_cleared else 1)

    def _faults_armed(self) -> bool:
        return self.store.armed() or (self.replies is not None and self.replies.armed())

    def do_clear_faults(self) -> None:
        """The store and the network heal; the next queue call pays what the queue owes the store."""
        self.store.clear()
        if self.replies is not None:
            self.replies.clear()

    def do_set_callbacks(self, mode: str) -> None:
        """From now on the queue's callbacks record only, raise, or call the queue back."""
        self.callback_mode = mode

    def do_finish(self) -> None:
        """The store heals, the queue closes, consumers settle everything: nothing may stay resident.

        Expired leases of crashed consumers are reclaimed by moving the clock; each round acks what it leases.
        """
        self.do_clear_faults()
        if not self.closed:
            self.do_close()
        consumer = self.config.consumer_ids[0]
        for _ in range(self.config.samples * (self.config.max_deliveries + 1)):
            if self.queue.lifecycle_state == "drained":
                break
            lease = self.do_acquire(consumer)
            if lease is None:
                self.do_advance_clock(self.config.visibility_timeout)
                self.do_reclaim()
                continue
            self.do_ack(lease)
        self.finished = True
        name = "inv14_store_faults_survivable"
        if self.queue.lifecycle_state != "drained":
            self._note(name, f"a closed queue with healed store stays {self.queue.lifecycle_state!r}")
        stats = self.queue.stats()
        self._sync_store()
        if stats.scrub_backlog or self.owed:
            self._note(name, f"after the store healed, scrubs are still owed: {sorted(self.owed)} {stats}")
        if self.producers:
            self._note("inv13_producer_progress", f"blocked puts outlived close: {sorted(self.producers)}")

    def teardown(self) -> None:
        try:
            for producer in self.producers.values():
                producer.put.abort()
            self.queue.close()
            self.store.close()
        finally:
            quiet_injected_faults(False)

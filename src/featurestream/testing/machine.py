"""The stateful test: the spec's actions applied to a queue + store and to the spec mirror, step by step.

``QueueMachine`` builds the state and mixes in the actions by concern -- ``producing.ProducerActions``,
``consuming.ConsumerActions``, ``world.WorldActions``, each over ``machine_state.MachineState`` (the observed
records and the shared plumbing), and the scenarios spanning them here (drain, close, finish); its invariants are
``featurestream.testing.invariants``, its bounds ``config.MachineConfig``. ``make_queue_machine``
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
import itertools
from collections.abc import Callable
from typing import Any

from hypothesis.stateful import RuleBasedStateMachine

from featurestream.backends.memory.queue import SampleRefQueue
from featurestream.core.lease import VisibilityTimeout
from featurestream.core.protocol import LeaseQueue
from featurestream.spec.mirror import SpecConstants, SpecMirror
from featurestream.spec.recording import TraceRecorder
from featurestream.stores.base import FeatureStore, StoreHealth
from featurestream.testing.clock import FakeClock
from featurestream.testing.config import BOUND, CALLBACK_MODES, MachineConfig
from featurestream.testing.consuming import ConsumerActions
from featurestream.testing.faults import FailsOver, FaultyStore, LosesReplies
from featurestream.testing.invariants import InvariantViolation
from featurestream.testing.machine_state import ConsumerRecord, ProducerRecord, SampleRecord
from featurestream.testing.producing import ProducerActions
from featurestream.testing.report import quiet_injected_faults
from featurestream.testing.world import WorldActions

__all__ = ["BOUND", "CALLBACK_MODES", "InvariantViolation", "MachineConfig", "QueueMachine"]


class QueueMachine(ProducerActions, ConsumerActions, WorldActions, RuleBasedStateMachine):
    """Actions and invariants; ``make_queue_machine`` binds them to rules.

    Subclasses (or the factory) provide ``make_store()`` and ``make_queue(store, **hooks)``.
    The queue must accept ``visibility_timeout=, high_watermark_bytes=,
    low_watermark_bytes=, on_pause=, on_resume=, max_deliveries=, dedup_window=,
    on_dead_letter=, clock=, tracer=`` and implement ``featurestream.core.protocol.LeaseQueue``.
    """

    config: MachineConfig = MachineConfig()
    # Given for a backend whose replies can be lost (``make_queue_machine(replies=)``): the queue's reply faults.
    replies_of: Callable[[LeaseQueue], LosesReplies] | None = None
    # Given for a backend whose primary can be lost (``make_queue_machine(failovers=)``): the queue's failovers.
    failovers_of: Callable[[LeaseQueue], FailsOver] | None = None

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
        self.failovers = None if self.failovers_of is None else self.failovers_of(self.queue)
        self.mirror = SpecMirror(
            SpecConstants(
                samples=cfg.sample_ids,
                consumers=cfg.consumer_ids,
                max_deliveries=cfg.max_deliveries,
                high_watermark=cfg.high_watermark_bytes,
                low_watermark=cfg.low_watermark_bytes,
                max_held=None,
                max_losses=cfg.store_losses,
                untrainable=cfg.untrainable_ids,
            )
        )
        self.samples: dict[str, SampleRecord] = {}
        self.pending: collections.deque[str] = collections.deque()
        self.consumers = {c: ConsumerRecord() for c in cfg.consumer_ids}
        self.producers: dict[str, ProducerRecord] = {}
        self.woken_puts = 0  # blocked puts that waited, were woken and enqueued: how far a run got, for coverage checks
        self.stale_ops: collections.Counter[str] = collections.Counter()  # stale ops that met a later put, by op
        self.closed = False
        self.finished = False
        self.owed: set[str] = set()  # settled samples whose scrub raised and has not gone through since
        self.owed_unretain: set[str] = set()  # refused puts whose unretain raised and has not gone through since
        self._log_seen = 0  # how much of the FaultyStore's call log has been accounted for
        self._owner: dict[int, tuple[str, int]] = {}  # id(lease or handle) -> (consumer, generation)
        self._given_back: set[int] = set()  # id(lease) of every lease handed to a give_back call
        self._keep: list[object] = []  # keeps leases/handles alive so id() stays unique
        self._forged_ids = itertools.count(2**30)  # never issued here; below TLC's 2**31 int limit
        self._init_invariants()
        quiet_injected_faults(True, type(self))  # until teardown: logs of the faults injected here are noise

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

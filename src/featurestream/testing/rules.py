"""``make_queue_machine``: bind ``QueueMachine``'s actions to Hypothesis rules for one store/queue factory."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar

from hypothesis import strategies as st
from hypothesis.stateful import Bundle, multiple, precondition, rule

from featurestream.backends.memory.queue import SampleRefQueue
from featurestream.core.lease import Lease
from featurestream.core.machines import SETTLED
from featurestream.core.protocol import LeaseQueue
from featurestream.stores.base import FeatureStore, StoreHandle
from featurestream.testing.faults import CALLS, EXACT_CALLS, FAILOVER_MOMENTS, FailsOver, LosesReplies
from featurestream.testing.machine import CALLBACK_MODES, MachineConfig, QueueMachine

__all__ = ["checked", "make_queue_machine"]

Action = TypeVar("Action", bound=Callable[..., Any])

# Which store call a fault rule arms: every call, with the ones behind the queue's guarantees more often.
FAULT_WEIGHTS = (*CALLS, "scrub", "scrub", "retain", "health")


def checked(action: Action) -> Action:
    """Make a rule check every invariant after its action (put it under ``@rule``); rules you add need it too.

    The checks run inside the rule rather than as Hypothesis ``@invariant``s,
    which Hypothesis would print after every step of the shrunk example.
    """

    @functools.wraps(action)
    def step(self: QueueMachine, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True  # pytest: the violation names the invariant; this frame says nothing
        result = action(self, *args, **kwargs)
        self.check_all_invariants()
        return result

    return step  # type: ignore[return-value]


def make_queue_machine(
    store_factory: Callable[[], FeatureStore],
    queue_factory: Callable[..., LeaseQueue] = SampleRefQueue,
    config: MachineConfig | None = None,
    *,
    name: str = "QueueStateMachine",
    replies: Callable[[LeaseQueue], LosesReplies] | None = None,
    failovers: Callable[[LeaseQueue], FailsOver] | None = None,
) -> type[QueueMachine]:
    """A ``RuleBasedStateMachine`` running the spec's actions against ``queue_factory(store_factory())``.

    ``store_factory()`` returns a fresh, empty store (large enough for
    ``config.samples`` tiny samples); the machine wraps it in a ``FaultyStore``.
    ``queue_factory(store, **hooks)`` returns a queue with ``SampleRefQueue``'s
    constructor keywords (see ``QueueMachine``). ``replies(queue)``, for a
    backend whose replies a network can lose, returns the queue's
    ``LosesReplies``: the machine then loses replies too (rule ``lose_reply``).
    ``failovers(queue)``, for a backend whose replicated server can lose its
    primary, returns the queue's ``FailsOver``: the machine then fails over
    too (rule ``failover``, ``config.failovers`` times a run at most). Use it as
    ``TestMyStore = make_queue_machine(MyStore).TestCase``.
    """
    cfg = config or MachineConfig()
    samples = st.sampled_from(cfg.sample_ids)
    consumers = st.sampled_from(cfg.consumer_ids)
    vt = cfg.visibility_timeout
    steps = st.sampled_from((1.0, vt / 2, vt, 2 * vt, 10 * vt))  # the last one: a clock jump past every lease

    class Machine(QueueMachine):
        config = cfg
        replies_of = None if replies is None else staticmethod(replies)
        failovers_of = None if failovers is None else staticmethod(failovers)
        leases = Bundle("leases")
        handles = Bundle("handles")

        def make_store(self) -> FeatureStore:
            return store_factory()

        def make_queue(self, store: FeatureStore, **hooks: Any) -> LeaseQueue:
            return queue_factory(store, **hooks)

        @precondition(lambda self: len(self.samples) < cfg.samples)
        @rule(sample=samples)
        @checked
        def produce(self, sample: str) -> None:
            self.do_produce(sample)

        @precondition(lambda self: not self.closed)
        @rule(sample=samples)
        @checked
        def put(self, sample: str) -> None:
            self.do_put(sample, blocking=False)

        @precondition(lambda self: not self.closed)
        @rule(batch=st.lists(samples, min_size=1, max_size=3, unique=True))
        @checked
        def put_many(self, batch: list[str]) -> None:
            self.do_put_many(batch)

        @precondition(lambda self: not self.closed and len(self.producers) < cfg.producers)
        @rule(sample=samples)
        @checked
        def put_blocking(self, sample: str) -> None:
            self.do_put(sample, blocking=True)

        @precondition(lambda self: self.producers)
        @rule(pick=st.integers(0, cfg.producers - 1))
        @checked
        def wake_producer(self, pick: int) -> None:
            blocked = sorted(self.producers)
            self.do_wake(blocked[pick % len(blocked)])

        @precondition(lambda self: self.pending or self._due() or self.closed)
        @rule(target=leases, consumer=consumers)
        @checked
        def acquire(self, consumer: str) -> Any:
            lease = self.do_acquire(consumer)
            return multiple() if lease is None else lease

        @precondition(lambda self: self.pending or self._due() or self.closed)
        @rule(target=leases, consumer=consumers, n=st.integers(1, 3))
        @checked
        def acquire_many(self, consumer: str, n: int) -> Any:
            return multiple(*self.do_acquire_many(consumer, n))

        @precondition(lambda self: self._holding())
        @rule(
            consumer=consumers, op=st.sampled_from(("ack", "fail", "give_back") if cfg.give_backs else ("ack", "fail"))
        )
        @checked
        def settle_many(self, consumer: str, op: str) -> None:
            self.do_settle_many(consumer, op)

        @precondition(lambda self: self._holding())
        @rule(target=handles, lease=leases)
        @checked
        def get(self, lease: Lease) -> Any:
            handle = self.do_get(lease)
            return multiple() if handle is None else handle

        @precondition(lambda self: len(self.store.lost()) < cfg.store_losses and self._held_count())
        @rule(sample=samples)
        @checked
        def store_loses(self, sample: str) -> None:
            self.do_store_loses(sample)

        @precondition(lambda self: any(s.status in SETTLED for s in self.samples.values()))
        @rule(pick=st.integers(0, cfg.samples - 1), op=st.sampled_from(("retain", "scrub", "get")))
        @checked
        def stale_ref(self, pick: int, op: str) -> None:
            candidates = self._stale_candidates(op)
            if candidates:
                self.do_stale_incarnation(candidates[pick % len(candidates)], op)

        @precondition(lambda self: self._stale_candidates("release"))
        @rule(pick=st.integers(0, cfg.samples - 1))
        @checked
        def stale_release(self, pick: int) -> None:
            candidates = self._stale_candidates("release")
            self.do_stale_incarnation(candidates[pick % len(candidates)], "release")

        @precondition(lambda self: any(c.handles for c in self.consumers.values()))
        @rule(handle=handles)
        @checked
        def release(self, handle: StoreHandle) -> None:
            self.do_release(handle)

        @precondition(lambda self: self._holding())
        @rule(lease=leases)
        @checked
        def ack(self, lease: Lease) -> None:
            self.do_ack(lease)

        @precondition(lambda self: self._holding())
        @rule(lease=leases)
        @checked
        def fail(self, lease: Lease) -> None:
            self.do_fail(lease)

        @precondition(lambda self: self._holding())
        @rule(lease=leases, seconds=st.sampled_from((None, vt / 2, 2 * vt)))
        @checked
        def extend(self, lease: Lease, seconds: float | None) -> None:
            self.do_extend(lease, seconds)

        @precondition(lambda self: self._holding())
        @rule(lease=leases, how=st.sampled_from(("copy", "made_up_id")), op=st.sampled_from(("ack", "fail", "extend")))
        @checked
        def forge(self, lease: Lease, how: str, op: str) -> None:
            self.do_forge(lease, how, op)

        @precondition(lambda self: self._holding())
        @rule(consumer=consumers)
        @checked
        def crash(self, consumer: str) -> None:
            self.do_crash(consumer)

        @precondition(lambda self: self.producers and self._held_count())
        @rule(consumer=consumers)
        @checked
        def drain(self, consumer: str) -> None:
            self.do_drain(consumer)

        @precondition(lambda self: self.queue.outstanding_count())
        @rule(seconds=steps)
        @checked
        def advance_clock(self, seconds: float) -> None:
            self.do_advance_clock(seconds)

        @precondition(lambda self: self._due())
        @rule()
        @checked
        def reclaim(self) -> None:
            self.do_reclaim()

        @precondition(lambda self: not self.closed and self.queue.stats().acked + self.queue.stats().dead_lettered > 0)
        @rule()
        @checked
        def close(self) -> None:
            self.do_close()

        @precondition(lambda self: cfg.store_faults and not self.finished)
        @rule(call=st.sampled_from(FAULT_WEIGHTS), until_cleared=st.booleans())
        @checked
        def arm_fault(self, call: str, until_cleared: bool) -> None:
            self.do_arm_fault(call, until_cleared)

        @precondition(lambda self: self.replies is not None and not self.finished)
        @rule(call=st.sampled_from(EXACT_CALLS), until_cleared=st.booleans())
        @checked
        def lose_reply(self, call: str, until_cleared: bool) -> None:
            self.do_lose_reply(call, until_cleared)

        @precondition(
            lambda self: (
                self.failovers is not None
                and not self.finished
                and not self.failovers.armed()
                and self.failovers.failovers() < cfg.failovers
            )
        )
        @rule(at=st.sampled_from(FAILOVER_MOMENTS))
        @checked
        def failover(self, at: str) -> None:
            self.do_failover(at)

        @precondition(lambda self: self._faults_armed())
        @rule()
        @checked
        def clear_faults(self) -> None:
            self.do_clear_faults()

        @rule(mode=st.sampled_from(CALLBACK_MODES))
        @checked
        def set_callbacks(self, mode: str) -> None:
            self.do_set_callbacks(mode)

        @precondition(lambda self: self.closed and not self.finished)  # after close: the runs before it stay long
        @rule()
        @checked
        def finish(self) -> None:
            self.do_finish()

        if cfg.untrainable:  # only then: the other machines' derandomized runs stay as they were

            @precondition(lambda self: self._holding(cfg.untrainable_ids))
            @rule(lease=leases)
            @checked
            def reject(self, lease: Lease) -> None:
                self.do_reject(lease)

    Machine.__name__ = Machine.__qualname__ = name
    return Machine

"""The invariants of the stateful test, checked after every step (mixed into ``QueueMachine``).

Named after the invariants of docs/design.md; each reads the implementation through its
public API (and the store the machine wraps, ``inner``, directly) and compares
it with what ``QueueMachine`` observed and with the spec mirror. Violations
seen while acting are noted by the actions and reported by the invariant they
name. A failure raises ``InvariantViolation`` naming the invariant; a message
about a sample's bytes names the store method most likely at fault and the
store calls made on it.

They are not Hypothesis ``@invariant``s: ``check_all_invariants`` runs them in
order at the end of every rule (``featurestream.testing.rules.checked``), so
the shrunk example Hypothesis prints lists the rules only, not fifteen
invariant calls after each.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, NoReturn, Protocol

import torch

from featurestream.common.refs import SampleRef
from featurestream.core import events
from featurestream.core.lease import Lease
from featurestream.core.machines import HELD, SETTLED
from featurestream.core.protocol import LeaseQueue
from featurestream.spec.mirror import SpecMirror
from featurestream.spec.recording import STORE_GET, STORE_PUT, STORE_RELEASE, STORE_SCRUB, TraceRecorder
from featurestream.stores.base import FeatureStore
from featurestream.testing.clock import FakeClock
from featurestream.testing.faults import QUEUE_CALLS, FaultyStore
from featurestream.testing.report import suspect
from featurestream.testing.samples import sample_tensors

__all__ = [
    "INVARIANTS",
    "QUEUE_COUNTERS",
    "InvariantHost",
    "InvariantViolation",
    "ObservedSample",
    "QueueInvariants",
    "check_host",
    "same_tensors",
]
QUEUE_COUNTERS = (
    "put",
    "leased",
    "acked",
    "failed",
    "given_back",
    "reclaimed",
    "dead_lettered",
    "extended",
    "stale_rejected",
    "dedup_refused",
    "producer_pauses",
    "pending",
    "outstanding",
)
# Trace events the mirror does not produce: store faults and their retries, the recorder's residency notes
# and the store calls it sees through a wrapped store (the mirror's store steps are driven by the kit itself).
UNMODELLED_EVENTS = frozenset(
    {events.STORE_FAULT, events.SCRUB_RETRIED, events.RESIDENT, STORE_PUT, STORE_GET, STORE_RELEASE, STORE_SCRUB}
)


class InvariantViolation(AssertionError):
    """An invariant of the lease queue does not hold; ``invariant`` is the checking method's name."""

    def __init__(self, invariant: str, message: str) -> None:
        super().__init__(f"{invariant}: {message}")
        self.invariant = invariant


class ObservedSample(Protocol):
    """What the host observed one sample's implementation do (``QueueMachine``'s record of it)."""

    index: int
    ref: SampleRef
    status: str  # stored | pending | leased | acked | dead (HELD and SETTLED of core.machines, and stored)
    live: Lease | None
    deadline: float
    deliveries: int
    acks: int


class Bounds(Protocol):
    """The bounds of the run the invariants read (``MachineConfig`` has them)."""

    @property
    def max_deliveries(self) -> int: ...

    @property
    def sample_ids(self) -> tuple[str, ...]: ...

    @property
    def sample_tokens(self) -> int | None: ...


class InvariantHost(Protocol):
    """What ``QueueInvariants`` reads of the machine it is mixed into; ``check_host`` enforces it.

    The implementation under test (``queue``, the faulty ``store`` the queue sees, the ``inner`` store under it),
    the spec ``mirror``, the ``clock`` and ``trace`` both are given, and what the host observed through the public
    API: its ``samples``, the ``pending`` FIFO, whether it ``closed`` the queue, the scrubs (unretains) the store is
    ``owed``, the callbacks it saw; and one hook, ``_sync_store``, that accounts for the store calls made since.
    """

    queue: LeaseQueue
    store: FaultyStore
    inner: FeatureStore
    mirror: SpecMirror
    config: Bounds
    clock: FakeClock
    trace: TraceRecorder
    samples: Mapping[str, ObservedSample]
    pending: Sequence[str]
    closed: bool
    owed: set[str]
    owed_unretain: set[str]
    dead_seen: list[str]
    pause_seen: list[Any]

    def _sync_store(self, upto: int | None = None) -> None: ...


def same_tensors(got: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]) -> bool:
    """Whether ``got`` has ``expected``'s names, in order, and equal tensors."""
    return list(got) == list(expected) and all(torch.equal(got[k], expected[k]) for k in expected)


def check_host(host: object) -> None:
    """``TypeError`` naming what ``host`` lacks of ``InvariantHost``."""
    methods = [name for name, value in vars(InvariantHost).items() if callable(value) and not name.startswith("__")]
    wanted = [*InvariantHost.__annotations__, *methods]
    missing = [name for name in wanted if not hasattr(host, name)]
    if missing:
        raise TypeError(f"{type(host).__name__} cannot host QueueInvariants: it lacks {', '.join(missing)}")


class QueueInvariants:
    """``inv01`` ... ``inv17``, mixed into an ``InvariantHost`` (``QueueMachine``); they own the violation notes.

    An action that sees a violation while acting ``_note``s it under the invariant it breaks, and that
    invariant reports it after the step (``_check_notes``).
    """

    def _init_invariants(self) -> None:
        check_host(self)
        self._notes: dict[str, list[str]] = collections.defaultdict(list)
        self._resident_check: bool | None = None  # whether the store implements is_resident
        self._trace_seen = 0  # how much of the trace has had its fields checked
        self._traced_now = 0.0  # the clock of the last traced event (it never goes back)

    def _note(self, invariant: str, message: str) -> None:
        """Remember a violation seen while acting; the named invariant reports it after the step."""
        self._notes[invariant].append(message)

    def _fail(self, invariant: str, message: str) -> NoReturn:
        __tracebackhide__ = True  # pytest shows the message, not this frame
        raise InvariantViolation(invariant, message)

    def _check_notes(self, invariant: str) -> None:
        self._sync_store()
        notes = self._notes.pop(invariant, None)
        if notes:
            self._fail(invariant, "; ".join(notes))

    def _compare(self, sample: ObservedSample, tensors: dict[str, torch.Tensor], invariant: str) -> None:
        """Note ``invariant`` broken when ``tensors`` are not the bytes the producer wrote for ``sample``."""
        if not same_tensors(tensors, sample_tensors(sample.index, self.config.sample_tokens)):
            sample_id = sample.ref.sample_id
            self._note(
                invariant, f"{sample_id!r} materialised with the wrong bytes; {self._suspect(sample_id, 'bytes')}"
            )

    def _held(self) -> Iterator[ObservedSample]:
        return (s for s in self.samples.values() if s.status in HELD)

    def _is_resident(self, sample_id: str) -> bool | None:
        if self._resident_check is False:
            return None
        try:
            answer = self.inner.is_resident(sample_id)
        except NotImplementedError:
            self._resident_check = False
            return None
        self._resident_check = True
        return answer

    def _should_be_resident(self) -> list[ObservedSample]:
        lost = self.store.lost()  # gone with the bytes: an owed scrub of one holds nothing
        return [
            s
            for s in self.samples.values()
            if (s.status == "stored" or s.status in HELD or s.ref.sample_id in self.owed)
            and s.ref.sample_id not in lost
        ]

    def _expected_residency(self) -> tuple[int, int]:
        resident = self._should_be_resident()
        return len(resident), sum(s.ref.estimated_bytes for s in resident)

    def _suspect(self, sample_id: str, problem: str) -> str:
        return suspect(self.store.log, sample_id, problem)

    def _still_there(self, sample: ObservedSample) -> bool:
        """Whether a sample the store should have freed is still resident (through ``get`` without ``is_resident``)."""
        resident = self._is_resident(sample.ref.sample_id)
        if resident is not None:
            return resident
        try:
            _, handle = self.inner.get(sample.ref)
        except KeyError:
            return False
        self.inner.release(handle)
        return True

    def check_all_invariants(self) -> None:
        """Every invariant, in ``INVARIANTS`` order; the first violated one raises ``InvariantViolation``."""
        __tracebackhide__ = True  # pytest: the violation's message says where, the kit's frames add nothing
        for name in INVARIANTS:
            try:
                self._check_notes(name)  # what the step's actions saw first, then what the invariant checks
                getattr(self, name)()
                self._check_notes(name)
            except InvariantViolation as violation:
                raise violation.with_traceback(None) from None

    def inv01_one_live_lease_per_sample(self) -> None:
        """1. At most one live lease per sample; a sample is leased iff it has one."""
        name = "inv01_one_live_lease_per_sample"
        leased = [s.ref.sample_id for s in self.samples.values() if s.status == "leased"]
        outstanding = self.queue.outstanding_count()
        if outstanding != len(leased):
            self._fail(name, f"outstanding_count() is {outstanding}, but leased samples are {leased}")
        counts = self.queue.lease_state_counts()
        if counts != {"pending": len(self.pending), "leased": len(leased)}:
            self._fail(name, f"lease_state_counts() {counts}, but {list(self.pending)} pending and {leased} leased")

    def inv02_exactly_once(self) -> None:
        """2. A sample is acked at most once and never delivered again after its ack."""
        name = "inv02_exactly_once"
        twice = [s.ref.sample_id for s in self.samples.values() if s.acks > 1]
        if twice:
            self._fail(name, f"samples acked more than once: {twice}")

    def inv03_terminal_leases_never_change(self) -> None:
        """3. Stale, duplicate and forged acks/fails/extends are rejected without effect."""

    def inv04_no_loss(self) -> None:
        """4. Nothing queued is lost unless the store lost it, and then it is reported.

        A pending or leased sample is resident and materialisable, whatever consumers released; one whose bytes
        the store lost is dead-lettered with reason ``lost`` when its consumer reports it (``lose``), never
        redelivered after that and never acked.
        """
        name = "inv04_no_loss"
        lost = self.store.lost()
        acked = [s.ref.sample_id for s in self.samples.values() if s.status == "acked" and s.ref.sample_id in lost]
        if acked:
            self._fail(name, f"samples whose bytes the store lost were acked: {acked}")
        for sample in [s for s in self._held() if s.ref.sample_id not in lost]:
            sample_id = sample.ref.sample_id
            if self._is_resident(sample_id) is False:
                self._fail(
                    name,
                    f"{sample.status} sample {sample_id!r} is not resident in the store; "
                    + self._suspect(sample_id, "lost"),
                )
            count = self.inner.health().sample_count
            try:
                tensors, handle = self.inner.get(sample.ref)
            except KeyError as exc:
                self._fail(
                    name,
                    f"{sample.status} sample {sample_id!r} cannot be materialised ({exc}); "
                    + self._suspect(sample_id, "lost"),
                )
            self.inner.release(handle)
            if self._is_resident(sample_id) is False or self.inner.health().sample_count < count:
                self._fail(
                    name,
                    f"releasing the only handle of {sample.status} sample {sample_id!r} freed it; suspect: "
                    "store.retain() did not retain it, or store.release() frees retained samples (they must stay "
                    "until store.scrub())",
                )
            self._compare(sample, tensors, name)

    def inv05_no_leak(self) -> None:
        """5. An acked or dead sample's bytes are gone (unless its scrub is owed), even with a crashed handle out."""
        name = "inv05_no_leak"
        for sample in self.samples.values():
            sample_id = sample.ref.sample_id
            if sample.status in SETTLED and sample_id not in self.owed and self._still_there(sample):
                self._fail(
                    name,
                    f"{sample.status} sample {sample_id!r} is still resident; " + self._suspect(sample_id, "leaked"),
                )

    def inv06_residency_exact(self) -> None:
        """6. ``resident_bytes``/``sample_count`` equal the resident samples' totals, never negative.

        Per-sample residency is inv04's and inv05's: reaching this one, the
        right samples are resident, so a mismatch is the store's accounting.
        """
        self._sync_store()
        expected = self._should_be_resident()
        count, nbytes = len(expected), sum(s.ref.estimated_bytes for s in expected)
        health = self.inner.health()
        if (health.sample_count, health.resident_bytes) != (count, nbytes) or health.resident_bytes < 0:
            held = ", ".join(f"{s.ref.sample_id!r} {s.ref.estimated_bytes} B" for s in expected) or "none"
            off = [
                f"{field} off by {got - want:+d}"
                for field, got, want in (
                    ("sample_count", health.sample_count, count),
                    ("resident_bytes", health.resident_bytes, nbytes),
                )
                if got != want
            ]
            self._fail(
                "inv06_residency_exact",
                f"health() says {health.sample_count} samples / {health.resident_bytes} B, the resident samples "
                f"({held}) total {count} / {nbytes} B; suspect: store.health() ({', '.join(off)}), or the byte "
                "accounting of store.put()/release()/scrub()",
            )

    def inv07_bounded_delivery(self) -> None:
        """7. ``redelivery_count < max_deliveries``; a sample whose deliveries are spent is dead."""
        limit = self.config.max_deliveries
        for sample in self._held():
            count = sample.live.redelivery_count if sample.live is not None else sample.deliveries
            if max(count, sample.deliveries) >= limit:
                self._fail(
                    "inv07_bounded_delivery",
                    f"{sample.ref.sample_id!r} was delivered {sample.deliveries} times and is still {sample.status} "
                    f"(max_deliveries={limit})",
                )

    def inv08_backpressure_hysteresis(self) -> None:
        """8. Pause only at/above the high watermark, resume only at/below the low one."""

    def inv09_close_drain(self) -> None:
        """9. No put after close; acquire drains; ``drained`` exactly when closed and nothing is held."""
        name = "inv09_close_drain"
        busy = any(True for _ in self._held())
        want = "open" if not self.closed else ("draining" if busy else "drained")
        if self.queue.lifecycle_state != want or self.queue.is_closed != self.closed:
            self._fail(
                name,
                f"lifecycle_state {self.queue.lifecycle_state!r} / is_closed {self.queue.is_closed}, expected {want!r}",
            )

    def inv10_expired_leases_reclaimed(self) -> None:
        """10 (safety side): every call that reaps reclaims every lease past its deadline."""

    def inv11_counters_consistent(self) -> None:
        """``stats()`` arithmetic and the counters agree with what the queue did."""
        name = "inv11_counters_consistent"
        stats = self.queue.stats()
        if stats.leased != stats.acked + stats.failed + stats.reclaimed + stats.given_back + stats.outstanding:
            self._fail(name, f"leased != acked + failed + reclaimed + given_back + outstanding in {stats}")
        if stats.put != stats.acked + stats.dead_lettered + stats.pending + stats.outstanding:
            self._fail(name, f"put != acked + dead_lettered + pending + outstanding in {stats}")
        if (stats.pending, stats.outstanding) != (self.queue.pending_count(), self.queue.outstanding_count()):
            self._fail(name, f"stats() gauges {stats} disagree with pending_count()/outstanding_count()")
        acked = sum(s.acks for s in self.samples.values())
        dead = [d.ref.sample_id for d in self.queue.dead_letters()]
        if stats.acked != acked or stats.dead_lettered != len(dead):
            self._fail(name, f"stats() {stats} vs {acked} observed acks and dead letters {dead}")

    def inv12_agrees_with_spec_mirror(self) -> None:
        """The implementation's observable state is the spec mirror's (aligned for owed scrubs)."""
        name = "inv12_agrees_with_spec_mirror"
        mirror = self.mirror
        stats = dataclasses.asdict(self.queue.stats())
        self._sync_store()
        spec_stats = mirror.stats()
        diff = {k: (stats.get(k), spec_stats.get(k)) for k in QUEUE_COUNTERS if stats.get(k) != spec_stats.get(k)}
        if diff:
            self._fail(name, f"stats() differ from the spec (impl, spec): {diff}")
        for sample_id in self.config.sample_ids:
            sample = self.samples.get(sample_id)
            status = sample.status if sample is not None else "absent"
            if status != mirror.status(sample_id):
                self._fail(name, f"{sample_id!r} is {status}, the spec says {mirror.status(sample_id)}")
            resident = self._is_resident(sample_id)
            if resident is not None and resident != (sample_id in mirror.resident()):
                self._fail(name, f"{sample_id!r} resident={resident}, the spec resident set is {mirror.resident()}")
        if list(self.pending) != mirror.pending_order():
            self._fail(name, f"pending order {list(self.pending)}, the spec's FIFO is {mirror.pending_order()}")
        dead = [d.ref.sample_id for d in self.queue.dead_letters()]
        if dead != mirror.dead_letters():
            self._fail(name, f"dead letters {dead}, the spec's are {mirror.dead_letters()}")
        health = self.inner.health()
        if health.resident_bytes != mirror.resident_bytes or health.sample_count != len(mirror.resident()):
            self._fail(name, f"health() {health} vs the spec's {mirror.resident_bytes} B in {mirror.resident()}")
        states = (self.queue.backpressure_state, self.queue.lifecycle_state)
        if states != (mirror.backpressure_state, mirror.lifecycle_state):
            self._fail(
                name,
                f"(backpressure, lifecycle) {states}, the spec's {(mirror.backpressure_state, mirror.lifecycle_state)}",
            )
        actions = [action for action, _ in self.trace.events if action not in UNMODELLED_EVENTS]
        spec_actions = [action for action, _ in mirror.events if action not in UNMODELLED_EVENTS]
        if actions != spec_actions:
            self._fail(name, f"trace {actions[-6:]} differs from the spec's {spec_actions[-6:]}")
        self._check_trace_fields(name)

    def _check_trace_fields(self, name: str) -> None:
        """The newest traced state (when the backend traces it) is the queue's: counts, clock, deadlines."""
        fresh, self._trace_seen = self.trace.events[self._trace_seen :], len(self.trace.events)
        stated = [fields for _, fields in fresh if "pending" in fields]
        if stated and (stated[-1]["pending"], stated[-1]["outstanding"]) != (len(self.pending), self._leased_count()):
            self._fail(name, f"the last traced event {stated[-1]} disagrees with the queue's counts")
        for action, fields in fresh:
            if "now" in fields:
                if not self._traced_now <= fields["now"] <= self.clock.now:
                    self._fail(
                        name,
                        f"{action} traced now={fields['now']}: the clock went {self._traced_now} -> {self.clock.now}",
                    )
                self._traced_now = fields["now"]
            if action in (events.ACQUIRE, events.EXTEND) and "deadline" in fields:
                sample = self.samples.get(str(fields.get("sample_id")))
                if sample is not None and sample.live is not None and fields["deadline"] > sample.deadline:
                    self._fail(name, f"{action} traced deadline {fields['deadline']} after {sample.deadline}")

    def _leased_count(self) -> int:
        return sum(1 for s in self.samples.values() if s.status == "leased")

    def inv13_producer_progress(self) -> None:
        """11. A blocked put waits only while the queue can still lower residency; otherwise it finishes."""

    def inv14_store_faults_survivable(self) -> None:
        """12/13. Store faults: settlements stand, errors are counted, owed scrubs go through once the store heals."""
        name = "inv14_store_faults_survivable"
        raised_before = sum(self.store.raised[call] for call in QUEUE_CALLS)
        stats = self.queue.stats()  # a queue call: it pays what the queue owes a healed store
        self._sync_store()
        raised = sum(self.store.raised[call] for call in QUEUE_CALLS)
        # Faults of the stats() call itself (its retries, a gc after its snapshot) may fall on either side.
        if not raised_before <= stats.store_errors <= raised:
            self._fail(name, f"stats().store_errors is {stats.store_errors}, the store raised {raised} times")
        owed = len(self.owed) + len(self.owed_unretain)
        if stats.scrub_backlog != owed:
            self._fail(name, f"stats().scrub_backlog is {stats.scrub_backlog}, the store is owed {owed} calls")
        if owed and not (self.store.armed("scrub") or self.store.armed("unretain")):
            self._fail(name, f"the store is healthy, yet a queue call left {sorted(self.owed)} unscrubbed")

    def inv15_callbacks(self) -> None:
        """``on_dead_letter`` once per dead letter, ``on_pause`` once per pause; callbacks never break the queue."""
        name = "inv15_callbacks"
        dead = [d.ref.sample_id for d in self.queue.dead_letters()]
        if self.dead_seen != dead:
            self._fail(name, f"on_dead_letter saw {self.dead_seen}, the dead letters are {dead}")
        if len(self.pause_seen) != self.queue.stats().producer_pauses:
            self._fail(name, f"on_pause ran {len(self.pause_seen)} times for {self.queue.stats().producer_pauses}")

    def inv16_incarnations_never_cross(self) -> None:
        """A handle or ref of an earlier put of an id never frees, serves, retains or scrubs a later put of it."""

    def inv17_acked_only_if_trained(self) -> None:
        """16 (design numbering). Nothing is counted as trained that was not: a sample the consumers' schema
        refuses is rejected -- dead-lettered at once with reason ``schema``, never acked or redelivered."""


# The order they are checked in after every step: the first violated one is reported.
INVARIANTS = tuple(name for name in vars(QueueInvariants) if name.startswith("inv"))

"""The engine contract: the few state changes a queue backend implements under the shared coordinator.

``featurestream.core.coordinator.Coordinator`` writes every public ``LeaseQueue`` call once: argument checks, the
lock, the owed-call backlog, retains, backpressure, callbacks, stats and tracing, and the lease machines.
An ``Engine`` keeps the queue's state (in this process's memory, in Redis, ...) and changes it in a handful
of primitives. It tells the coordinator what each change did by *reporting events*: it calls the ``report``
it was built with, in the order the changes happened, with one of the event types below. The front
end applies each at once: it fires the lease machine on the event's model (a trigger the table does not
allow raises ``IllegalTransition``), traces the event, scrubs or releases the bytes the queue is done with
(or owes the store that call), queues ``on_dead_letter`` and wakes blocked producers.

An event's ``trace`` is the complete set of fields its tracer event carries (the sample, the lease, the
queue state it left: ``n``, ``pending``, ``outstanding``, ``now``, a lease's ``deadline``), or ``None`` when
the queue is not traced: an untraced engine builds no trace fields at all. ``model`` is a ``LeaseModel``:
the lease-machine model of one lease, which the engine keeps as long as it can report about that lease.

The coordinator builds its engine: ``Coordinator(store, ..., engine=factory)`` calls ``factory(context)`` with an
``EngineContext`` (the report sink, the lock, the shared settings) once it has checked its arguments. A new
backend is an engine (a class meeting ``Engine``), its factory and a test module: see ``docs/architecture.md``.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

from featurestream.common.refs import SampleRef
from featurestream.core.lease import DeadLetter, Lease, VisibilityTimeout
from featurestream.core.machines import LEASE
from featurestream.core.resume import TrainingLedger
from featurestream.stores.base import StoreHealth

__all__ = [
    "Admitted",
    "Closed",
    "DeadLettered",
    "DedupRefused",
    "Drained",
    "Engine",
    "EngineContext",
    "EngineFactory",
    "Event",
    "Extended",
    "Holds",
    "LeaseModel",
    "Leased",
    "Purged",
    "Reaped",
    "Reclaimed",
    "Refusal",
    "Released",
    "Report",
    "Requeued",
    "Settled",
    "Snapshot",
    "Stale",
    "Trace",
]

Trace = Mapping[str, object]


class LeaseModel:
    """The lease machine's model of one delivery: ``state`` is the machine's, ``lease_id`` is set once leased.

    Its ``str`` names it in an ``IllegalTransition`` (``lease 7 of sample 's0'``).
    """

    __slots__ = ("lease_id", "sample_id", "state")

    def __init__(self, sample_id: str, lease_id: int | None = None, state: str = LEASE.initial) -> None:
        self.sample_id = sample_id
        self.lease_id = lease_id
        self.state = state

    def __str__(self) -> str:
        if self.lease_id is None:
            return f"the delivery of sample {self.sample_id!r}"
        return f"lease {self.lease_id} of sample {self.sample_id!r}"


# Events are read-only by contract (the coordinator only reads them) but not frozen: a frozen dataclass's __init__
# sets each field through object.__setattr__, several times a plain slotted one's cost, and every lifecycle
# builds two events per sample (docs/performance.md).
_event = dataclasses.dataclass(slots=True)
_frozen = dataclasses.dataclass(frozen=True, slots=True)


@_event
class Admitted:
    """A sample was enqueued (traced ``Put``). The coordinator only traces it, so an untraced engine may leave it
    unreported (both engines do: it is the one event of the in-process put)."""

    sample_id: str
    trace: Trace | None


@_event
class DedupRefused:
    """A put of an id the dedup window remembers was refused (traced ``DedupRefused``)."""

    sample_id: str
    trace: Trace | None


@_event
class Leased:
    """``model`` was leased as ``lease`` (fires ``lease``; traced ``Acquire``)."""

    model: LeaseModel
    lease: Lease
    trace: Trace | None


@_event
class Extended:
    """``model``'s deadline moved (fires ``extend``; traced ``Extend``)."""

    model: LeaseModel
    trace: Trace | None


@_event
class Settled:
    """``model`` was settled by ``trigger`` (``ack``, ``fail`` or ``give_back``; traced ``Ack`` / ``Fail`` /
    ``GiveBack``: a given-back model is pending again, its delivery uncounted, and may be leased anew).

    ``scrub``: the sample's bytes this instance's store is now done with (an ack's). ``retried``: a retried
    call whose first run settled the lease and whose reply (with its events) was lost; a retried fail's sample
    was dead-lettered then (traced ``DeadLetter`` too).
    """

    model: LeaseModel
    trigger: str
    scrub: SampleRef | None
    trace: Trace | None
    retried: bool = False


@_event
class Reclaimed:
    """``model``'s lease was reclaimed: past its deadline, or, for a lease this instance holds, by a call it did
    not see (fires ``reclaim``; traced ``Reclaim`` when ``trace`` is given). The sample is redelivered, or
    dead-lettered (a ``DeadLettered`` follows)."""

    model: LeaseModel
    trace: Trace | None


@_event
class DeadLettered:
    """``letter`` joined the dead letters (traced ``DeadLetter``; runs ``on_dead_letter``); unless ``kept``,
    this instance's store is done with its bytes."""

    letter: DeadLetter
    kept: bool
    trace: Trace | None


@_event
class Stale:
    """A settle or extend named a lease the queue does not honour (traced ``StaleRejected``).

    ``lease`` and ``why``: the lease to log as rejected (once per lease), when the engine knows it.
    """

    op: str
    lease: Lease | None
    why: str
    trace: Trace | None


@_event
class Released:
    """This instance's store is done with ``ref``'s bytes (settled elsewhere, purged): scrub it."""

    ref: SampleRef


@_event
class Requeued:
    """A kept dead letter went back to the tail (traced ``RequeueDeadLetter``)."""

    sample_id: str
    trace: Trace | None


@_event
class Purged:
    """A dead letter was dropped for good (traced ``PurgeDeadLetter``); kept bytes follow as ``Released``."""

    sample_id: str
    trace: Trace | None


@_event
class Closed:
    """The queue was closed (traced ``Close``): blocked producers wake to their ``QueueClosed``."""

    trace: Trace | None


@_event
class Drained:
    """The closed queue holds nothing any more (traced ``Drain``): the reaper stops once nothing is owed."""

    trace: Trace | None


Event = (
    Admitted
    | DedupRefused
    | Leased
    | Extended
    | Settled
    | Reclaimed
    | DeadLettered
    | Stale
    | Released
    | Requeued
    | Purged
    | Closed
    | Drained
)
Report = Callable[[Event], None]
Holds = Callable[[Sequence[str]], set[str]]


@_frozen
class EngineContext:
    """What the coordinator gives the engine it builds: where to report, the lock, the shared settings.

    ``report`` applies one event (call it under ``lock``, in order); ``lock`` is held around every engine call but
    ``wait``; ``traced``: build trace fields (``None`` otherwise); ``max_deliveries``, ``dedup_window`` and
    ``keep_dead_letter_bytes`` are the checked constructor values; ``owes_scrub(sample_id)``: whether this
    instance still owes its store that sample's scrub (a re-put of it is refused).
    """

    report: Report
    lock: threading.Lock
    traced: bool
    visibility_timeout: VisibilityTimeout
    max_deliveries: int
    dedup_window: int
    keep_dead_letter_bytes: int
    owes_scrub: Callable[[str], bool]


@_frozen
class Refusal:
    """A put the engine refused after the coordinator retained its samples: ``error`` to raise (``None``: an
    ``if_idle`` put into a queue that holds samples, which is no error), and the refs to un-retain (those whose
    id the queue does not hold: a held id's retain belongs to the queued sample)."""

    error: Exception | None
    unretain: tuple[SampleRef, ...]


@_frozen
class Reaped:
    """What ``reap`` did and left: ``count`` leases reclaimed, the lifecycle ``state`` (``open``, ``draining``,
    ``drained``) and whether the queue ``holds`` any sample (pending or leased, put by any instance)."""

    count: int
    state: str
    holds: bool


@_frozen
class Snapshot:
    """One consistent read of the queue: its lifecycle ``state``, the ``QueueStats`` counters with the
    ``pending`` and ``outstanding`` gauges, and, when asked for, the seconds (by the queue's clock) since the
    oldest live lease was issued (``None``: none is out, or not asked); the ``cause`` a failed producer closed
    the queue with (``close``), if one did."""

    state: str
    counters: dict[str, int]
    oldest_lease_age: float | None = None
    cause: str | None = None


class Engine(Protocol):
    """What a queue backend implements: the queue's state and its primitive changes.

    The coordinator calls every method with its lock held, except ``wait``. Every primitive that changes state
    first reaps due leases (reporting ``Reclaimed`` and what followed), as every queue call does; it reports
    each change as an event, in order, before it returns. Errors are ``common.errors``' types. A method returns
    only what the coordinator needs to answer its caller.

    ``max_batch`` is a limit, not a capability: the most items one batch call takes (``None``: no cap; the Redis
    engine's is what one server call carries). The coordinator refuses a longer batch with one message for every
    backend, before any engine call.
    """

    max_batch: int | None

    def screen(self, batch: list[SampleRef], check: Callable[[SampleRef], None]) -> None:
        """Before any store call: raise ``put``'s error for the first ref of ``batch`` the queue refuses
        (closed, held, in the dedup window -- reported ``DedupRefused`` --, a kept dead letter), calling
        ``check`` on each ref it lets through (the coordinator's own refusals)."""

    def admit(self, batch: list[SampleRef], health: StoreHealth | None, *, if_idle: bool) -> Refusal | None:
        """Enqueue ``batch`` (retained, screened), all or none; ``if_idle``: only into a queue holding nothing.
        ``health``: the store read a producer's put was decided on, whose resident bytes its ``Put`` traces."""

    def lease(self, n: int, wait: float) -> tuple[list[Lease], object | None]:
        """Lease up to ``n`` heads (reported ``Leased``). Returns ``(leases, None)`` with at least one, or when
        the queue is drained (``[]``); otherwise ``([], wake)``: what ``wait`` blocks on (the engine's own
        value). ``wait``: how long the caller will wait after an empty-handed call (an engine may register it,
        so a put elsewhere wakes it)."""

    def wait(self, wake: object, seconds: float) -> None:
        """Without the lock: block at most ``seconds`` until a lease may be available (``wake``: what the empty
        ``lease`` call returned), cut short at the next lease deadline."""

    def settle(self, action: str, leases: list[Lease], why: str = "") -> list[bool]:
        """``ack``, ``fail``, ``lose``, ``reject`` or ``give_back`` each of ``leases`` in order (reported ``Settled``
        -- a fail's redelivery or ``DeadLettered`` with it -- or ``Stale``); per lease, whether it took effect.
        ``reject`` dead-letters at once with the reason ``why``, keeping the bytes as any dead letter's.
        ``give_back``: the lease was not used; its sample goes back to the pending tail with its redelivery count
        unchanged."""

    def extend(self, lease: Lease, seconds: float) -> bool:
        """Move the live ``lease``'s deadline to now + ``seconds``, also on the object (reported ``Extended``);
        ``False``: it is not live (nothing changed)."""

    def reap(self) -> Reaped:
        """Reclaim every due lease; say how many, and what the queue holds after."""

    def close(self, cause: str | None) -> None:
        """Refuse further puts (reported ``Closed``, and ``Drained`` when nothing is held); closing a closed
        queue changes nothing but recording ``cause``. ``cause``: why a failed producer closed it, kept where
        every instance reads it (``Snapshot.cause``); the first one stands."""

    def repair(self, action: str, sample_ids: Iterable[str] | None) -> list[str]:
        """``requeue`` or ``purge`` the dead letters ``sample_ids`` (``None``: all), all of them or raise (nothing
        changed): the bodies of ``requeue_dead_letters`` and ``purge_dead_letters`` (a purge's kept bytes are
        reported ``Released``)."""

    def count_pause(self) -> None:
        """Count a producer pause in the queue's stats."""

    def held(self, sample_ids: Sequence[str]) -> set[str]:
        """Which of ``sample_ids`` the queue holds (pending or leased, put by any instance); raises when it cannot
        tell (the coordinator then keeps a refused put's retains: un-retaining a queued sample would lose it)."""

    def training_ledger(self, holds: Holds) -> TrainingLedger:
        """A new training ledger (``docs/resume.md``) kept where the queue's state is; ``holds`` is ``held`` under
        the coordinator's lock, which the ledger calls without it."""

    def trace_state(self) -> dict[str, object]:
        """The queue state a coordinator event (a store fault, a pause) is traced with: ``pending``,
        ``outstanding``, ``now`` as the engine knows them."""

    def snapshot(self, *, lease_ages: bool = False) -> Snapshot:
        """The queue's state and counters, one consistent read; ``lease_ages``: also the oldest live lease's age
        (an engine may have to read every live lease for it)."""

    def dead_letters(self, newest: int | None) -> list[DeadLetter]:
        """The dead letters, oldest first; only the ``newest`` ones when it is given."""


EngineFactory = Callable[[EngineContext], Engine]

"""``LeaseQueue``: the contract every queue backend meets, as its users see it.

``SampleRefQueue`` (in-process) and ``RedisSampleRefQueue`` satisfy it; the
loader, the async pipeline and ``featurestream.testing`` are typed against it,
so a new backend (Postgres, NATS ...) runs the same stateful suite. A backend
meets it by subclassing ``core.coordinator.Coordinator`` over an engine: the backend
writer's contract is ``core.engine.Engine``. The semantics are those of
``spec/LeaseQueue.tla``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

from featurestream.common.refs import SampleRef
from featurestream.core.lease import DeadLetter, Lease
from featurestream.stores.base import FeatureStore

__all__ = ["LeaseQueue"]


@runtime_checkable
class LeaseQueue(Protocol):
    """A lease / ack / fail queue over tensor-free ``SampleRef``s whose bytes live in ``store``.

    Each delivery attempt is a lease (``pending -> leased -> acked | failed |
    reclaimed``). A failed or expired lease sends its sample to the tail as a
    new lease, until ``max_deliveries`` is spent and it is dead-lettered.
    While the queue holds a sample its store retains it; when the sample is
    acked or dead the store scrubs it. Expired leases are reclaimed by every
    call (and by an optional reaper thread). Every method is thread-safe.

    Store faults. A queue operation either takes effect completely or changes
    nothing, whatever the store raises:

    - ``retain`` raises: the put raises an error of the same type naming the
      sample; nothing is enqueued and the store is left as it was (the queue
      un-retains the sample, retrying that ``unretain`` if it fails too).
    - ``scrub`` raises after an ack or a dead-letter (in ``ack``, ``fail``, a
      reap by any call, or the reaper thread): the settlement stands -- the
      sample is recorded in the dedup window, never delivered again, and
      ``on_dead_letter`` runs exactly once. ``ack`` returns normally; the error
      is logged, counted in ``stats().store_errors``, and the sample joins the
      scrub backlog (``stats().scrub_backlog``), retried at the start of every
      later queue call and by the reaper thread until the bytes leave the store.
      A put of a sample whose scrub is still owed is refused.
    - ``health`` raises in ``put_blocks_until_below``: that call raises an
      error of the store's type naming the sample; nothing changed.
    - ``gc`` raises: logged, counted, ignored.

    A fault belonging to one sample never surfaces from another caller (a
    consumer's ``acquire`` or a producer's ``put`` that reaped an expired
    lease) and never stops that caller's own work. Callbacks (``on_pause``,
    ``on_resume``, ``on_dead_letter``) run outside the queue's lock, so they
    may call the queue; one that raises is logged and ignored. ``close`` moves
    to ``drained`` once nothing is pending or leased: it does not wait for the
    scrub backlog.

    Dead-letter repair. With ``keep_dead_letter_bytes`` > 0 a dead-lettered
    sample's bytes stay retained (counted in the store's residency, so in
    backpressure) while the kept bytes fit that cap; past it, a new dead
    letter is scrubbed as usual. ``requeue_dead_letters`` sends kept dead
    letters back with a fresh delivery budget, ``purge_dead_letters`` drops
    dead letters and frees what was kept. Batches: ``put_many`` (all or
    none), ``acquire_many``, ``ack_many`` / ``fail_many`` (stale leases
    rejected one by one), each one operation traced as its per-item events.
    """

    max_deliveries: int
    dedup_window: int

    @property
    def store(self) -> FeatureStore: ...

    def put(self, ref: SampleRef) -> None:
        """Enqueue at the tail without waiting on backpressure."""

    def put_many(self, refs: Iterable[SampleRef]) -> None:
        """Enqueue every ref, in order: all of them or none (the error ``put`` raises for the first offender)."""

    def put_blocks_until_below(
        self, ref: SampleRef, poll_interval: float = 0.05, abort_when: Callable[[], bool] | None = None
    ) -> None:
        """Enqueue once backpressure lets the producer through; ``RuntimeError`` when closed or aborted."""

    def acquire(self, poll_interval: float = 0.05, *, timeout: float | None = None) -> Lease | None:
        """Lease the head, waiting up to ``timeout``; ``None`` when the wait ends empty-handed."""

    def acquire_many(self, n: int, *, timeout: float | None = None) -> list[Lease]:
        """Lease up to ``n`` heads, returning as soon as one is available; ``[]`` when the wait ends empty."""

    def ack(self, lease: Lease) -> bool:
        """Settle the lease's sample for good: ``True``; a stale lease changes nothing: ``False`` (logged once).

        ``TypeError`` for anything that is not a ``Lease``.
        """

    def fail(self, lease: Lease) -> bool:
        """Redeliver the lease's sample from the tail, or dead-letter it: ``True``; a stale lease changes nothing:
        ``False`` (logged once). ``TypeError`` for anything that is not a ``Lease``."""

    def lose(self, lease: Lease) -> bool:
        """The store lost the lease's sample: dead-letter it at once (reason ``lost``), never redeliver it."""

    def reject(self, lease: Lease, why: str) -> bool:
        """No consumer can train the lease's sample: dead-letter it at once (reason ``schema: <why>``), never
        redeliver it; counted as a dead letter, never as acked. ``False`` for a stale lease (nothing changed)."""

    def give_back(self, lease: Lease) -> bool:
        """Hand the unused lease back: its sample is pending again and the delivery does not count towards
        ``max_deliveries``; a stale lease changes nothing: ``False``."""

    def give_back_many(self, leases: Iterable[Lease]) -> None:
        """``give_back`` each lease in order; each stale one is rejected on its own (``TypeError``, none given
        back, for a non-lease)."""

    def ack_many(self, leases: Iterable[Lease]) -> None:
        """``ack`` each lease in order; each stale one is rejected on its own (``TypeError``, none acked, for a
        non-lease)."""

    def fail_many(self, leases: Iterable[Lease]) -> None:
        """``fail`` each lease in order; each stale one is rejected on its own (``TypeError``, none failed, for a
        non-lease)."""

    def extend(self, lease: Lease, seconds: float | None = None) -> None:
        """Push the lease's deadline out; ``LeaseLost`` when it is not live, ``TypeError`` for a non-lease."""

    def reclaim_expired(self) -> int:
        """Redeliver or dead-letter every lease past its deadline; return how many."""

    def close(self, *, cause: str | None = None) -> None:
        """Refuse further puts; consumers drain what is held. ``cause``: why a failed producer ends the run
        (``close_cause`` in every process; the loader raises ``ProducerFailed`` with it)."""

    @property
    def close_cause(self) -> str | None:
        """Why a failed producer closed the queue, or ``None``."""

    @property
    def is_closed(self) -> bool: ...

    @property
    def lifecycle_state(self) -> str: ...

    @property
    def backpressure_state(self) -> str: ...

    def pending_count(self) -> int: ...

    def outstanding_count(self) -> int: ...

    def dead_letters(self, newest: int | None = None) -> list[DeadLetter]:
        """Dead letters, oldest first; only the newest ``newest`` when given."""

    def requeue_dead_letters(self, sample_ids: Iterable[str] | None = None) -> list[str]:
        """Send kept dead letters (``None``: all) back with a fresh delivery budget: all or nothing."""

    def purge_dead_letters(self, sample_ids: Iterable[str] | None = None) -> list[str]:
        """Drop dead letters (``None``: all) for good, freeing kept bytes: all or nothing."""

    def oldest_lease_age(self) -> float | None:
        """Seconds since the oldest live lease was issued; ``None`` when none is out."""

    def stats(self) -> object:
        """A consistent ``QueueStats`` snapshot of counters and gauges."""

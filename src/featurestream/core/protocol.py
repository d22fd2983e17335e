"""``LeaseQueue``: the contract every queue backend implements.

``SampleRefQueue`` (in-process) and ``RedisSampleRefQueue`` satisfy it; the
loader, the async pipeline and ``featurestream.testing`` are typed against it,
so a new backend (Postgres, NATS ...) that implements these members runs the
same stateful suite. The semantics are those of ``spec/LeaseQueue.tla``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol, runtime_checkable

from featurestream.core.lease import DeadLetter, Lease
from featurestream.core.refs import SampleRef
from featurestream.stores.base import FeatureStore

__all__ = ["LeaseQueue"]


@runtime_checkable
class LeaseQueue(Protocol):
    """A lease / ack / fail queue over tensor-free ``SampleRef``s whose bytes live in ``store``."""

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

    def close(self) -> None:
        """Refuse further puts; consumers drain what is held."""

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

"""Pulling batches for ``FeatureDataLoader``: lease, check, materialise, collate — on any one thread.

``Puller.pull`` is what the loader runs on the trainer's thread
(``prefetch=0``) or on its prefetch thread; it holds no reference to the
loader, so an abandoned loader can be garbage-collected (and its prefetched
leases given back).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import torch

from featurestream.common.refs import FeatureAlgorithm, algorithm_name
from featurestream.core.lease import SCHEMA_REASON, Lease
from featurestream.core.protocol import LeaseQueue
from featurestream.pipeline.batching import acquire_many, concat_samples, fail_many, give_back_many
from featurestream.pipeline.prefetch import LeaseBook, Pulled
from featurestream.pipeline.schemas import AlgorithmSchema, make_batch, registered_schemas, unregistered_message
from featurestream.pipeline.supervision import SupervisionDecoder
from featurestream.stores.base import FeatureStore, SampleLostError, StoreHandle
from featurestream.stores.pool import pinned_copy

__all__ = ["Collate", "PullSpec", "Puller", "stream_ended"]

logger = logging.getLogger(__name__)

Collate = Callable[[list[dict[str, torch.Tensor]]], Any]

_BETWEEN_CALLS = "no queue or store call (between them)"


@dataclasses.dataclass(frozen=True)
class PullSpec:
    """What a pull needs; holds no reference to the loader, so an abandoned loader can be collected."""

    queue: LeaseQueue
    store: FeatureStore
    schema: AlgorithmSchema
    batch_type: type
    collate_fn: Collate | None
    batch_size: int
    device: torch.device | None
    non_blocking: bool
    pin_memory: bool
    wait: float
    # Checks each ref's supervision encoding against the loader's target head and rebuilds the logits it stands for.
    supervision: SupervisionDecoder
    # Lockstep ranks end their stream when the queue is closed with nothing pending, not at the drain: the
    # leases still out may be their peers' batches, held while those peers wait for this rank's vote.
    end_when_nothing_pending: bool
    # Resuming (``pipeline.resume.TrainerResume``): which leased samples to train (the others are dropped), and
    # whether every prompt of the epoch is trained (the stream's end while the queue stays open for restores).
    admit: Callable[[list[Lease]], list[Lease]] | None = None
    epoch_done: Callable[[int], bool] | None = None

    @property
    def async_copy(self) -> bool:
        return self.non_blocking and self.device is not None and self.device.type == "cuda"


def stream_ended(spec: PullSpec, own: int) -> bool:
    """Whether nothing will ever come: closed, nothing pending, no lease out but the ``own`` this loader holds;
    or, resuming, nothing pending and every prompt of the epoch trained but the ``own``."""
    queue = spec.queue
    if spec.epoch_done is not None and queue.pending_count() == 0 and spec.epoch_done(own):
        return True
    if not queue.is_closed or queue.pending_count() > 0:
        return False
    return spec.end_when_nothing_pending or queue.outstanding_count() <= own


def _algorithm_name(algorithm: FeatureAlgorithm | str) -> str:
    if isinstance(algorithm, FeatureAlgorithm):
        return f"{type(algorithm).__name__}.{algorithm.name}"
    return repr(algorithm)  # a user algorithm's name


class Puller:
    """Leases, checks and materialises samples and builds batches of ``batch_size``; one thread at a time.

    Every lease it takes is booked in ``book`` until the loader hands the
    batch over; samples already materialised when a later one fails stay
    booked for the next batch, and the errors come out one per pull, in order.
    """

    def __init__(self, spec: PullSpec, book: LeaseBook) -> None:
        self._spec = spec
        self.book = book
        self._ready: list[tuple[Lease, StoreHandle, dict[str, torch.Tensor]]] = []
        self._errors: collections.deque[BaseException] = collections.deque()
        # The queue or store call a pull is in, read from another thread by a close that times out.
        self._activity = _BETWEEN_CALLS

    def activity(self) -> str:
        """The queue or store call the current pull is in, e.g. ``store.get('s-1')``."""
        return self._activity

    def pull(self, stopping: Callable[[], bool]) -> Pulled | None:
        """The next batch or error; ``None`` at the end of the stream (a last batch may be short) or when stopping."""
        spec = self._spec
        while not self._errors and len(self._ready) < spec.batch_size:
            if stopping():
                return None
            self._activity = "queue.acquire"
            try:
                leases = acquire_many(spec.queue, spec.batch_size - len(self._ready), timeout=spec.wait)
                if leases and spec.admit is not None:
                    leases = spec.admit(leases)
                    if not leases:
                        continue
            finally:
                self._activity = _BETWEEN_CALLS
            if not leases:
                if stream_ended(spec, self.book.count()):
                    break
                continue
            for index, lease in enumerate(leases):
                if not self.book.add(lease):  # the loader closed meanwhile: hand these back untouched
                    give_back_many(spec.queue, leases[index:])
                    return None
            for lease in leases:
                self._drop_expired_copy(lease)
                try:
                    sample = self._materialise(lease)
                except Exception as exc:
                    self._errors.append(exc)
                else:
                    if sample is None:
                        return None
                    self._ready.append(sample)
        if self._errors:
            return Pulled([], [], error=self._errors.popleft())
        if not self._ready:
            return None
        samples, self._ready = self._ready[: spec.batch_size], self._ready[spec.batch_size :]
        return self._collate(samples)

    def _drop_expired_copy(self, lease: Lease) -> None:
        """A sample leased again while its earlier lease waited in ``_ready`` (it expired while the batch
        filled, unheartbeated): the new lease replaces the old one, so a batch never holds a sample twice."""
        sample_id = lease.ref.sample_id
        for index, (old, handle, _) in enumerate(self._ready):
            if old.ref.sample_id == sample_id:
                del self._ready[index]
                self.book.forget(old)
                self._spec.store.release(handle)
                return

    def _materialise(self, lease: Lease) -> tuple[Lease, StoreHandle, dict[str, torch.Tensor]] | None:
        """Check and read one leased sample; settle it and raise as the loader contract says; ``None`` if closed."""
        spec, ref = self._spec, lease.ref
        if ref.algorithm != spec.schema.algorithm:
            self.book.forget(lease)
            spec.queue.fail(lease)
            # A user algorithm this process never registered: say how to, the likeliest fix.
            unknown = "" if ref.algorithm in registered_schemas() else f"; {unregistered_message(ref.algorithm)}"
            raise ValueError(
                f"FeatureDataLoader is bound to algorithm={_algorithm_name(spec.schema.algorithm)}, but sample "
                f"{ref.sample_id!r} is {_algorithm_name(ref.algorithm)} ({algorithm_name(ref.algorithm)}); "
                f"its lease was failed so a matching consumer can take it{unknown}"
            )
        try:
            checked = spec.supervision.check(ref)
        except ValueError as exc:
            self.book.forget(lease)
            spec.queue.fail(lease)
            raise ValueError(f"{exc}; its lease was failed (redelivered, not acked)") from None
        try:
            spec.schema.validate_ref(checked)
        except ValueError as exc:
            self.book.forget(lease)
            # Every consumer of its algorithm would refuse it alike: dead now, never counted as trained.
            if spec.queue.reject(lease, str(exc)):
                logger.warning("sample %r dead-lettered (reason %s): %s", ref.sample_id, SCHEMA_REASON, exc)
            raise ValueError(f"{exc}; the sample was dead-lettered (reason {SCHEMA_REASON}, never trained)") from None
        self._activity = f"store.get({ref.sample_id!r})"
        try:
            if spec.async_copy:
                tensors, handle = spec.store.get(ref)
                tensors = {n: t.pin_memory().to(spec.device, non_blocking=True) for n, t in tensors.items()}
            elif spec.device is not None:
                tensors, handle = spec.store.get(ref, spec.device)
            else:
                tensors, handle = spec.store.get(ref)
        except KeyError as exc:
            self.book.forget(lease)
            if ref.store_uri != spec.store.store_uri:  # another store's ref: a consumer of the right one may read it
                spec.queue.fail(lease)
                raise
            # The store the queue retains it in no longer holds it, while the lease is live: its bytes were lost
            # (deleted under the queue, evicted, a server restarted). A redelivery could only fail again, so it is
            # dead-lettered now; a stale lease (the sample was settled through another) changes nothing.
            if not spec.queue.lose(lease) or isinstance(exc, SampleLostError):
                raise
            raise SampleLostError(ref.sample_id, spec.store.store_uri, str(exc.args[0] if exc.args else exc)) from exc
        except Exception:
            self.book.forget(lease)
            spec.queue.fail(lease)
            raise
        finally:
            self._activity = _BETWEEN_CALLS
        if not self.book.attach(lease, handle):  # closed meanwhile: the book failed the lease back
            spec.store.release(handle)
            return None
        return lease, handle, tensors

    def _collate(self, samples: list[tuple[Lease, StoreHandle, dict[str, torch.Tensor]]]) -> Pulled:
        spec = self._spec
        leases = [lease for lease, _, _ in samples]
        handles = [handle for _, handle, _ in samples]
        try:
            tensors = [spec.supervision.decode(lease.ref, sample) for lease, _, sample in samples]
            if spec.collate_fn is not None:
                batch = spec.collate_fn(tensors)
            else:
                # The batch holds the schema's features; a recipe's own ones reach a collate_fn only.
                order = spec.schema.feature_order
                known = [{name: sample[name] for name in order if name in sample} for sample in tensors]
                ids = [lease.ref.sample_id for lease in leases]
                merged = known[0] if len(known) == 1 else concat_samples(known, ids)
                if spec.pin_memory:
                    merged = pinned_copy(merged)
                batch = make_batch(merged, spec.batch_type)
        except Exception as exc:
            self.book.give_back(leases, handles, fail_many)  # the batch cannot be built: a failed delivery
            return Pulled([], [], error=exc)
        ready = None
        if spec.async_copy:
            ready = torch.cuda.Event()
            ready.record()
        return Pulled(leases, handles, batch=batch, ready=ready)

"""``FeatureDataLoader``: lease refs from a queue, materialise them, hand out batches.

Options beyond the reference loader (see ``docs/loader.md``): ``prefetch``
(a background thread leases and materialises ahead of the trainer),
``batch_size`` / ``collate_fn`` (k samples per batch, settled together),
``batch_type`` (the class batches are built as) and ``process_group``
(data-parallel ranks step and stop in lockstep).
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

import torch

from featurestream.common.checks import check_count, check_flag, check_seconds
from featurestream.common.errors import ProducerFailed
from featurestream.common.refs import FeatureAlgorithm
from featurestream.core.lease import Lease
from featurestream.core.protocol import LeaseQueue
from featurestream.core.resume import Restore
from featurestream.pipeline import lockstep
from featurestream.pipeline.batching import ack_many, fail_many, give_back_many
from featurestream.pipeline.eagle3 import DraftVocab
from featurestream.pipeline.prefetch import LeaseBook, LoaderCloseTimeout, Prefetcher, Pulled, Stuck
from featurestream.pipeline.pull import Collate, Puller, PullSpec, stream_ended
from featurestream.pipeline.resume import TrainerResume, ledger_of
from featurestream.pipeline.schemas import schema_for
from featurestream.pipeline.supervision import SupervisionDecoder
from featurestream.pipeline.target_head import TargetHead
from featurestream.stores.base import FeatureStore, StoreHandle

__all__ = ["FeatureDataLoader", "LoaderCloseTimeout"]

# The prefetch thread's longest single wait in ``acquire``: how soon it notices close() (a put wakes it at once).
_PREFETCH_WAIT = 0.1


class FeatureDataLoader:
    """An iterator of batches, each built from ``batch_size`` leased samples (default: one).

    Each pull leases refs (``queue.acquire`` wakes as soon as a sample is
    put), checks each against the algorithm's schema, materialises it with
    ``store.get`` and builds a batch (``batch_type``, by default the schema's:
    ``Eagle3TargetBatch`` for EAGLE-3). The batch stays valid through one
    training step: its handles are released and its leases acked on the next
    pull, or earlier by ``consume_now()``; ``fail_current()`` hands it back
    for redelivery instead. Iteration ends when the queue is closed and
    drained. ``close()`` gives back what is prefetched, settles (acks) what
    the trainer holds and, with ``close_queue`` (the default, as the
    reference), closes the queue: the end of the run. The loader is a context
    manager; leaving it with an exception ends this trainer, not the run: the
    held batch and everything prefetched are failed back (redelivered) and
    the queue stays open for the other processes sharing it.

    Options (``docs/loader.md``):

    - ``prefetch=N`` (default 2): a background thread keeps up to N batches
      leased and materialised ahead of the trainer, in FIFO order; their
      leases are kept alive by ``extend`` heartbeats (every
      ``heartbeat_interval`` seconds, default a third of the visibility
      timeout) and are given back unused (redelivered, no delivery spent) by
      ``close()``, by an error in the thread (raised to the trainer on its
      next pull) or when an abandoned loader is garbage-collected. ``0`` pulls on the trainer's
      thread, as the reference does.
    - ``close_timeout`` (default 5 s): how long ``close()`` waits for the
      prefetch thread's current pull. A thread still blocked in
      ``queue.acquire`` or ``store.get`` then is left behind and ``close()``,
      having done everything else, raises ``LoaderCloseTimeout`` naming the
      call and the leases it held (given back; nothing is lost).
    - ``batch_size=k``: k samples per batch (fewer for the last one at the end
      of the stream), acked or failed together; ``collate_fn(list of k tensor
      dicts, in lease order) -> batch`` builds it; the default concatenates
      each feature along dim 0 (equal shapes apart from dim 0 required, no
      padding) into a ``batch_type``.
    - ``batch_type``: the class batches are built as, from the tensors by
      keyword (through its ``from_tensors`` classmethod when it has one);
      e.g. a recipe's own ``Eagle3TargetBatch``. By default the schema's,
      and also the reference package's batch class when that is imported
      in this process (``AlgorithmSchema.default_batch_type``).
    - ``device`` / ``non_blocking``: where samples are materialised; with
      ``non_blocking`` and a CUDA device, the copy is pinned and asynchronous
      and the trainer's current stream waits for it at hand-off.
    - ``pin_memory`` (default ``False``): batches built by the default collation
      (``device=None``) land in page-locked host memory, one block per batch
      from torch's caching host allocator (pooled: reused once a batch and the
      copies from it are done), so the trainer's ``.to("cuda",
      non_blocking=True)`` overlaps with compute. ``RuntimeError`` where CUDA
      is not available.
    - ``process_group``: a ``torch.distributed`` group; before each batch is
      handed out the ranks agree (one ``all_reduce``) that every rank has one,
      else every rank stops at the same step and the batches already leased
      are given back (``featurestream.pipeline.lockstep``).
    - ``target_head``: a ``featurestream.TargetHead``, for samples that
      carry the target's last hidden state instead of its logits
      (``supervision="hidden"``): the logits are rebuilt with it, batch by
      batch, on the head's device (or, with ``draft_vocab``, their
      draft-vocabulary ``target_probs`` + ``position_mask``). Without a
      head, or with one whose fingerprint is not the producer's, such a
      sample's lease is failed back and ``ValueError`` says which head to
      pass (``featurestream.pipeline.supervision``).
    - ``close_queue`` (default ``True``): whether ``close()`` closes the
      queue. ``False`` for a loader that must never end the run: a
      data-parallel rank other than the one that closes it, or a trainer of
      a queue the producers' side closes (``docs/loader.md``, who closes the
      queue).

    Resuming (``docs/resume.md``): ``state_dict()`` / ``load_state_dict()``
    follow torchdata's ``StatefulDataLoader`` convention; with a
    ``ResumableProducer`` every prompt trains exactly once in the history
    that leads to the final model, across restarts of either side.

    Errors, each leaving nothing leased: a ref of another algorithm -> its
    lease is failed (another consumer may take it) and ``ValueError``
    (``bound to algorithm=...``); a schema-invalid ref (a dtype, rank or
    token count its schema refuses, no supervision, a schema version it
    does not know) -> dead-lettered at once (``queue.reject``,
    reason ``schema`` naming the sample, the feature and what was wrong;
    logged, never redelivered, never acked) and ``ValueError``; a sample
    whose bytes the store lost (``SampleLostError``, or any ``KeyError``
    from the store its ref names while its lease is live: a queued sample
    is never freed on purpose) -> dead-lettered at once (``queue.lose``,
    reason ``lost``; never redelivered) and ``SampleLostError`` raised; any other
    error from ``store.get`` or ``collate_fn`` -> the lease(s) failed and the
    error re-raised. Each is
    raised by the pull at the sample's place in the stream. A queue closed by
    a producer that failed (``close(cause=...)``: ``AsyncFeaturePipeline``,
    ``ResumableProducer``, in any process) ends the stream with
    ``ProducerFailed`` naming the cause instead of ``StopIteration``, once the
    samples queued before the failure are handed out.
    """

    def __init__(
        self,
        queue: LeaseQueue,
        store: FeatureStore,
        *,
        algorithm: FeatureAlgorithm | str | None = None,
        acquire_poll_interval: float = 0.05,
        prefetch: int = 2,
        batch_size: int = 1,
        collate_fn: Collate | None = None,
        batch_type: type | None = None,
        device: torch.device | str | None = None,
        non_blocking: bool = False,
        pin_memory: bool = False,
        heartbeat_interval: float | None = None,
        process_group: Any = None,
        close_timeout: float = 5.0,
        close_queue: bool = True,
        target_head: TargetHead | None = None,
        draft_vocab: DraftVocab | None = None,
    ) -> None:
        check_seconds("acquire_poll_interval", acquire_poll_interval)
        check_seconds("close_timeout", close_timeout)
        check_count("prefetch", prefetch)
        check_count("batch_size", batch_size, minimum=1)
        if heartbeat_interval is not None:
            check_seconds("heartbeat_interval", heartbeat_interval, positive=True)
        if collate_fn is not None and not callable(collate_fn):
            raise TypeError(f"collate_fn must be callable, got {collate_fn!r}")
        if batch_type is not None and not isinstance(batch_type, type):
            raise TypeError(f"batch_type must be a class, got {batch_type!r}")
        check_flag("non_blocking", non_blocking)
        check_flag("pin_memory", pin_memory)
        if pin_memory and not torch.cuda.is_available():
            raise RuntimeError(
                "pin_memory=True needs CUDA (page-locked memory is for copies to a GPU), and torch finds none: "
                "leave pin_memory=False on a machine without a GPU"
            )
        check_flag("close_queue", close_queue)
        if process_group is not None:
            lockstep.check_group(process_group)
        schema = schema_for(FeatureAlgorithm.EAGLE3 if algorithm is None else algorithm)
        supervision = SupervisionDecoder(schema, target_head, draft_vocab, device)
        self._resume: TrainerResume | None = None
        if callable(getattr(queue, "training_ledger", None)):
            rank, world_size = (0, 1) if process_group is None else lockstep.rank_of(process_group)
            self._resume = TrainerResume(ledger_of(queue), rank, world_size)
        resume = self._resume
        self.queue = queue
        self.store = store
        self.algorithm = schema.algorithm
        self.batch_type = batch_type or schema.default_batch_type()
        self.acquire_poll_interval = acquire_poll_interval
        self.prefetch = prefetch
        self.batch_size = batch_size
        self.process_group = process_group
        self._heartbeat_interval = heartbeat_interval
        self.close_timeout = close_timeout
        self.close_queue = close_queue
        self._spec = PullSpec(
            queue=queue,
            store=store,
            schema=schema,
            batch_type=self.batch_type,
            collate_fn=collate_fn,
            batch_size=batch_size,
            device=None if device is None else torch.device(device),
            non_blocking=non_blocking,
            pin_memory=pin_memory,
            wait=_PREFETCH_WAIT if prefetch else acquire_poll_interval,
            supervision=supervision,
            end_when_nothing_pending=process_group is not None,
            admit=None if resume is None else functools.partial(resume.admit, queue),
            epoch_done=None if resume is None else resume.epoch_done,
        )
        self._lock = threading.Lock()
        self._pull_lock = threading.Lock()
        self._held: tuple[list[Lease], list[StoreHandle]] | None = None
        self._closed = False
        self._finished = False  # a lockstep stop: final, so no rank ever enters the agreement alone
        self._prefetcher: Prefetcher | None = None
        self._prefetch_finalizer: weakref.finalize | None = None
        # prefetch=0: the trainer's thread pulls; the book heartbeats only a candidate waiting for the other ranks.
        self._puller = Puller(self._spec, self._new_book(heartbeat=process_group is not None))

    @property
    def current_lease(self) -> Lease | None:
        """The lease of the batch last handed out and not yet settled (the first one when ``batch_size > 1``)."""
        with self._lock:
            return self._held[0][0] if self._held is not None else None

    @property
    def current_leases(self) -> tuple[Lease, ...]:
        """Every lease of the batch last handed out and not yet settled, in lease order."""
        with self._lock:
            return tuple(self._held[0]) if self._held is not None else ()

    def __iter__(self) -> FeatureDataLoader:
        return self

    def __next__(self) -> Any:
        with self._pull_lock:  # concurrent pulls take turns (one held batch: each pull settles the last one)
            with self._lock:
                if self._closed or self._finished:
                    raise StopIteration
            if self._resume is not None and not self._resume.begun:
                self._resume.begin()  # no load_state_dict: a fresh start, this rank's history starts over
            if self.process_group is not None:
                return self._next_in_lockstep()
            # Acked before the next batch is handed out, never later: a process that dies during a step
            # leaves only that step's batch unacked (it is redelivered), never one it already trained on.
            self.consume_now()
            item = self._next_pulled()
            if item is None:
                raise self._stream_end()
            return self._hand_off(item)

    def _next_in_lockstep(self) -> Any:
        """Vote, and step only if every rank has a batch; a rank that raised makes the others vote again."""
        item: Pulled | None = None
        error: Exception | None = None
        try:  # whatever this rank's pull raises (its ack's error too) is its vote, so no peer waits for it
            self.consume_now()
            item = self._next_pulled()
        except Exception as exc:
            error = exc
        while True:
            vote = lockstep.ERROR if error is not None else lockstep.HAS_BATCH if item else lockstep.NO_BATCH
            try:
                outcome = lockstep.agree(self.process_group, vote)
            except BaseException:
                self._finish(item)
                raise
            if outcome == lockstep.HAS_BATCH:
                assert item is not None
                return self._hand_off(item)
            if error is not None:
                raise error  # this rank raised; the others hold their batches and vote again on its next pull
            if outcome == lockstep.NO_BATCH:
                self._finish(item)
                raise self._stream_end()
            # Another rank's pull raised: its trainer pulls again, and this rank keeps its batch (heartbeated).

    def _stream_end(self) -> StopIteration | ProducerFailed:
        """What the end of the stream raises: ``ProducerFailed`` naming the cause a failed producer closed the
        queue with (in any process), else ``StopIteration``. A loader closed meanwhile just stops."""
        cause = None if self._is_closed() else getattr(self.queue, "close_cause", None)
        return StopIteration() if cause is None else ProducerFailed(cause)

    def _finish(self, item: Pulled | None) -> None:
        """End a lockstep stream for good: give back the candidate and everything prefetched."""
        with self._lock:
            self._finished = True
        if item is not None:
            self._puller.book.give_back(item.leases, item.handles)
        self._drop_prefetcher()

    def _next_pulled(self) -> Pulled | None:
        """The next pulled batch (raising a pull's error), skipping any whose lease a heartbeat found lost."""
        while True:
            item, book = self._pull_one()
            if item is None:
                return None
            if item.error is not None:
                raise item.error
            if book.any_lost(item.leases):
                book.give_back(item.leases, item.handles)  # reclaimed meanwhile: someone else may have it now
            elif self._resume is None or self._still_admitted(item, book):
                return item

    def _still_admitted(self, item: Pulled, book: LeaseBook) -> bool:
        """Whether every sample of ``item`` may still train; if not, drop those that may not, give back the rest.

        Admitted at pull, a sample may have been committed since by the step
        that held its earlier delivery (a step longer than the visibility
        timeout): checked again at hand-off, it never trains twice.
        """
        assert self._resume is not None
        admitted = self._resume.admit(self.queue, item.leases)
        if len(admitted) == len(item.leases):
            return True
        kept = {id(lease) for lease in admitted}
        for lease in item.leases:
            if id(lease) not in kept:
                book.forget(lease)  # acked by admit
        book.give_back(admitted, item.handles)
        return False

    def _pull_one(self) -> tuple[Pulled | None, LeaseBook]:
        if not self.prefetch:
            return self._puller.pull(self._is_closed), self._puller.book
        while True:
            with self._lock:
                if self._closed:
                    return None, self._puller.book
                if self._prefetcher is None:
                    self._start_prefetcher()
                prefetcher, book = self._prefetcher, self._puller.book
            assert prefetcher is not None
            try:
                item = prefetcher.get()
            except BaseException:
                self._drop_prefetcher()  # it failed everything back; the next pull starts afresh
                raise
            if item is not None:
                return item, book
            # The thread saw the end of the stream; confirm it now that this loader holds nothing (a batch the
            # trainer failed back since then is pending again), else start pulling again.
            self._drop_prefetcher()
            if self._is_closed() or stream_ended(self._spec, 0):
                return None, book

    def _start_prefetcher(self) -> None:
        """Start a prefetch thread (``self._lock`` held); it references the puller, not this loader."""
        puller = Puller(self._spec, self._new_book(heartbeat=True))
        prefetcher = Prefetcher(puller.pull, puller.book, self.prefetch, puller.activity)
        self._puller, self._prefetcher = puller, prefetcher
        # An abandoned loader (no close) gives its prefetched leases back when it is collected.
        self._prefetch_finalizer = weakref.finalize(self, prefetcher.close, self.close_timeout)

    def _drop_prefetcher(self) -> Stuck | None:
        """Close the prefetch thread, if any; what it is still blocked in after ``close_timeout``, if it is."""
        with self._lock:
            prefetcher, self._prefetcher = self._prefetcher, None
            finalizer, self._prefetch_finalizer = self._prefetch_finalizer, None
        if finalizer is not None:
            finalizer.detach()
        return None if prefetcher is None else prefetcher.close(self.close_timeout)

    def _new_book(self, *, heartbeat: bool) -> LeaseBook:
        return LeaseBook(self.queue, self.store, heartbeat=heartbeat, interval=self._heartbeat_interval)

    def _hand_off(self, item: Pulled) -> Any:
        self._puller.book.take(item.leases)
        if item.ready is not None:
            torch.cuda.current_stream(self._spec.device).wait_event(item.ready)
        with self._lock:
            if not self._closed:
                self._held = (item.leases, item.handles)
                return item.batch
        # Closed while this pull was in flight: give the batch back untouched.
        self._settle(item.leases, item.handles, give_back_many)
        raise StopIteration

    def _is_closed(self) -> bool:
        with self._lock:
            return self._closed

    def consume_now(self) -> None:
        """Release and ack the batch last handed out now instead of on the next pull.

        Resuming, its prompts are first committed to the training ledger as
        this rank's next step (``docs/resume.md``).
        """
        held = self._take_held()
        if held is not None:
            self._settle(*held, self._commit_and_ack)

    def _commit_and_ack(self, queue: LeaseQueue, leases: Sequence[Lease]) -> None:
        if self._resume is not None:
            self._resume.commit(leases)
        ack_many(queue, leases)

    def state_dict(self) -> dict[str, Any]:
        """This rank's resume state: small and JSON-serialisable, saved with the model's checkpoint.

        The batch last handed out counts as trained: it is committed and
        acked first. ``load_state_dict`` of a loader built the same way on a
        restarted trainer resumes after it (torchdata's ``StatefulDataLoader``
        convention). ``TypeError`` for a queue without a training ledger.
        """
        resume = self._require_resume()
        with self._pull_lock:
            if not resume.begun:
                resume.begin()
            self.consume_now()
            return resume.state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state_dict()``'s state: this rank's steps after it are rolled back in the ledger.

        Call it before the first batch. The prompts those steps trained are
        produced again by the ``ResumableProducer``; how many is logged and in
        ``last_restore.rolled_back``. ``ValueError`` for a state of another
        rank or world size, ``RuntimeError`` once this loader has started.
        """
        resume = self._require_resume()
        step = resume.check_state(state)
        with self._pull_lock:
            if resume.begun:
                raise RuntimeError(
                    f"load_state_dict({state!r}) must come before the first batch or state_dict() of this loader"
                )
            resume.begin(step)

    @property
    def last_restore(self) -> Restore | None:
        """What the restore (``load_state_dict``, or the fresh start) rolled back; ``None`` before it."""
        return None if self._resume is None else self._resume.last_restore

    def _require_resume(self) -> TrainerResume:
        if self._resume is None:
            raise TypeError(f"{type(self.queue).__name__} keeps no training ledger: this loader cannot resume")
        return self._resume

    def fail_current(self) -> None:
        """Give the batch last handed out back to the queue (redelivered, or dead once its deliveries are spent)."""
        held = self._take_held()
        if held is not None:
            self._settle(*held, fail_many)

    def _settle(
        self,
        leases: Sequence[Lease],
        handles: Sequence[StoreHandle],
        settle: Callable[[LeaseQueue, Sequence[Lease]], None],
    ) -> None:
        for handle in handles:
            self.store.release(handle)
        settle(self.queue, leases)

    def close(self) -> None:
        """Give back what is prefetched, settle (ack) the batch the trainer holds and, with ``close_queue``, close
        the queue; idempotent.

        Raises ``LoaderCloseTimeout``, once all of that is done, if the prefetch
        thread is still blocked in a queue or store call after ``close_timeout``.
        """
        self._close(self.close_queue)

    def _close(self, close_queue: bool) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        stuck = self._drop_prefetcher()
        self._puller.book.close()  # a pull in flight on another thread gives its leases back
        self.consume_now()
        if close_queue:
            self.queue.close()
        if stuck is not None:
            raise LoaderCloseTimeout(self.close_timeout, stuck.blocked_in, stuck.leases)

    def _take_held(self) -> tuple[list[Lease], list[StoreHandle]] | None:
        with self._lock:
            held, self._held = self._held, None
            return held

    def __enter__(self) -> FeatureDataLoader:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.close()
            return
        self.fail_current()  # the step did not finish: the batch goes back for redelivery
        # An error ends this trainer, not the run: the producers and trainers sharing the queue carry on.
        self._close(close_queue=False)

"""Exactly-once training across restarts: the producer and trainer sides of the training ledger.

``ResumableProducer`` produces an epoch of keyed prompts, asking the queue's
training ledger which keys are trained or queued, so a producer restarted at
any point produces only what is missing. ``TrainerResume`` is the loader's
side (``FeatureDataLoader.state_dict`` / ``load_state_dict``): it admits only
samples whose prompt is untrained, commits each step's keys before the step's
samples are acked, and rolls the rank's history back on a restore. The
protocol and its guarantee: ``docs/resume.md``; its model: ``spec/Resume.tla``.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from featurestream.common.checks import check_count, check_seconds
from featurestream.common.errors import DuplicateSample, PutAborted, QueueClosed, SettledSample
from featurestream.core.lease import Lease
from featurestream.core.protocol import LeaseQueue
from featurestream.core.resume import Restore, TrainingLedger, check_key, parse_sample_id, sample_id_for
from featurestream.pipeline.async_pipeline import Prompt, close_failed, prompt_kwargs
from featurestream.pipeline.batching import ack_many
from featurestream.pipeline.producer import FeatureProducer

__all__ = ["ProducerReport", "ResumableProducer", "TrainerResume", "ledger_of"]

logger = logging.getLogger(__name__)

STATE_VERSION = 1


def ledger_of(queue: LeaseQueue) -> TrainingLedger:
    """The queue's training ledger; ``TypeError`` for a queue backend that keeps none."""
    method = getattr(queue, "training_ledger", None)
    if not callable(method):
        raise TypeError(f"{type(queue).__name__} keeps no training ledger (it has no training_ledger() method)")
    ledger = method()
    if not isinstance(ledger, TrainingLedger):
        raise TypeError(f"{type(queue).__name__}.training_ledger() returned {type(ledger).__name__}")
    return ledger


@dataclasses.dataclass
class ProducerReport:
    """What a ``ResumableProducer`` did: samples ``produced``, keys found ``trained`` or ``queued`` on its first
    plan, and how many plans (``passes``) it made (one more after each trainer restore)."""

    produced: int = 0
    trained: int = 0
    queued: int = 0
    passes: int = 0


class ResumableProducer:
    """Produce every prompt of ``prompts`` into ``queue`` once, resuming from the queue's training ledger.

    ``prompts`` is a sequence (keys ``"0"``, ``"1"``, ...) or a mapping from
    keys (letters, digits and ``_.:=+-``) to prompts, the same on every
    restart; a prompt is what ``AsyncFeaturePipeline`` takes. ``run`` declares
    the keys, then produces each key that is neither trained nor queued,
    ``chunk`` keys at a time (each claimed in the ledger before its forward),
    and plans again after every trainer restore, until the queue is closed
    (the trainer's ``loader.close()`` ends the run) or ``stop()`` is true.
    The sample of prompt ``key`` is ``sample_id_for(producer.run_id, key, g)``.
    An error that ends ``run`` (a bad prompt, a failed forward, the store or
    the queue) closes the queue with it as the cause before ``run`` raises it:
    the loaders on the queue, in every process, raise ``ProducerFailed``
    naming it instead of waiting for prompts that will never be produced.
    """

    def __init__(
        self,
        producer: FeatureProducer,
        queue: LeaseQueue,
        prompts: Sequence[Prompt] | Mapping[str, Prompt],
        *,
        chunk: int = 64,
        poll_interval: float = 0.1,
    ) -> None:
        check_count("chunk", chunk, minimum=1)
        check_seconds("poll_interval", poll_interval, positive=True)
        if isinstance(prompts, Mapping):
            self.keys = [check_key(key) for key in prompts]
        elif isinstance(prompts, Sequence):
            self.keys = [str(index) for index in range(len(prompts))]
        else:
            raise TypeError(f"prompts must be a sequence or a mapping of prompts, got {type(prompts).__name__}")
        self.producer = producer
        self.queue = queue
        self.ledger = ledger_of(queue)
        self._prompts = prompts
        self._chunk = chunk
        self._poll_interval = poll_interval
        self.report = ProducerReport()

    def run(self, stop: Callable[[], bool] | None = None) -> ProducerReport:
        """Produce until the queue is closed or ``stop()``; return the report (also kept as ``self.report``).

        Raises what ended it, after closing the queue with that error as the cause (``close_failed``).
        """
        try:
            return self._run(stop or (lambda: False))
        except BaseException as exc:
            close_failed(self.queue, f"ResumableProducer of run {self.producer.run_id!r}", exc)
            raise

    def _run(self, stopping: Callable[[], bool]) -> ProducerReport:
        self.ledger.declare(self.keys)
        while True:
            restores = self.ledger.progress().restores
            if not self.produce_missing(stopping):
                return self.report
            while self.ledger.progress().restores == restores:
                if stopping() or self.queue.is_closed:
                    return self.report
                time.sleep(self._poll_interval)

    def produce_missing(self, stop: Callable[[], bool]) -> bool:
        """One plan over every key: produce those neither trained nor queued. ``False`` once the queue is
        closed or ``stop()`` (the rest of the plan is left)."""
        first = self.report.passes == 0
        self.report.passes += 1
        produced = 0
        for start in range(0, len(self.keys), self._chunk):
            keys = self.keys[start : start + self._chunk]
            generations = self.ledger.generations(keys)
            current = {
                key: generation for key, generation in zip(keys, generations, strict=True) if generation is not None
            }
            ids = {key: sample_id_for(self.producer.run_id, key, g) for key, g in current.items() if g > 0}
            held = self.ledger.holds(list(ids.values()))
            # Held first, claimed second: the loader commits a step before it acks it, so a sample that left the
            # queue before the held read was committed before the claim, which then finds its key trained.
            wanted = {key: g for key, g in current.items() if ids.get(key) not in held}
            claimed = self.ledger.claim(wanted)
            if first:
                self.report.queued += len(current) - len(wanted)
                self.report.trained += len(wanted) - len(claimed)
            for key, generation in claimed.items():
                if stop() or self.queue.is_closed or not self._produce(key, generation, stop):
                    return False
                produced += 1
        self.report.produced += produced
        logger.info(
            "resumable producer %s: plan %d produced %d of %d keys (first plan found %d trained, %d queued)",
            self.producer.run_id,
            self.report.passes,
            produced,
            len(self.keys),
            self.report.trained,
            self.report.queued,
        )
        return True

    def _produce(self, key: str, generation: int, stop: Callable[[], bool]) -> bool:
        prompt = self._prompts[key] if isinstance(self._prompts, Mapping) else self._prompts[int(key)]
        sample_id = sample_id_for(self.producer.run_id, key, generation)
        ref = self.producer.produce(**prompt_kwargs(prompt), sample_id=sample_id)
        try:
            self.queue.put_blocks_until_below(ref, abort_when=lambda: stop() or self.queue.is_closed)
        except (QueueClosed, PutAborted):  # this sample is never enqueued
            self.producer.discard(ref)
            return False
        except (DuplicateSample, SettledSample):  # another producer's sample of this generation got there first
            self.producer.discard(ref)
        return True


class TrainerResume:
    """The loader's side of the ledger for one data-parallel ``rank``; thread-safe.

    ``begin`` (a restore to a checkpoint's step, or to 0 for a fresh start)
    must run before the first pull; ``admit`` drops (acks) leased samples
    whose prompt is trained or whose generation is stale; ``commit`` records
    the keys of the step the trainer moved past, before its samples are acked.
    """

    def __init__(self, ledger: TrainingLedger, rank: int, world_size: int) -> None:
        self.ledger = ledger
        self.rank = rank
        self.world_size = world_size
        self._lock = threading.Lock()
        self._incarnation: int | None = None
        self.step = 0
        self.dropped = 0
        self.last_restore: Restore | None = None

    @property
    def begun(self) -> bool:
        with self._lock:
            return self._incarnation is not None

    def begin(self, step: int = 0) -> Restore:
        """Roll this rank's history back to ``step`` and start a new incarnation of it."""
        restore = self.ledger.restore(self.rank, step)
        with self._lock:
            self._incarnation, self.step, self.last_restore = restore.incarnation, step, restore
        logger.info(
            "rank %d restored at step %d: %d prompts trained after it are to be produced again",
            self.rank,
            step,
            len(restore.rolled_back),
        )
        return restore

    def state(self) -> dict[str, Any]:
        with self._lock:
            return {"version": STATE_VERSION, "step": self.step, "rank": self.rank, "world_size": self.world_size}

    def check_state(self, state: object) -> int:
        """The step of a ``state`` from ``state()``; ``ValueError`` naming what does not fit this rank."""
        if not isinstance(state, Mapping):
            raise TypeError(f"a loader state must be the mapping state_dict() returned, got {type(state).__name__}")
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"loader state version {state.get('version')!r} is not {STATE_VERSION} in {state!r}")
        step = state.get("step")
        check_count("state['step']", step)
        assert isinstance(step, int)
        for name, mine in (("rank", self.rank), ("world_size", self.world_size)):
            if state.get(name) != mine:
                raise ValueError(f"loader state of {name} {state.get(name)!r} cannot restore {name} {mine}: {state!r}")
        return step

    def admit(self, queue: LeaseQueue, leases: list[Lease]) -> list[Lease]:
        """The leases to train; the others (prompt trained, a stale generation, or an earlier lease of a sample
        leased again in the same batch: it expired meanwhile) are acked here."""
        keyed = [(lease, parse_sample_id(lease.ref.sample_id)) for lease in leases]
        tracked = [(lease, parsed) for lease, parsed in keyed if parsed is not None]
        if not tracked:
            return leases
        verdicts = dict(
            zip((id(lease) for lease, _ in tracked), self.ledger.admit([p for _, p in tracked]), strict=True)
        )
        newest = {parsed: id(lease) for lease, parsed in tracked}  # the last lease of each sample wins
        for lease, parsed in tracked:
            if newest[parsed] != id(lease):
                verdicts[id(lease)] = False
        dropped = [lease for lease in leases if not verdicts.get(id(lease), True)]
        if dropped:
            ack_many(queue, dropped)
            with self._lock:
                self.dropped += len(dropped)
        return [lease for lease in leases if verdicts.get(id(lease), True)]

    def commit(self, leases: Sequence[Lease]) -> None:
        """This rank's next step trained ``leases``: record their keys (``StaleTrainer`` once superseded)."""
        keys = [parsed[0] for lease in leases if (parsed := parse_sample_id(lease.ref.sample_id)) is not None]
        with self._lock:
            incarnation = self._incarnation
            step = self.step + 1
        assert incarnation is not None, "begin() runs before the first pull"
        if keys:
            duplicates = self.ledger.commit(self.rank, incarnation, step, keys)
            if duplicates:
                logger.warning("rank %d step %d trained %d prompts already trained", self.rank, step, duplicates)
        with self._lock:
            self.step = step

    def epoch_done(self, own: int = 0) -> bool:
        """Whether the epoch's prompts are all trained but for at most ``own``: those this loader holds (the
        last, short batch)."""
        progress = self.ledger.progress()
        return progress.declared > 0 and progress.declared - progress.trained <= own

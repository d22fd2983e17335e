"""``ProducerActions``: the stateful test's producer side (a mixin of ``QueueMachine``)."""

from __future__ import annotations

from featurestream.common.errors import QueueClosed
from featurestream.core.machines import HELD, SETTLED
from featurestream.testing.faults import InjectedFault
from featurestream.testing.machine_state import MachineState, ProducerRecord, SampleRecord
from featurestream.testing.producers import BlockedPut
from featurestream.testing.samples import sample_tensors

__all__ = ["ProducerActions"]


class ProducerActions(MachineState):
    """The producer's spec actions: StorePut, Put / Reput (one, a batch, or blocked on backpressure on its own
    thread) and the rounds of a woken blocked put, each checked against the contract and the spec mirror."""

    def do_produce(self, sample_id: str) -> None:
        """StorePut: the producer writes the sample's tensors into the store (an injected fault stores nothing)."""
        if sample_id in self.samples:
            return
        index = self.config.sample_ids.index(sample_id)
        try:
            ref = self.store.put(sample_id, sample_tensors(index, self.config.sample_tokens), run_id="machine")
        except InjectedFault:
            return
        self.samples[sample_id] = SampleRecord(index, ref)
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
            producer = ProducerRecord(BlockedPut(self.queue, sample.ref, self.config.bound), sample.status)
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

    def _wake_blocked(self) -> None:
        for sample_id in sorted(self.producers):
            self.do_wake(sample_id)

"""Producer and queue in this process, consumers in child processes over a shared-dir store.

The first consumer is SIGKILLed while it holds a lease (and an open handle on
the sample's file); a second consumer finishes the stream. Every sample must
be trained on, none acked twice, and nothing left in the directory.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
from collections import Counter
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import pytest
import torch

from featurestream import (
    AsyncFeaturePipeline,
    Eagle3TargetBatch,
    FeatureProducer,
    Lease,
    SampleRefQueue,
    SharedDirFeatureStore,
    VisibilityTimeout,
)
from featurestream.stores.arena import entries
from featurestream.testing import FakeClock
from featurestream.tools.models import TinyConfig, TinyTargetModel, prompt_batches

from ._consumer_process import consumer_main

CONFIG = TinyConfig(vocab_size=32, hidden_size=16, num_layers=3, num_heads=2, max_seq_len=16)
SAMPLES = 24
CRASH_AT = 3
SILENCE_LIMIT_S = 120  # a child this quiet is hung: fail instead of waiting for the suite's timeout


class ChecksummingTarget(TinyTargetModel):
    """The real tiny target, remembering a checksum of what each sample's forward produced."""

    def __init__(self) -> None:
        super().__init__(CONFIG, seed=0)
        self.checksums: list[float] = []

    def generate_batch(self, **inputs: Any) -> Eagle3TargetBatch:  # type: ignore[override]
        batch = super().generate_batch(**inputs)
        self.checksums.append(float(batch.logits.double().sum()) + float(batch.aux_hidden_states.double().sum()))
        return batch


class Coordinator:
    """Serves one consumer process's queue calls against the real queue."""

    def __init__(self, queue: SampleRefQueue) -> None:
        self.queue = queue
        self.leases: dict[int, Lease] = {}
        self.trained: list[tuple[str, float]] = []

    def serve(self, conn: Connection) -> tuple[str, ...]:
        """Answer requests until the consumer says ``holding`` or ``done``; return that message."""
        while True:
            if not conn.poll(SILENCE_LIMIT_S):
                raise AssertionError(f"consumer silent for {SILENCE_LIMIT_S} s")
            message = conn.recv()
            op = message[0]
            if op in ("holding", "done"):
                return message
            if op == "trained":
                self.trained.append((message[1], message[2]))
                continue
            conn.send(self.answer(op, message[1:]))

    def answer(self, op: str, args: tuple[Any, ...]) -> Any:
        queue = self.queue
        if op == "acquire":
            lease = queue.acquire(timeout=args[0])
            if lease is None:
                return None
            self.leases[lease.lease_id] = lease
            return lease.ref, lease.lease_id, lease.redelivery_count
        if op in ("ack", "fail"):
            getattr(queue, op)(self.leases.pop(args[0]))
            return None
        if op == "close":
            queue.close()
            return None
        if op == "is_closed":
            return queue.is_closed
        if op in ("pending_count", "outstanding_count"):
            return getattr(queue, op)()
        raise AssertionError(f"unknown request {op!r}")


def start_consumer(context: Any, directory: Path, crash_at: int | None) -> tuple[Any, Connection]:
    parent_end, child_end = context.Pipe()
    process = context.Process(target=consumer_main, args=(child_end, str(directory), crash_at), daemon=True)
    process.start()
    child_end.close()
    return process, parent_end


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_sigkilled_consumer_loses_nothing_and_duplicates_no_ack(tmp_path: Path) -> None:
    torch.set_num_threads(1)
    directory = tmp_path / "shared"
    target = ChecksummingTarget()
    probe = target.generate_batch(
        **dict(zip(("input_ids", "attention_mask", "loss_mask"), next(prompts()), strict=True))
    )
    sample_bytes = sum(t.numel() * t.element_size() for t in probe.tensors().values())
    target.checksums.clear()
    # Backpressure engages while the first consumer is being killed and replaced.
    writer = SharedDirFeatureStore(
        directory,
        max_samples=None,
        max_bytes=64 * sample_bytes,
        high_watermark_bytes=4 * sample_bytes,
        low_watermark_bytes=sample_bytes,
    )
    clock = FakeClock()
    acks: Counter[str] = Counter()

    def tracer(action: str, fields: dict[str, object]) -> None:
        if action == "Ack":
            acks[str(fields["sample_id"])] += 1

    queue = SampleRefQueue(writer, VisibilityTimeout(5.0), clock=clock, tracer=tracer)
    producer = FeatureProducer(target, writer, run_id="proc")
    pipeline = AsyncFeaturePipeline(producer, queue, prompts()).start()
    coordinator = Coordinator(queue)
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no inherited locks or thread pools
    try:
        victim, conn = start_consumer(context, directory, CRASH_AT)
        message = coordinator.serve(conn)
        assert message[0] == "holding"
        held = message[1]
        assert [name for name in os.listdir(directory) if name.startswith(f"{held}@")], f"{held}'s file is gone"
        victim.kill()
        victim.join(60)
        assert victim.exitcode == -signal.SIGKILL
        clock.advance(6.0)  # past the visibility timeout: the next acquire reclaims the dead consumer's lease

        survivor, conn = start_consumer(context, directory, None)
        assert coordinator.serve(conn) == ("done",)
        survivor.join(60)
        assert survivor.exitcode == 0
    finally:
        for process in multiprocessing.active_children():
            process.kill()
        pipeline.stop()

    expected = {f"sample-proc-{n}": checksum for n, checksum in enumerate(target.checksums, 1)}  # ids count from 1
    assert len(expected) == SAMPLES
    trained = dict(coordinator.trained)
    assert trained == expected, "every sample trained on, with the bytes the producer computed"
    assert held in trained, "the sample held by the killed consumer was redelivered"
    assert acks == Counter(dict.fromkeys(expected, 1)), "every sample acked exactly once"
    stats = queue.stats()
    assert (stats.acked, stats.reclaimed, stats.dead_lettered) == (SAMPLES, 1, 0)
    assert stats.pending == stats.outstanding == 0
    assert entries(directory) == [], "nothing left on disk: no sample, marker or temporary file"
    assert writer.health().sample_count == 0 and writer.health().resident_bytes == 0
    writer.close()


def prompts() -> Any:
    return prompt_batches(SAMPLES, batch_size=2, seq_len=8, vocab_size=CONFIG.vocab_size, seed=1)

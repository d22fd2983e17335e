"""AsyncFeaturePipeline: prompt sources, backpressure aborts, single use, errors."""

from __future__ import annotations

import threading
from collections.abc import Callable

import pytest
import torch

from featurestream import (
    AsyncFeaturePipeline,
    FeatureDataLoader,
    FeatureProducer,
    LocalFeatureStore,
    PromptSource,
    SampleRefQueue,
)
from featurestream.pipeline.alignment import shift_left
from featurestream.tools.models import TinyConfig, TinyTargetModel, prompt_batches

CONFIG = TinyConfig(vocab_size=32, hidden_size=16, num_layers=3, num_heads=2, max_seq_len=16)


def make(store: LocalFeatureStore | None = None) -> tuple[FeatureProducer, SampleRefQueue, LocalFeatureStore]:
    store = store or LocalFeatureStore()
    return FeatureProducer(TinyTargetModel(CONFIG), store, run_id="p"), SampleRefQueue(store), store


def prompts(count: int) -> list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
    return list(prompt_batches(count, batch_size=1, seq_len=8, vocab_size=CONFIG.vocab_size))


def drain(queue: SampleRefQueue, store: LocalFeatureStore) -> list[torch.Tensor]:
    with FeatureDataLoader(queue, store) as loader:
        return [batch.input_ids.clone() for batch in loader]


def test_an_iterable_of_tuples_and_bare_ids_is_streamed_then_the_queue_closes() -> None:
    producer, queue, store = make()
    source = prompts(3)
    items: list[object] = [*source[:2], source[2][0]]
    with AsyncFeaturePipeline(producer, queue, iter(items)) as pipeline:
        got = drain(queue, store)
    # The batches' input_ids are in the EAGLE-3 alignment: each prompt's shifted one token left.
    assert [g.tolist() for g in got] == [shift_left(p[0]).tolist() for p in source]
    assert queue.is_closed and pipeline.produced == 3 and store.health().sample_count == 0
    with pytest.raises(RuntimeError, match=r"single-use"):
        pipeline.start()


def test_a_callable_source_with_six_tuples_until_none() -> None:
    producer, queue, store = make()
    remaining = prompts(2)

    def source() -> tuple[torch.Tensor, ...] | None:
        if not remaining:
            return None
        ids, attention, loss = remaining.pop(0)
        return ids, attention, loss, torch.arange(8)[None], torch.tensor([[8]]), torch.zeros(1, 8, dtype=torch.long)

    pipeline = AsyncFeaturePipeline(producer, queue, source).start()
    assert pipeline.start() is pipeline, "start is idempotent while running"
    with FeatureDataLoader(queue, store) as loader:
        batches = list(loader)
    pipeline.stop()
    assert len(batches) == 2 and all(b.seq_lens is not None and b.position_ids is not None for b in batches)


def test_stop_aborts_a_put_blocked_by_backpressure_and_discards_its_sample() -> None:
    probe, _, _ = make()
    size = probe.produce(**dict(zip(("input_ids", "attention_mask", "loss_mask"), prompts(1)[0], strict=True)))
    # One sample flows; the second one produced reaches the high watermark and pauses the producer.
    store = LocalFeatureStore(
        max_samples=None, max_bytes=10**9, high_watermark_bytes=2 * size.estimated_bytes, low_watermark_bytes=0
    )
    producer, _, _ = make(store)
    paused = threading.Event()
    queue = SampleRefQueue(store, on_pause=lambda health: paused.set())
    pipeline = AsyncFeaturePipeline(producer, queue, iter(prompts(5))).start()
    assert paused.wait(30), "the second put must pause: two samples reach the high watermark"
    pipeline.stop()
    assert not pipeline.is_running and queue.is_closed
    assert store.health().sample_count == queue.pending_count() == 1, "the aborted sample was discarded"
    assert pipeline.produced == 1


def test_a_polled_source_keeps_the_queue_open_until_stop() -> None:
    producer, queue, _ = make()
    calls = threading.Semaphore(0)

    def empty() -> None:
        calls.release()
        return None

    pipeline = AsyncFeaturePipeline(producer, queue, empty, poll_interval=0.001, stop_on_exhausted=False).start()
    assert calls.acquire(timeout=30) and calls.acquire(timeout=30), "polled again after an empty answer"
    assert not queue.is_closed and pipeline.is_running
    pipeline.stop()
    assert queue.is_closed and not pipeline.is_running


def test_the_threads_error_is_reraised_from_stop() -> None:
    producer, queue, _ = make()
    pipeline = AsyncFeaturePipeline(producer, queue, iter([*prompts(1), (torch.zeros(1),)])).start()
    pipeline.join(30)
    assert queue.is_closed, "consumers are not left waiting on a dead producer"
    with pytest.raises(TypeError, match=r"prompt iterator must yield .*3-tuple"):
        pipeline.stop()
    pipeline.stop()  # the error is raised once


def test_a_refused_put_is_discarded_and_reraised() -> None:
    producer, queue, store = make()
    producer = FeatureProducer(TinyTargetModel(CONFIG), store, run_id="p", sample_id_factory=lambda n: "same")
    source = prompts(2)
    queue.put(producer.produce(**dict(zip(("input_ids", "attention_mask", "loss_mask"), source[0], strict=True))))
    queue.ack(queue.acquire(timeout=0))  # type: ignore[arg-type]
    pipeline = AsyncFeaturePipeline(producer, queue, iter(source[1:])).start()
    pipeline.join(30)
    with pytest.raises(ValueError, match=r"already acked"):
        pipeline.stop()
    assert store.health().sample_count == 0, "the duplicate's bytes were discarded"


def test_bad_arguments() -> None:
    producer, queue, _ = make()
    with pytest.raises(TypeError, match=r"callable or an iterable, got int"):
        AsyncFeaturePipeline(producer, queue, 42)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"poll_interval must be a finite number of seconds >= 0, got -1"):
        AsyncFeaturePipeline(producer, queue, [], poll_interval=-1)
    pipeline = AsyncFeaturePipeline(producer, queue, [])
    with pytest.raises(ValueError, match=r"join_timeout must be a finite number of seconds >= 0, got -1"):
        pipeline.stop(join_timeout=-1)
    with pytest.raises(TypeError):
        pipeline.stop(5.0)  # type: ignore[misc]  # keyword-only, as in the reference


def test_prompt_source_is_a_runtime_checkable_protocol() -> None:
    assert isinstance(lambda: None, PromptSource)
    assert not isinstance(iter([]), PromptSource) and not isinstance(42, PromptSource)


def test_stop_without_a_join_limit_waits_for_the_thread() -> None:
    producer, queue, _ = make()
    release = threading.Event()
    remaining = prompts(1)

    def slow_source() -> tuple[torch.Tensor, ...] | None:
        release.wait(30)  # the thread sits here until stop() has been called
        return remaining.pop() if remaining else None

    pipeline = AsyncFeaturePipeline(producer, queue, slow_source).start()
    stopper = threading.Thread(target=pipeline.stop, kwargs={"join_timeout": None})
    stopper.start()
    assert _wait_for(pipeline.stop_requested)
    assert stopper.is_alive(), "stop(join_timeout=None) is still waiting for the thread"
    release.set()
    stopper.join(30)
    assert not stopper.is_alive() and not pipeline.is_running and queue.is_closed


def _wait_for(condition: Callable[[], bool]) -> bool:
    """Poll ``condition`` until true (bounded): the stop request is set by another thread."""
    event = threading.Event()
    for _ in range(3000):
        if condition():
            return True
        event.wait(0.01)
    return False

"""A producer's error reaches the trainer: the queue is closed with it as the cause and the loader raises it.

The README's HF example hands the producer dict prompts; both prompt-taking producers accept them.
"""

from __future__ import annotations

import threading
import time

import pytest
import torch

from featurestream import (
    AsyncFeaturePipeline,
    FeatureDataLoader,
    FeatureProducer,
    LocalFeatureStore,
    ProducerFailed,
    SampleRefQueue,
    VisibilityTimeout,
)
from featurestream.core.resume import parse_sample_id
from featurestream.pipeline.async_pipeline import prompt_kwargs
from featurestream.pipeline.resume import ResumableProducer
from featurestream.testing.resume import KeyTarget

BOUND = 5.0  # seconds: a trainer waiting on an empty queue learns of the failure at once (docs/loader.md)
pytestmark = pytest.mark.timeout(120)  # before the fix the trainer waited for ever


def _dict_prompt(i: int) -> dict[str, torch.Tensor]:
    ids = torch.arange(3 * i, 3 * i + 3).reshape(1, 3)
    return {"input_ids": ids, "attention_mask": torch.ones_like(ids), "loss_mask": torch.ones_like(ids)}


class BrokenTarget(KeyTarget):
    """Raises on its ``fail_at``-th forward, as a target hitting an out-of-memory or a bad prompt would."""

    def __init__(self, fail_at: int) -> None:
        self.calls = 0
        self.fail_at = fail_at

    def generate_batch(self, **inputs: torch.Tensor | None):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.calls == self.fail_at:
            raise RuntimeError(f"CUDA out of memory on forward {self.calls}")
        return super().generate_batch(**inputs)


def test_dict_prompts_are_produce_keywords_and_bad_ones_are_refused_by_name() -> None:
    prompt = _dict_prompt(1)
    assert prompt_kwargs(prompt) == prompt
    only_ids = prompt_kwargs({"input_ids": prompt["input_ids"]})
    assert torch.equal(only_ids["attention_mask"], torch.ones(1, 3, dtype=torch.int64))
    with pytest.raises(TypeError, match=r"needs input_ids and takes only .*got keys \['ids'\] \(ids not among"):
        prompt_kwargs({"ids": prompt["input_ids"]})  # type: ignore[dict-item]
    with pytest.raises(TypeError, match="got list"):
        prompt_kwargs([prompt["input_ids"]])  # type: ignore[arg-type]


def test_a_resumable_producer_takes_the_readme_dict_prompts() -> None:
    store = LocalFeatureStore()
    queue = SampleRefQueue(store, VisibilityTimeout(30.0))
    producer = ResumableProducer(
        FeatureProducer(KeyTarget(), store, run_id="r"), queue, [_dict_prompt(i) for i in range(4)]
    )
    thread = threading.Thread(target=producer.run, daemon=True)
    thread.start()
    with FeatureDataLoader(queue, store, prefetch=0) as loader:
        keys = sorted(parse_sample_id(lease.ref.sample_id)[0] for _ in loader for lease in loader.current_leases)
    assert keys == ["0", "1", "2", "3"]
    thread.join(10)
    assert not thread.is_alive() and producer.report.produced == 4


@pytest.mark.parametrize("prefetch", [0, 2])
def test_a_resumable_producer_that_fails_stops_a_waiting_trainer_with_its_error(prefetch: int) -> None:
    """A trainer resuming (the queue stays open for restores) waits for the producer; the producer fails."""
    store = LocalFeatureStore()
    queue = SampleRefQueue(store, VisibilityTimeout(30.0))
    producer = ResumableProducer(
        FeatureProducer(BrokenTarget(fail_at=3), store, run_id="r"), queue, [_dict_prompt(i) for i in range(6)]
    )
    errors: list[BaseException] = []

    def run() -> None:
        try:
            producer.run()
        except BaseException as exc:
            errors.append(exc)

    loader = FeatureDataLoader(queue, store, prefetch=prefetch)
    trained = []
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    started = time.monotonic()
    with pytest.raises(ProducerFailed) as raised:
        for _ in loader:
            trained.append(loader.current_lease.ref.sample_id)  # type: ignore[union-attr]
    waited = time.monotonic() - started
    thread.join(10)
    assert [type(error) for error in errors] == [RuntimeError], "run() raises its own error too"
    assert len(trained) == 2, "the two samples produced before the failure are trained first"
    message = str(raised.value)
    assert "ResumableProducer of run 'r'" in message and "RuntimeError: CUDA out of memory on forward 3" in message
    assert waited < BOUND, f"the trainer learnt it after {waited:.1f} s"
    assert queue.close_cause is not None and queue.lifecycle_state == "drained"


def test_an_async_pipeline_that_fails_closes_the_queue_with_its_error() -> None:
    store = LocalFeatureStore()
    queue = SampleRefQueue(store, VisibilityTimeout(30.0))
    pipeline = AsyncFeaturePipeline(
        FeatureProducer(BrokenTarget(fail_at=2), store, run_id="a"), queue, [_dict_prompt(i) for i in range(5)]
    )
    pipeline.start()
    with pytest.raises(ProducerFailed, match=r"AsyncFeaturePipeline of run 'a'.*forward 2"):
        for _ in FeatureDataLoader(queue, store, prefetch=2):
            pass
    with pytest.raises(RuntimeError, match="forward 2"):
        pipeline.stop()


def test_close_cause_is_checked_and_the_first_one_stands() -> None:
    queue = SampleRefQueue(LocalFeatureStore())
    with pytest.raises(TypeError, match="cause must be a str, got RuntimeError"):
        queue.close(cause=RuntimeError("x"))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="non-empty"):
        queue.close(cause="")
    assert queue.lifecycle_state == "open", "a refused cause closes nothing"
    queue.close()
    queue.close(cause="first")
    queue.close(cause="second")
    assert queue.close_cause == "first"

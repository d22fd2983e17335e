"""The loader's close gives its prefetched leases back unused: none of them spends a delivery."""

from __future__ import annotations

import time

import torch

from featurestream import FeatureDataLoader, LocalFeatureStore, SampleRefQueue, VisibilityTimeout


class StepFailed(Exception):
    """The trainer's step on the poisoned sample."""


def _tensors(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "aux_hidden_states": torch.randn(1, 4, 24, generator=generator),
        "input_ids": torch.randint(0, 100, (1, 4), generator=generator),
        "attention_mask": torch.ones(1, 4, dtype=torch.long),
        "loss_mask": torch.ones(1, 4, dtype=torch.long),
        "logits": torch.randn(1, 4, 16, generator=generator),
    }


def _wait_outstanding(queue: SampleRefQueue, count: int) -> None:
    deadline = time.monotonic() + 10
    while queue.outstanding_count() < count:
        assert time.monotonic() < deadline, f"the loader leased {queue.outstanding_count()} of {count} in 10 s"
        time.sleep(0.01)


def test_a_poisoned_sample_prefetched_by_closing_trainers_dies_only_after_real_failures() -> None:
    """Each trainer fails its step on the poisoned sample (a real failure), trains a good one while its prefetch
    leases the poisoned one again, and closes: the prefetched lease goes back unused."""
    store = LocalFeatureStore()
    queue = SampleRefQueue(store, VisibilityTimeout(30.0), max_deliveries=3)
    queue.put(store.put("poison", _tensors(0), run_id="run"))
    for round_ in range(2):
        queue.put(store.put(f"good-{round_}", _tensors(round_ + 1), run_id="run"))
        with FeatureDataLoader(queue, store, prefetch=1, close_queue=False) as loader:
            next(loader)
            assert loader.current_lease is not None and loader.current_lease.ref.sample_id == "poison"
            loader.fail_current()  # the step failed
            next(loader)
            assert loader.current_lease is not None and loader.current_lease.ref.sample_id == f"good-{round_}"
            _wait_outstanding(queue, 2)  # the prefetch holds the poisoned sample again; close gives it back
    assert queue.dead_letters() == [], "two real failures of max_deliveries=3"
    lease = queue.acquire(timeout=1)
    assert lease is not None and (lease.ref.sample_id, lease.redelivery_count) == ("poison", 2)
    stats = queue.stats()
    assert (stats.failed, stats.given_back, stats.acked) == (2, 2, 2)

"""The stream, whatever the algorithm: EAGLE-3, DFlash and DSpark samples through the shared-directory store read
by another instance, batches with prefetch, and ResumableProducer's exactly-once resume across a trainer restart.

These tests are about the stream, not the algorithm: the same scenario runs over each algorithm's samples.
"""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

from featurestream import (
    FeatureAlgorithm,
    FeatureDataLoader,
    FeatureProducer,
    LocalFeatureStore,
    SampleRefQueue,
    SharedDirFeatureStore,
    VisibilityTimeout,
)
from featurestream.core.resume import parse_sample_id
from featurestream.pipeline.resume import ResumableProducer
from featurestream.stores.arena import entries
from featurestream.testing.resume import prompts
from support.algorithm_samples import KeyTarget, sample_of

ALGORITHMS = [FeatureAlgorithm.EAGLE3, FeatureAlgorithm.DFLASH, FeatureAlgorithm.DSPARK]


def assert_same(batch: object, expected: dict[str, torch.Tensor]) -> None:
    assert list(batch.keys()) == list(expected)  # type: ignore[attr-defined]
    for name, tensor in expected.items():
        assert torch.equal(batch[name], tensor), name  # type: ignore[index]


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_a_shared_directory_written_by_one_instance_streams_through_another(
    algorithm: FeatureAlgorithm, tmp_path: Path
) -> None:
    writer = SharedDirFeatureStore(tmp_path)
    queue = SampleRefQueue(writer)
    samples = [sample_of(algorithm, index) for index in range(3)]
    for index, tensors in enumerate(samples):
        queue.put(writer.put(f"s{index}", tensors, run_id="r", algorithm=algorithm))
    queue.close()
    reader = SharedDirFeatureStore(tmp_path)  # another process's instance on the same directory
    with FeatureDataLoader(queue, reader, algorithm=algorithm, prefetch=2) as loader:
        batches = list(loader)
    assert len(batches) == 3
    for batch, tensors in zip(batches, samples, strict=True):
        assert_same(batch, tensors)
    assert queue.stats().acked == 3 and entries(tmp_path) == [], "every acked sample's file is gone"


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_batches_of_two_with_prefetch_concatenate_each_feature_in_lease_order(algorithm: FeatureAlgorithm) -> None:
    store = LocalFeatureStore()
    queue = SampleRefQueue(store)
    samples = [sample_of(algorithm, index) for index in range(5)]
    for index, tensors in enumerate(samples):
        queue.put(store.put(f"s{index}", tensors, run_id="r", algorithm=algorithm))
    queue.close()
    with FeatureDataLoader(queue, store, algorithm=algorithm, batch_size=2, prefetch=2) as loader:
        batches = list(loader)
    for batch, group in zip(batches, (samples[0:2], samples[2:4], samples[4:]), strict=True):
        assert_same(batch, {name: torch.cat([s[name] for s in group]) for name in group[0]})
    assert queue.stats().acked == 5 and store.health().sample_count == 0


@pytest.mark.parametrize("algorithm", ALGORITHMS)
def test_resumable_production_trains_every_prompt_once_across_a_trainer_restart(algorithm: FeatureAlgorithm) -> None:
    """Checkpoint at step 2, crash in step 3: step 3's prompts are produced again and every prompt trains once."""
    store = LocalFeatureStore(max_samples=64)
    queue = SampleRefQueue(store, VisibilityTimeout(0.3), reaper_interval=0.05)
    target = FeatureProducer(KeyTarget(algorithm), store, run_id="r", algorithm=algorithm)
    producer = ResumableProducer(target, queue, prompts(8), chunk=4, poll_interval=0.05)
    thread = threading.Thread(target=producer.run, daemon=True)
    thread.start()

    def keys_of(loader: FeatureDataLoader, batch: object) -> list[str]:
        keys = [parse_sample_id(lease.ref.sample_id)[0] for lease in loader.current_leases]  # type: ignore[index]
        # prompt i's token ids start at 3 * i, and every float feature is the ids broadcast
        first = next(t for t in batch.tensors().values() if t.is_floating_point())  # type: ignore[attr-defined]
        assert first[:, 0, 0].tolist() == [3.0 * int(key) for key in keys]
        return keys

    loader = FeatureDataLoader(queue, store, algorithm=algorithm, batch_size=2, prefetch=0)
    trained: list[str] = []
    for step, batch in enumerate(loader, start=1):
        if step == 3:
            break  # killed while training step 3: it is in no checkpoint
        trained += keys_of(loader, batch)
        if step == 2:
            checkpoint = loader.state_dict()
    loader.consume_now()  # step 3 committed and acked: the worst case, its samples are gone
    del loader
    restored = FeatureDataLoader(queue, store, algorithm=algorithm, batch_size=2, prefetch=0)
    restored.load_state_dict(checkpoint)
    assert restored.last_restore is not None and len(restored.last_restore.rolled_back) == 2
    for batch in restored:
        trained += keys_of(restored, batch)
    restored.close()
    thread.join(10)
    assert sorted(trained, key=int) == [str(i) for i in range(8)], "every prompt trained exactly once"
    assert producer.report.produced == 8 + 2

"""DFlash and DSpark samples through ``MooncakeFeatureStore``: put by a producer's instance, queued, trained by a
trainer's instance (no segment of its own) through the loader, bit for bit; every acked sample scrubbed."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from featurestream import FeatureAlgorithm, FeatureDataLoader, SampleRefQueue
from support.algorithm_samples import packing, sample_of


@pytest.mark.parametrize("algorithm", [FeatureAlgorithm.DFLASH, FeatureAlgorithm.DSPARK])
def test_samples_of_an_algorithm_stream_between_two_instances(
    make_store: Callable[..., Any], algorithm: FeatureAlgorithm
) -> None:
    producer, trainer = make_store(), make_store(global_segment_size=0)
    queue = SampleRefQueue(producer)
    samples = [{**sample_of(algorithm, index), **packing()} for index in range(3)]
    samples[0] = {name: t.to(torch.bfloat16) if t.is_floating_point() else t for name, t in samples[0].items()}
    for index, tensors in enumerate(samples):
        queue.put(producer.put(f"s{index}", tensors, run_id="r", algorithm=algorithm))
    queue.close()
    with FeatureDataLoader(queue, trainer, algorithm=algorithm, prefetch=2) as loader:
        batches = list(loader)
    for batch, tensors in zip(batches, samples, strict=True):
        assert list(batch.keys()) == list(tensors)
        assert all(torch.equal(batch[name], tensor) for name, tensor in tensors.items())
    assert queue.stats().acked == 3
    assert not any(producer.is_resident(f"s{index}") for index in range(3)), "scrubbed at their acks"

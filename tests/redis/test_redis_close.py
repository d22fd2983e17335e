"""A producer process that ends with ``queue.close(); store.close()`` loses nothing: its queued samples stay for
the trainer (another process), which trains each once, and the directory is empty at the end."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from featurestream import FeatureDataLoader, SharedDirFeatureStore

pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")
from featurestream.backends.redis.queue import RedisSampleRefQueue
from featurestream.testing import sample_tensors

WORKER = str(Path(__file__).with_name("_close_worker.py"))
SAMPLES = 40
TOKENS = 4


def test_a_producer_closing_its_store_leaves_its_queued_samples_to_the_trainer(
    redis_server: Any, queue_name: str, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    producer = subprocess.run(
        [sys.executable, WORKER, redis_server.url, queue_name, str(shared), str(SAMPLES)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert producer.returncode == 0, producer.stderr[-3000:]
    queued = sorted(name for name in os.listdir(shared) if name.endswith(".retained"))
    assert len(queued) == SAMPLES, "the producer's close freed samples the queue holds"
    store = SharedDirFeatureStore(shared)
    queue = RedisSampleRefQueue(store, url=redis_server.url, name=queue_name)
    trained = []
    with FeatureDataLoader(queue, store, prefetch=2) as loader:
        for batch in loader:  # a sample the trainer cannot read raises here, failing the test
            sample_id = loader.current_lease.ref.sample_id  # type: ignore[union-attr]
            expected = sample_tensors(int(sample_id[1:]), TOKENS)
            assert all(torch.equal(getattr(batch, name), want) for name, want in expected.items()), sample_id
            trained.append(sample_id)
    assert sorted(trained) == sorted(f"s{i}" for i in range(SAMPLES)) and len(trained) == SAMPLES
    stats = queue.stats()
    assert (stats.acked, stats.dead_lettered, stats.pending, stats.outstanding) == (SAMPLES, 0, 0, 0)
    queue.disconnect()
    store.close()
    assert os.listdir(shared) == []

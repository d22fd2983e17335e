"""A producer process that fails closes the Redis queue with its error; a trainer in another process raises it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from featurestream import FeatureDataLoader, ProducerFailed, SharedDirFeatureStore, VisibilityTimeout
from featurestream.backends.redis.queue import RedisSampleRefQueue

PRODUCER = str(Path(__file__).with_name("_failing_producer.py"))
pytestmark = pytest.mark.timeout(120)  # before the fix the trainer waited for ever


def test_a_failed_producer_process_reaches_a_resuming_trainer(
    redis_server: Any, queue_name: str, tmp_path: Path
) -> None:
    store = SharedDirFeatureStore(tmp_path)
    queue = RedisSampleRefQueue(store, VisibilityTimeout(30.0), url=redis_server.url, name=queue_name)
    loader = FeatureDataLoader(queue, store, prefetch=2)  # resuming: the queue stays open for restores
    trained = []
    producer = subprocess.Popen(
        [sys.executable, PRODUCER, redis_server.url, queue_name, str(tmp_path)], stderr=subprocess.PIPE, text=True
    )
    try:
        with pytest.raises(ProducerFailed) as raised:
            for _ in loader:
                trained.extend(lease.ref.sample_id for lease in loader.current_leases)
        _, stderr = producer.communicate(timeout=30)
    finally:
        producer.kill()
    assert producer.returncode != 0 and "CUDA out of memory on forward 3" in stderr
    assert len(trained) == 2, trained
    message = str(raised.value)
    assert f"ResumableProducer of run 'remote' (pid {producer.pid} on " in message
    assert "RuntimeError: CUDA out of memory on forward 3" in message
    assert queue.close_cause is not None and queue.lifecycle_state == "drained"
    queue.disconnect()

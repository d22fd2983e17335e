"""A producer process that ends with ``queue.close(); store.close()`` loses nothing: its queued samples stay for
the trainer (another process), which trains each once, and the directory is empty at the end. A file deleted under
the queue anyway is dead-lettered ``lost`` at its first read."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from featurestream import FeatureDataLoader, SampleLostError, SharedDirFeatureStore
from featurestream.core.lease import LOST_REASON
from featurestream.stores.arena import entries

pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")
from featurestream.backends.redis.queue import RedisSampleRefQueue
from featurestream.testing import sample_tensors

WORKER = str(Path(__file__).with_name("_close_worker.py"))
SAMPLES = 40
TOKENS = 4


def produce(url: str, name: str, shared: Path) -> None:
    """Run the producer process to its end (``queue.close(); store.close()``); every sample it put is still queued."""
    producer = subprocess.run(
        [sys.executable, WORKER, url, name, str(shared), str(SAMPLES)], capture_output=True, text=True, timeout=120
    )
    assert producer.returncode == 0, producer.stderr[-3000:]
    queued = sorted(name for name in os.listdir(shared) if name.endswith(".retained"))
    assert len(queued) == SAMPLES, "the producer's close freed samples the queue holds"


def train(url: str, name: str, shared: Path) -> tuple[list[str], list[SampleLostError], RedisSampleRefQueue]:
    """The trainer: a loader to the end of the stream, checking every sample's bytes; the ids trained, the losses
    it raised, and its queue (still connected)."""
    store = SharedDirFeatureStore(shared)
    queue = RedisSampleRefQueue(store, url=url, name=name)
    trained, lost = [], []
    with FeatureDataLoader(queue, store, prefetch=2) as loader:
        while True:
            try:
                batch = next(loader)
            except StopIteration:
                break
            except SampleLostError as exc:  # any other error fails the test
                lost.append(exc)
                continue
            sample_id = loader.current_lease.ref.sample_id  # type: ignore[union-attr]
            expected = sample_tensors(int(sample_id[1:]), TOKENS)
            assert all(torch.equal(getattr(batch, name), want) for name, want in expected.items()), sample_id
            trained.append(sample_id)
    return trained, lost, queue


def test_a_producer_closing_its_store_leaves_its_queued_samples_to_the_trainer(
    redis_server: Any, queue_name: str, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    produce(redis_server.url, queue_name, shared)
    trained, lost, queue = train(redis_server.url, queue_name, shared)
    assert lost == []
    assert sorted(trained) == sorted(f"s{i}" for i in range(SAMPLES)) and len(trained) == SAMPLES
    stats = queue.stats()
    assert (stats.acked, stats.dead_lettered, stats.pending, stats.outstanding) == (SAMPLES, 0, 0, 0)
    queue.disconnect()
    queue.store.close()
    assert entries(shared) == []


def test_files_deleted_under_the_queue_are_dead_lettered_lost_once_naming_the_path(
    redis_server: Any, queue_name: str, tmp_path: Path
) -> None:
    shared = tmp_path / "shared"
    produce(redis_server.url, queue_name, shared)
    deleted = {}
    for sample_id in ("s3", "s17"):  # an operator's rm
        [name] = [
            name for name in os.listdir(shared) if name.startswith(f"{sample_id}@") and name.endswith(".safetensors")
        ]
        os.unlink(shared / name)
        deleted[sample_id] = str(shared / name)
    trained, lost, queue = train(redis_server.url, queue_name, shared)
    assert sorted(exc.sample_id for exc in lost) == sorted(deleted)
    assert all(deleted[exc.sample_id] in str(exc) for exc in lost), [str(exc) for exc in lost]
    assert len(trained) == SAMPLES - 2 and not set(trained) & set(deleted)
    letters = queue.dead_letters()
    assert sorted((letter.ref.sample_id, letter.reason, letter.deliveries) for letter in letters) == [
        ("s17", LOST_REASON, 1),
        ("s3", LOST_REASON, 1),
    ], "each lost sample is dead-lettered at its first read, never redelivered"
    assert queue.stats().acked == SAMPLES - 2
    queue.disconnect()
    queue.store.close()
    assert entries(shared) == []

"""An error inside ``with FeatureDataLoader(...)`` ends that trainer, not the run.

Over a real Redis queue with a producer in another process: the trainer's step raises, its leases go back
(failed, redelivered) and the shared queue stays open, so the producer carries on and puts every sample; a
second trainer trains each of them exactly once after the run's end (the queue's close) and nothing is left in
the shared directory. ``close_queue=False`` keeps even a normal ``close()`` from ending the run.
"""

from __future__ import annotations

import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import pytest

from featurestream import FeatureDataLoader, LocalFeatureStore, SampleRefQueue, SharedDirFeatureStore
from featurestream import VisibilityTimeout as VT
from featurestream.stores.arena import entries
from featurestream.testing import sample_tensors

redis = pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")
from featurestream.backends.redis.queue import RedisSampleRefQueue  # noqa: E402 - needs redis-py

WORKER = str(Path(__file__).with_name("_redis_worker.py"))
SAMPLES = 30  # past the producer's high watermark (16 samples): it needs the trainers to make room
DEADLINE = 120.0


class StepFailed(RuntimeError):
    pass


def trainer_queue(url: str, name: str, shared: Path) -> tuple[RedisSampleRefQueue, SharedDirFeatureStore]:
    store = SharedDirFeatureStore(shared, max_samples=None, max_bytes=1 << 30)
    return RedisSampleRefQueue(store, VT(30.0), url=url, name=name, reconnect_timeout=60.0), store


def test_an_error_in_the_with_block_fails_the_leases_back_and_leaves_the_shared_queue_open(
    redis_server: Any, tmp_path: Path
) -> None:
    name, shared = f"loader-error-{uuid.uuid4().hex}", tmp_path / "shared"
    queue, store = trainer_queue(redis_server.url, name, shared)
    producer = subprocess.Popen(
        [sys.executable, WORKER, "produce", redis_server.url, name, str(shared), str(tmp_path / "p.log"), "0",
         str(SAMPLES)],
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        with pytest.raises(StepFailed), FeatureDataLoader(queue, store, prefetch=2) as loader:
            for _ in loader:
                raise StepFailed("a sample without supervision")  # the trainer's step fails
        assert not queue.is_closed and queue.lifecycle_state == "open"
        stats = queue.stats()
        assert stats.failed >= 1 and stats.outstanding == 0, "the held and the prefetched leases went back"

        # The run goes on: another trainer trains every sample; the run ends when the producer is done.
        survivor, survivor_store = trainer_queue(redis_server.url, name, shared)

        def end_of_run() -> None:
            producer.wait(timeout=DEADLINE)
            survivor.close()

        closer = threading.Thread(target=end_of_run)
        closer.start()
        with FeatureDataLoader(survivor, survivor_store, prefetch=2) as trainer:
            trained = [lease.ref.sample_id for _ in trainer for lease in trainer.current_leases]
        closer.join(DEADLINE)
    finally:
        if producer.poll() is None:
            producer.kill()
    assert producer.returncode == 0, producer.stderr.read().decode(errors="replace")  # type: ignore[union-attr]
    assert sorted(trained) == sorted(f"s{index}" for index in range(SAMPLES)), "each sample trained once"
    final = survivor.stats()
    assert (final.put, final.acked, final.dead_lettered, final.pending, final.outstanding) == (
        SAMPLES,
        SAMPLES,
        0,
        0,
        0,
    )
    assert survivor.lifecycle_state == "drained"
    store.close()
    survivor_store.close()
    assert entries(shared) == [], "no sample, link or marker left"
    queue.disconnect()
    survivor.disconnect()


def test_close_queue_false_leaves_the_queue_open_on_a_normal_close() -> None:
    store = LocalFeatureStore()
    queue = SampleRefQueue(store)
    queue.put(store.put("s0", sample_tensors(0)))
    with FeatureDataLoader(queue, store, prefetch=0, close_queue=False) as loader:
        next(loader)
    assert not queue.is_closed and queue.stats().acked == 1
    with FeatureDataLoader(queue, store, prefetch=0) as loader:
        pass
    assert queue.is_closed, "the default (close_queue=True) ends the run, as the reference's loader"


def test_close_queue_must_be_a_bool() -> None:
    store = LocalFeatureStore()
    with pytest.raises(TypeError, match="close_queue must be a bool, got 0"):
        FeatureDataLoader(SampleRefQueue(store), store, close_queue=0)  # type: ignore[arg-type]

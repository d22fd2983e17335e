"""A user-registered algorithm streamed across processes over Redis, and a consumer that never registered it.

The algorithm (``acme.msd``, tests/backends/redis/_acme_algorithm.py) is registered from outside featurestream. Its name
travels on the wire; this process produces and queues its samples; a consumer process that has not registered it
gets an error naming the algorithm and how to register it, and its lease is failed back, never dropped or acked; a
consumer process that registered it then trains every sample, byte for byte.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest

from featurestream import FeatureAlgorithm, FeatureDataLoader, FeatureProducer, SharedDirFeatureStore
from featurestream.stores.arena import entries

redis = pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")
import torch  # noqa: E402
from _acme_algorithm import NAME, CountingBackend  # noqa: E402 - registers acme.msd, as a user's package would

from featurestream.backends.redis.queue import RedisSampleRefQueue  # noqa: E402 - needs redis-py
from support.algorithm_samples import sample_of  # noqa: E402

WORKER = str(Path(__file__).with_name("_algorithm_worker.py"))
COUNT = 3


def run_worker(*args: object) -> dict[str, Any]:
    result = subprocess.run(
        [sys.executable, WORKER, *map(str, args)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr[-4000:]
    lines = result.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else {}


def test_a_registered_algorithm_streams_across_processes_and_an_unregistered_consumer_fails_it_back(
    redis_server: Any, tmp_path: Path
) -> None:
    name = f"acme-{uuid.uuid4().hex}"
    shared = tmp_path / "shared"
    store = SharedDirFeatureStore(shared)
    queue = RedisSampleRefQueue(store, url=redis_server.url, name=name)
    try:
        producer = FeatureProducer(CountingBackend(), store, run_id="acme")
        assert producer.algorithm == NAME, "inferred from the registered backend base class"
        ones = torch.ones((1, 4), dtype=torch.int64)
        for _ in range(COUNT):
            queue.put(producer.produce(input_ids=0 * ones, attention_mask=ones, loss_mask=ones))
        assert queue.pending_count() == COUNT

        met = run_worker("consume-bare", redis_server.url, name, shared)["error"]
        assert "is 'acme.msd' (acme.msd)" in met and "its lease was failed" in met
        assert "no feature schema is registered for algorithm 'acme.msd'" in met and "register_algorithm" in met
        stats = queue.stats()
        assert (stats.failed, stats.acked, queue.pending_count()) == (1, 0, COUNT), "failed back, not dropped"

        trained = run_worker("consume", redis_server.url, name, shared, COUNT)["batches"]
        # Sample n carries n in every feature (_acme_algorithm.acme_sample); the failed-back one comes last.
        indices = sorted(int(batch["draft_hidden"][0][0][0]) for batch in trained)
        assert indices == list(range(1, COUNT + 1))
        for batch in trained:
            index = int(batch["draft_hidden"][0][0][0])
            assert batch["input_ids"] == [[100 * index + t for t in range(4)]]
            assert batch["head_logits"] == [[[[-float(index)] * 5] * 2] * 4]
        assert queue.stats().acked == COUNT and queue.pending_count() == 0
        assert entries(shared) == [], "every acked sample's bytes left the directory"
    finally:
        queue.close()


@pytest.mark.parametrize("algorithm", [FeatureAlgorithm.DFLASH, FeatureAlgorithm.DSPARK])
def test_dflash_and_dspark_samples_stream_through_a_redis_queue_to_another_handle(
    redis_server: Any, tmp_path: Path, algorithm: FeatureAlgorithm
) -> None:
    name = f"algo-{uuid.uuid4().hex}"
    writer = SharedDirFeatureStore(tmp_path)
    producer_side = RedisSampleRefQueue(writer, url=redis_server.url, name=name)
    consumer_side = RedisSampleRefQueue(SharedDirFeatureStore(tmp_path), url=redis_server.url, name=name)
    samples = [sample_of(algorithm, index) for index in range(3)]
    try:
        for index, tensors in enumerate(samples):
            producer_side.put(writer.put(f"s{index}", tensors, run_id="r", algorithm=algorithm))
        producer_side.close()
        with FeatureDataLoader(consumer_side, consumer_side.store, algorithm=algorithm, prefetch=2) as loader:
            batches = list(loader)
        assert [type(batch).__name__ for batch in batches] == [type(batches[0]).__name__] * 3
        for batch, tensors in zip(batches, samples, strict=True):
            assert list(batch.keys()) == list(tensors)
            assert all(torch.equal(batch[n], t) for n, t in tensors.items())
        assert consumer_side.stats().acked == 3 and entries(tmp_path) == []
    finally:
        producer_side.close()
        consumer_side.close()

"""The operator commands over DFlash, DSpark and a user algorithm the operator's process never registered:
``featurestream status`` and ``featurestream dead-letters`` list, requeue and purge their samples as any other."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import pytest

from featurestream import FeatureAlgorithm
from featurestream.common.refs import required_features
from support.algorithm_samples import dflash_sample, sample_of

from .test_cli_redis import Run, cli, kill, producer  # noqa: F401 - the fixtures, shared with the CLI's own tests

redis = pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")
from featurestream.backends.redis.queue import RedisSampleRefQueue  # noqa: E402 - needs redis-py

# A user algorithm's name: its samples reach the operator, who has not registered it (nor has this process).
UNREGISTERED = "acme.ops"


def samples(algorithm: FeatureAlgorithm | str, index: int) -> dict[str, Any]:
    if algorithm == UNREGISTERED:
        return {"draft_hidden": dflash_sample(index)["hidden_states"], "input_ids": dflash_sample(index)["input_ids"]}
    return sample_of(FeatureAlgorithm(algorithm), index)


@pytest.mark.parametrize("algorithm", [FeatureAlgorithm.DFLASH, FeatureAlgorithm.DSPARK, UNREGISTERED])
def test_dead_letters_of_any_algorithm_are_listed_requeued_and_purged(
    cli: Run,  # noqa: F811
    producer: Callable[..., RedisSampleRefQueue],  # noqa: F811
    algorithm: FeatureAlgorithm | str,
) -> None:
    assert required_features(UNREGISTERED) is None, "nobody in this process declared it"
    queue = producer(max_deliveries=1, keep_dead_letter_bytes=1 << 30)
    for index, sample_id in enumerate(("a", "b")):
        queue.put(queue.store.put(sample_id, samples(algorithm, index), run_id="run", algorithm=algorithm))
    kill(queue, "a")
    kill(queue, "b")
    status, out, _ = cli("dead-letters", "list", args=("--json",))
    assert status == 0 and [d["sample_id"] for d in json.loads(out)["dead_letters"]] == ["a", "b"]
    status, out, _ = cli("dead-letters", "requeue", args=("a",))
    assert status == 0 and out.strip() == "requeued 1 dead letter: a"
    lease = queue.acquire(timeout=0)
    assert lease is not None and lease.ref.algorithm == algorithm and lease.ref.sample_id == "a"
    tensors, handle = queue.store.get(lease.ref)
    assert list(tensors) == list(samples(algorithm, 0)), "the kept bytes, every feature"
    queue.store.release(handle)
    queue.ack(lease)
    status, out, _ = cli("dead-letters", "purge", args=("--all", "--json"))
    assert status == 0 and json.loads(out)["purged"] == ["b"]
    _, out, _ = cli("status", args=("--json",))
    counts = json.loads(out)
    assert (counts["pending"], counts["counters"]["acked"], counts["dead_letters"]["count"]) == (0, 1, 0)

"""``featurestream queues delete``: a finished queue leaves the server; one in use is refused unless forced."""

from __future__ import annotations

import json
from typing import Any

import pytest

from featurestream import LocalFeatureStore, QueueInUse, VisibilityTimeout
from featurestream.cli import main
from featurestream.testing import sample_tensors

redis = pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")
from featurestream.backends.redis.queue import RedisSampleRefQueue  # noqa: E402 - needs redis-py


def _listed(redis_server: Any, capsys: pytest.CaptureFixture[str]) -> list[str]:
    capsys.readouterr()
    assert main(["status", "--redis", redis_server.url, "--json"]) == 0
    return [queue["name"] for queue in json.loads(capsys.readouterr().out)["queues"]]


def test_delete_refuses_a_queue_in_use_deletes_a_finished_one_and_forces_a_leased_one(
    redis_server: Any, queue_name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    store = LocalFeatureStore()
    queue = RedisSampleRefQueue(store, VisibilityTimeout(30.0), url=redis_server.url, name=queue_name)
    queue.training_ledger().declare(["a"])  # a ledger key under the queue's prefix
    queue.put(store.put("s0", sample_tensors(0), run_id="r"))
    lease = queue.acquire(timeout=1)
    assert lease is not None
    target = ["--redis", redis_server.url, "--name", queue_name]
    for why in ("open with 1 live lease", "draining with 1 live lease"):
        capsys.readouterr()
        assert main(["queues", "delete", *target]) == 1
        assert f"queue {queue_name!r} is {why}: not deleted" in capsys.readouterr().err
        assert queue_name in _listed(redis_server, capsys), "nothing was deleted"
        queue.close()
    queue.ack(lease)
    assert queue.lifecycle_state == "drained"
    capsys.readouterr()
    assert main(["queues", "delete", *target, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["deleted_keys"] > 5
    assert queue_name not in _listed(redis_server, capsys)
    assert redis.Redis.from_url(redis_server.url).keys(f"featurestream:{{{queue_name}}}:*") == []
    assert main(["queues", "delete", *target]) == 2, "a missing queue"
    queue.disconnect()

    leased = RedisSampleRefQueue(store, VisibilityTimeout(30.0), url=redis_server.url, name=queue_name)
    leased.put(store.put("s1", sample_tensors(1), run_id="r"))
    assert leased.acquire(timeout=1) is not None
    with pytest.raises(QueueInUse, match="open with 1 live lease"):
        RedisSampleRefQueue.open(redis_server.url, queue_name).delete()
    assert RedisSampleRefQueue.open(redis_server.url, queue_name).delete(force=True) > 0
    assert queue_name not in _listed(redis_server, capsys)
    leased.disconnect()

"""``dead-letters purge`` frees a kept dead letter's bytes in a shared directory once its producer has exited."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from featurestream import SharedDirFeatureStore, VisibilityTimeout
from featurestream.cli import main
from featurestream.testing import sample_tensors

redis = pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")
from featurestream.backends.redis.queue import RedisSampleRefQueue  # noqa: E402 - needs redis-py


def test_purge_all_removes_the_data_file_marker_and_link_of_a_gone_producer(
    redis_server: Any, queue_name: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    directory = tmp_path / "features"
    store = SharedDirFeatureStore(directory)
    queue = RedisSampleRefQueue(
        store, VisibilityTimeout(30.0), url=redis_server.url, name=queue_name, max_deliveries=1,
        keep_dead_letter_bytes=1 << 30,
    )  # fmt: skip
    for index, sample_id in enumerate(("poison", "fine")):
        queue.put(store.put(sample_id, sample_tensors(index), run_id="run"))
    poisoned = queue.acquire(timeout=1)
    assert poisoned is not None and queue.fail(poisoned)  # dead, its bytes kept for a requeue
    fine = queue.acquire(timeout=1)
    assert fine is not None and queue.ack(fine)
    queue.disconnect()
    store.close()  # the producer and trainer have exited (close waits for the acked sample's unlink)
    kept = sorted(path.name for path in directory.iterdir())
    assert len(kept) == 3 and all(name.startswith("poison") for name in kept), kept  # data file, marker, link

    run: Callable[..., int] = main
    status = run(["dead-letters", "purge", "--redis", redis_server.url, "--name", queue_name, "--all", "--json"])
    out = capsys.readouterr().out
    assert status == 0 and json.loads(out)["purged"] == ["poison"]
    assert sorted(path.name for path in directory.iterdir()) == [], "purge released the kept bytes"

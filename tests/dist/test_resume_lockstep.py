"""Data-parallel ranks in lockstep resume together: two gloo ranks over one Redis queue, a producer process,
one rank killed mid-run; relaunched, both restore from the same checkpoint step and finish the epoch with
every prompt trained exactly once across the two ranks (``docs/resume.md``)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from ._resume_rank import run_resume_rank
from .test_lockstep import launch


@pytest.mark.timeout(180)
def test_lockstep_ranks_restore_from_the_same_step_and_train_every_prompt_once(
    redis_server: Any, tmp_path: Path
) -> None:
    n = 12
    name, shared, checkpoints = f"resume-dp-{uuid.uuid4().hex}", tmp_path / "shared", tmp_path / "checkpoints"
    shared.mkdir()
    config = {
        "url": redis_server.url,
        "name": name,
        "dir": str(shared),
        "checkpoints": str(checkpoints),
        "visibility": 5.0,  # long enough that a loaded machine never expires a live lease
        "every": 2,
    }
    command = [sys.executable, "-m", "featurestream.testing.resume", "producer", "--url", redis_server.url]
    command += ["--name", name, "--store-dir", str(shared), "--prompts", str(n)]
    err = tmp_path / "producer.err"
    with err.open("wb") as stderr:  # a file, not a pipe nobody reads until the end: it never blocks the producer
        producer = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=stderr)
    try:
        first = launch(tmp_path, 2, target=run_resume_rank, start_method="spawn", crash={"rank": 1, "at": 3}, **config)
        assert first[1]["exit"] == 3, first[1]
        assert first[0]["errors"] and first[0]["steps"] == -1, "the survivor stopped with the collective's error"
        second = launch(tmp_path, 2, target=run_resume_rank, start_method="spawn", **config)
    finally:
        from featurestream.backends.redis.queue import RedisSampleRefQueue
        from featurestream.stores.shared_dir import SharedDirFeatureStore

        queue = RedisSampleRefQueue(SharedDirFeatureStore(shared, max_samples=None, max_bytes=1 << 30), url=redis_server.url, name=name)
        queue.close()  # ends the producer's run
        ledger = queue.training_ledger()
        queue.disconnect()
        producer.wait(timeout=60)
    assert producer.returncode == 0, err.read_text()[-3000:]
    for rank, result in enumerate(second):
        assert result["exit"] == 0 and not result["errors"], (rank, result)
        assert result["restored"] == ["2 1"], "each rank restored at step 2, giving back its step 3's prompt"
    assert second[0]["steps"] == second[1]["steps"] == n // 2
    trained = [key for result in second for key in result["trained"]]
    assert Counter(trained) == Counter(str(i) for i in range(n)), "every prompt once, across the two ranks"
    assert sorted(key for rank in (0, 1) for keys in ledger.history(rank).values() for key in keys) == sorted(trained)

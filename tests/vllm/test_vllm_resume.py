"""The resume recipe over a vLLM producer: an engine SIGKILLed mid-run, restarted, trains every prompt once.

The producer is ``ResumableProducer`` over a ``VLLMDFlashTarget`` in ``.venv-vllm`` (``_engine.py produce``); the
trainer is ``featurestream.testing.resume``'s checkpointing trainer in this environment; the queue a Redis with
AOF, the store a shared directory whose cap (4 samples) keeps the producer mid-run while the trainer is slow.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from pathlib import Path

import torch

from featurestream.backends.redis.queue import RedisSampleRefQueue
from featurestream.core.lease import VisibilityTimeout
from featurestream.stores.arena import entries
from featurestream.stores.shared_dir import SharedDirFeatureStore
from featurestream.testing.resume import ResumeProcesses, check_history, latest_checkpoint

from .conftest import ENGINE, ROOT, engine_python, prompts

COUNT = 16
DEADLINE = 420.0


class _VLLMProcesses(ResumeProcesses):
    """The trainer of ``featurestream.testing.resume``, the producer ``_engine.py produce`` in ``.venv-vllm``."""

    def __init__(self, producer: list[str], common: list[str], checkpoints: Path, logs: Path) -> None:
        super().__init__(common, checkpoints, logs, step_seconds=0.3)
        self._producer = producer

    def _spawn(self, role: str) -> subprocess.Popen[bytes]:
        if role == "trainer":
            return super()._spawn(role)
        environment = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
        with self._errors[role].open("ab") as err:
            return subprocess.Popen(self._producer, stdout=subprocess.DEVNULL, stderr=err, env=environment)


def test_an_engine_killed_mid_run_and_restarted_trains_every_prompt_once(
    checkpoint: Path, redis_url: str, tmp_path: Path
) -> None:
    name = f"vllm-resume-{uuid.uuid4().hex}"
    shared, checkpoints = tmp_path / "shared", tmp_path / "checkpoints"
    checkpoints.mkdir()
    SharedDirFeatureStore(shared, max_samples=None, max_bytes=1 << 30, create=True).close()
    torch.save(prompts(COUNT, seed=1), tmp_path / "prompts.pt")
    producer = [
        str(engine_python()), str(ENGINE), "produce", "--model", str(checkpoint), "--prompts",
        str(tmp_path / "prompts.pt"), "--url", redis_url, "--name", name, "--store-dir", str(shared),
    ]  # fmt: skip
    common = ["--url", redis_url, "--name", name, "--store-dir", str(shared), "--prompts", str(COUNT)]
    common += ["--algorithm", "dflash", "--batch-size", "1"]  # prompts of several lengths: one per step
    watcher = RedisSampleRefQueue(SharedDirFeatureStore(shared), url=redis_url, name=name)
    ledger = watcher.training_ledger()
    give_up = time.monotonic() + DEADLINE
    killed_at = None
    with _VLLMProcesses(producer, common, checkpoints, tmp_path) as run:
        while not run.trained():
            assert time.monotonic() < give_up, f"no end by the deadline (producer killed at {killed_at})"
            time.sleep(0.2)
            progress = ledger.progress()
            if killed_at is None and progress.trained >= 2:
                assert progress.trained < COUNT, "the producer finished before it could be killed mid-run"
                killed_at = progress.trained
                assert run.restart("producer")
        run.finish()
    assert killed_at is not None
    final = latest_checkpoint(checkpoints)
    assert final is not None
    assert check_history(final["history"], COUNT) is None, check_history(final["history"], COUNT)
    # Nothing the killed engine stored and never enqueued is left once the orphan grace has passed.
    store = SharedDirFeatureStore(shared, max_samples=None, max_bytes=1 << 30, orphan_grace=1.0, orphan_interval=None)
    queue = RedisSampleRefQueue(store, VisibilityTimeout(1.0), url=redis_url, name=name)
    time.sleep(1.0)
    queue._reclaim_orphans(force=True)
    queue.disconnect()
    store.close()
    watcher.disconnect()
    assert entries(shared) == [], "orphaned sample files, links or markers left"

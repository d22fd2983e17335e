"""Resume over Redis: the ledger's contract on a real server, its durability, and SIGKILLed trainer and producer
processes restarted from the latest checkpoint many times (``docs/resume.md``)."""

from __future__ import annotations

import json
import random
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

redis = pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")

from featurestream import LocalFeatureStore, SharedDirFeatureStore, VisibilityTimeout  # noqa: E402
from featurestream.backends.redis.queue import RedisSampleRefQueue  # noqa: E402 - needs redis-py
from featurestream.core.resume import sample_id_for  # noqa: E402
from featurestream.stores.arena import entries  # noqa: E402
from featurestream.testing.resume import (  # noqa: E402
    ResumeProcesses,
    check_history,
    check_ledger,
    latest_checkpoint,
    produce,
    train,
)

DEADLINE = 240.0


def test_the_redis_ledger_keeps_the_ledger_contract(make: Any) -> None:
    check_ledger(make(LocalFeatureStore()).training_ledger())


def test_holds_reads_what_any_instance_of_the_queue_holds(make: Any) -> None:
    store = LocalFeatureStore()
    queue, other = make(store), make(store)
    ref = store.put(sample_id_for("r", "0", 1), _tensors(), run_id="r")
    queue.put(ref)
    assert other.training_ledger().holds([ref.sample_id, "nothing"]) == {ref.sample_id}
    assert other.training_ledger().holds([]) == set()


def _tensors() -> dict[str, Any]:
    from featurestream.testing import sample_tensors

    return sample_tensors(0)


def test_the_ledger_survives_a_sigkilled_redis(durable_redis: Any) -> None:
    name = f"resume-{uuid.uuid4().hex}"
    queue = RedisSampleRefQueue(LocalFeatureStore(), url=durable_redis.url, name=name, reconnect_timeout=30.0)
    ledger = queue.training_ledger()
    ledger.declare(["0", "1", "2"])
    assert ledger.claim({"0": 0, "1": 0}) == {"0": 1, "1": 1}
    incarnation = ledger.restore(0, 0).incarnation
    ledger.commit(0, incarnation, 1, ["0"])
    durable_redis.restart(kill=True)  # no shutdown save: only the AOF brings it back
    assert ledger.history(0) == {1: ["0"]}
    assert ledger.generations(["0", "1", "2"]) == [1, 1, 0]
    progress = ledger.progress()
    assert (progress.declared, progress.trained, progress.restores) == (3, 1, 1)
    queue.disconnect()


def test_in_process_over_redis_a_restore_reproduces_only_the_rolled_back_prompts(make: Any, tmp_path: Path) -> None:
    """The in-process kit over a Redis queue: a trainer killed two steps after its last checkpoint."""
    import threading

    store = LocalFeatureStore(max_samples=256)
    queue = make(store, visibility_timeout=VisibilityTimeout(0.5))
    reports: list[Any] = []
    producer = threading.Thread(target=lambda: reports.append(produce(queue, store, 20)), daemon=True)
    producer.start()
    steps = 0

    def crash(point: str) -> None:  # checkpoints at steps 2 and 4; killed in step 6: step 5 is committed, unsaved
        nonlocal steps
        steps += point == "step"
        if steps == 6:
            raise RuntimeError("killed")

    with pytest.raises(RuntimeError, match="killed"):
        train(queue, store, tmp_path, every=2, batch_size=2, prefetch=0, crash=crash)
    history = train(queue, store, tmp_path, every=2, batch_size=2, prefetch=0)
    producer.join(30)
    assert check_history(history, 20) is None, check_history(history, 20)
    assert reports[0].produced == 20 + 2  # step 5's two prompts; step 6's were never acked: redelivered


@pytest.mark.parametrize("seed", [1, 2])
def test_sigkilled_trainer_and_producer_processes_train_every_prompt_once(
    durable_redis: Any, tmp_path: Path, seed: int
) -> None:
    """A trainer process and a producer process over a Redis queue and a shared directory, each SIGKILLed at
    seeded random instants (Redis too, once) and restarted; the trainer always from its latest checkpoint."""
    n, kills = 48 - seed + 1, 8  # seed 2: 47 prompts in batches of 2, the epoch ends with a short batch
    rng = random.Random(seed)
    name = f"resume-{uuid.uuid4().hex}"
    shared, checkpoints = tmp_path / "shared", tmp_path / "checkpoints"
    checkpoints.mkdir()
    SharedDirFeatureStore(shared, max_samples=None, max_bytes=1 << 30)
    # An hour's orphan grace: only the drained queue's sweep can free what a killed producer left.
    common = ["--url", durable_redis.url, "--name", name, "--store-dir", str(shared), "--prompts", str(n)]
    common += ["--orphan-grace", "3600"]
    killed = {"trainer": 0, "producer": 0, "redis": 0}
    give_up = time.monotonic() + DEADLINE
    with ResumeProcesses(common, checkpoints, tmp_path, step_seconds=0.05) as run:
        while not run.trained():
            assert time.monotonic() < give_up, f"no end by the deadline; killed {killed}"
            time.sleep(rng.uniform(0.5, 3.0 if killed["trainer"] >= 2 else 1.5))
            if sum(killed.values()) >= kills or run.trained():
                continue
            # The first two kills are the trainer's, so every run restores from a checkpoint at least twice
            # however fast the machine lets it finish; the rest are drawn.
            choices = ["trainer", "trainer", "producer", "both"] + (["redis"] if not killed["redis"] else [])
            victim = "trainer" if killed["trainer"] < 2 else rng.choice(choices)
            if victim == "redis":
                durable_redis.restart(kill=True)
                killed["redis"] += 1
                continue
            for role in ("trainer", "producer") if victim == "both" else (victim,):
                killed[role] += run.restart(role)
        run.finish()
    print(f"resume processes seed {seed}: killed {killed}")
    assert killed["trainer"] >= 2, killed
    final = latest_checkpoint(checkpoints)
    assert final is not None
    assert check_history(final["history"], n) is None, check_history(final["history"], n)
    assert final["loader"]["step"] == len(final["history"])
    # Every checkpoint the run left is a prefix of the final history: each restore continued a saved one.
    for path in checkpoints.glob("ckpt-*.json"):
        saved = json.loads(path.read_text())["history"]
        assert saved == final["history"][: len(saved)], path.name
    # Nothing is left behind once both processes closed cleanly: what the killed producers stored and never
    # enqueued went with the drained queue's sweep (the trainer's close), without waiting out a grace period.
    assert entries(shared) == [], "orphaned sample files, links or markers left"


def test_the_resume_machine_on_redis(redis_server: Any) -> None:
    """spec/Resume.tla's actions on RedisSampleRefQueue and its ledger (a fresh queue name per example)."""
    from hypothesis import settings

    from featurestream.testing.resume_machine import make_resume_machine

    client = redis.Redis.from_url(redis_server.url)

    def queue_factory(store: Any, clock: Any) -> RedisSampleRefQueue:
        name = f"resume-machine-{uuid.uuid4().hex}"
        return RedisSampleRefQueue(store, VisibilityTimeout(5.0), client=client, name=name, clock=clock)

    case = make_resume_machine(queue_factory, name="RedisResumeMachine").TestCase
    case.settings = settings(max_examples=40, stateful_step_count=30, deadline=None)
    try:
        case("runTest").runTest()
    finally:
        client.close()


def test_a_queue_with_a_ledger_is_listed_once(make: Any, redis_server: Any, queue_name: str) -> None:
    from featurestream.backends.redis.queue import list_queues

    queue = make(LocalFeatureStore())
    ledger = queue.training_ledger()
    ledger.declare(["0"])
    ledger.restore(0, 0)
    listed = [name for name in list_queues(redis_server.url) if queue_name in name]
    assert listed == [queue_name]

"""Lockstep data-parallel loading with real ``torch.distributed`` gloo groups of 2 and 3 rank processes.

Over per-rank local queues (uneven counts) and over one shared Redis queue:
every rank takes the same number of steps (each step also runs an
``all_reduce``, as DDP does), every sample is trained on exactly once — in
lockstep, or afterwards from what the stop gave back — and nothing hangs: each
launch is bounded, and a killed rank makes the survivors stop with an error
while its leases are reclaimed and trained on by a later consumer.
"""

from __future__ import annotations

import multiprocessing
import os
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from featurestream.stores.arena import entries
from featurestream import FeatureDataLoader, SharedDirFeatureStore

from ._rank_worker import eagle3_tensors, run_rank, sample_id

LAUNCH_LIMIT_S = 45.0


def launch(
    tmp_path: Path,
    world: int,
    target: Callable[[dict[str, Any], int], None] = run_rank,
    start_method: str = "fork",
    **config: Any,
) -> list[dict[str, Any]]:
    """Run ``world`` rank processes of ``target`` to completion (killing them all past the limit); parse their logs.

    Forked by default (the ranks reuse the imported torch); ``start_method="spawn"`` starts clean interpreters,
    for a test whose parent process runs threads of its own at the fork.
    """
    run = tmp_path / f"run-{uuid.uuid4().hex[:8]}"
    run.mkdir()
    config |= {"world": world, "init": f"file://{run / 'group'}", "out": str(run)}
    context = multiprocessing.get_context(start_method)
    procs = [context.Process(target=target, args=(config, rank), daemon=True) for rank in range(world)]
    for proc in procs:
        proc.start()
    give_up = time.monotonic() + LAUNCH_LIMIT_S
    for proc in procs:
        proc.join(max(give_up - time.monotonic(), 0.1))
    hung = [rank for rank, proc in enumerate(procs) if proc.is_alive()]
    for proc in procs:
        if proc.is_alive():
            proc.kill()
            proc.join()
    assert not hung, f"ranks {hung} still running after {LAUNCH_LIMIT_S} s: a hang"
    results = []
    for rank, proc in enumerate(procs):
        log = run / f"rank{rank}.log"
        lines = log.read_text().splitlines() if log.exists() else []
        words = [(kind, rest) for kind, _, rest in (line.partition(" ") for line in lines)]
        results.append(
            {
                "exit": proc.exitcode,
                "trained": [rest for kind, rest in words if kind == "trained"],
                "leftover": [rest for kind, rest in words if kind == "leftover"],
                "skipped": sum(1 for kind, _ in words if kind == "skipped"),
                "errors": [rest for kind, rest in words if kind == "error"],
                "steps": next((int(rest) for kind, rest in words if kind == "steps"), None),
                "restored": [rest for kind, rest in words if kind == "restored"],
            }
        )
    return results


def assert_clean(results: list[dict[str, Any]]) -> None:
    for rank, result in enumerate(results):
        assert result["exit"] == 0 and not result["errors"], f"rank {rank}: exit {result['exit']}, {result['errors']}"


def local_ids(rank: int, count: int) -> list[str]:
    return [sample_id(1000 * rank + position) for position in range(count)]


@pytest.mark.timeout(120)
def test_three_ranks_over_uneven_local_queues_stop_together_at_the_shortest(tmp_path: Path) -> None:
    counts = [5, 8, 3]
    results = launch(tmp_path, 3, backend="local", counts=counts, prefetch=2, batch_size=1)
    assert_clean(results)
    assert [r["steps"] for r in results] == [3, 3, 3], "every rank stops at the step the shortest stream ends"
    for rank, result in enumerate(results):
        assert result["trained"] == local_ids(rank, counts[rank])[:3], "FIFO, in lockstep"
        everything = Counter(result["trained"] + result["leftover"])
        assert everything == Counter(local_ids(rank, counts[rank])), "given back, never lost or doubled"


@pytest.mark.timeout(120)
def test_two_ranks_with_batches_and_a_bad_sample_on_one_rank(tmp_path: Path) -> None:
    counts = [7, 4]
    results = launch(tmp_path, 2, backend="local", counts=counts, bad={"1": 2}, prefetch=0, batch_size=2)
    assert_clean(results)
    assert [r["skipped"] for r in results] == [0, 1], "rank 1 raised; rank 0 held its batch and voted again"
    assert [r["steps"] for r in results] == [2, 2]
    assert results[0]["trained"] == local_ids(0, 4) and results[1]["trained"] == local_ids(1, 4)
    assert Counter(results[0]["trained"] + results[0]["leftover"]) == Counter(local_ids(0, 7))
    assert results[1]["leftover"] == []


def fill_redis(server: Any, tmp_path: Path, count: int) -> dict[str, Any]:
    from featurestream.backends.redis.queue import RedisSampleRefQueue

    shared = tmp_path / "shared"
    name = f"lockstep-{uuid.uuid4().hex}"
    store = SharedDirFeatureStore(shared, max_samples=None, max_bytes=1 << 30)
    queue = RedisSampleRefQueue(store, url=server.url, name=name)
    for index in range(count):
        queue.put(store.put(sample_id(index), eagle3_tensors(index)))
    queue.close()
    queue.disconnect()
    return {"backend": "redis", "url": server.url, "name": name, "dir": str(shared)}


def drain_redis(config: dict[str, Any]) -> tuple[list[str], Any]:
    """Train on what the ranks left in the shared queue (given back, or reclaimed from a dead rank)."""
    from featurestream.backends.redis.queue import RedisSampleRefQueue

    store = SharedDirFeatureStore(config["dir"], max_samples=None, max_bytes=1 << 30)
    queue = RedisSampleRefQueue(store, url=config["url"], name=config["name"])
    loader = FeatureDataLoader(queue, store, prefetch=0)
    drained = [lease.ref.sample_id for _ in loader for lease in loader.current_leases]
    return drained, queue


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("world", "count", "prefetch", "batch_size"), [(3, 20, 2, 1), (2, 15, 0, 2)])
def test_ranks_sharing_a_redis_queue_take_equal_steps_and_train_each_sample_once(
    redis_server: Any, tmp_path: Path, world: int, count: int, prefetch: int, batch_size: int
) -> None:
    config = fill_redis(redis_server, tmp_path, count)
    results = launch(tmp_path, world, prefetch=prefetch, batch_size=batch_size, **config)
    assert_clean(results)
    steps = {r["steps"] for r in results}
    assert len(steps) == 1 and steps.pop() >= 1, [r["steps"] for r in results]
    drained, queue = drain_redis(config)
    trained = [sample for r in results for sample in r["trained"]]
    assert Counter(trained + drained) == Counter(sample_id(i) for i in range(count)), "exactly once"
    assert queue.stats().acked == count and queue.lifecycle_state == "drained"
    assert entries(config["dir"]) == [], "nothing left in the shared directory"


@pytest.mark.timeout(120)
def test_a_killed_rank_stops_the_survivors_and_its_samples_are_reclaimed(redis_server: Any, tmp_path: Path) -> None:
    count = 30
    config = fill_redis(redis_server, tmp_path, count)
    results = launch(tmp_path, 3, prefetch=2, batch_size=1, visibility=2.0, crash={"rank": 2, "after": 2}, **config)
    assert results[2]["exit"] == 3 and results[2]["steps"] is None, "rank 2 died mid-step"
    for survivor in results[:2]:
        assert survivor["exit"] == 0 and survivor["errors"], "the survivors stopped with the collective's error"
        assert survivor["steps"] == -1
    trained_steps = {len(r["trained"]) for r in results}
    assert trained_steps == {2}, "all ranks completed the same steps before the crash"
    drained, queue = drain_redis(config)  # waits out the dead rank's visibility timeout
    trained = [sample for r in results for sample in r["trained"]]
    assert Counter(trained + drained) == Counter(sample_id(i) for i in range(count)), "nothing lost or doubled"
    stats = queue.stats()
    assert stats.acked == count and stats.reclaimed >= 1 and stats.dead_lettered == 0

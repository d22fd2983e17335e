"""Processes, not threads: 2 producers + 3 consumers over one shared directory and one Redis, with faults.

One consumer is SIGKILLed while it holds a lease and a store handle, and the
Redis server (AOF, ``appendfsync always``) is SIGKILLed and restarted once
mid-run. Afterwards every sample was trained on (materialised with the right
bytes), the server accepted exactly one ack per sample, and nothing is left:
no sample or marker file in the directory, no held sample in Redis.
"""

from __future__ import annotations

import collections
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from featurestream import SharedDirFeatureStore
from featurestream.stores.arena import entries

redis = pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")
from featurestream.backends.redis.queue import RedisSampleRefQueue  # noqa: E402 - needs redis-py

WORKER = str(Path(__file__).with_name("_redis_worker.py"))
PER_PRODUCER = 40
SAMPLES = 2 * PER_PRODUCER
DEADLINE = 120.0


def _wait_for(what: str, condition: Any, procs: list[subprocess.Popen[bytes]]) -> None:
    give_up = time.monotonic() + DEADLINE
    while not condition():
        failed = [p.args for p in procs if p.poll() not in (None, 0, -signal.SIGKILL)]
        if failed or time.monotonic() > give_up:
            raise AssertionError(f"gave up waiting for {what}; failed workers: {failed}")
        time.sleep(0.02)


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_sigkilled_consumer_and_restarted_redis_lose_and_duplicate_nothing(durable_redis: Any, tmp_path: Path) -> None:
    name = f"procs-{uuid.uuid4().hex}"
    shared = tmp_path / "shared"
    observer = RedisSampleRefQueue(
        SharedDirFeatureStore(shared, max_samples=None, max_bytes=1 << 30),
        url=durable_redis.url, name=name, reconnect_timeout=60.0,
    )  # fmt: skip
    logs = {role: tmp_path / f"{role}.log" for role in ("p0", "p1", "c0", "c1", "c2")}

    def spawn(role: str, *args: object) -> subprocess.Popen[bytes]:
        command = [sys.executable, WORKER, *args[:1], durable_redis.url, name, str(shared), str(logs[role]), *args[1:]]
        return subprocess.Popen([str(part) for part in command], stderr=subprocess.PIPE)

    consumers = [spawn(f"c{n}", "consume", 5 if n == 0 else -1) for n in range(3)]
    producers = [spawn(f"p{n}", "produce", n * PER_PRODUCER, PER_PRODUCER) for n in range(2)]
    workers = consumers + producers
    try:
        # The victim holds its sixth lease (and handle) when it dies.
        holding = lambda: any(line.startswith("holding") for line in _lines(logs["c0"]))  # noqa: E731
        _wait_for("the victim to hold a lease", holding, workers)
        consumers[0].send_signal(signal.SIGKILL)
        held_by_victim = next(x.split()[1] for x in _lines(logs["c0"]) if x.startswith("holding"))
        # Redis dies (SIGKILL, no shutdown save) and comes back from its AOF mid-run.
        _wait_for("a third of the acks", lambda: observer.stats().acked >= SAMPLES // 3, workers)
        acked_before_restart = observer.stats().acked
        durable_redis.restart(kill=True)
        for producer in producers:
            producer.wait(timeout=DEADLINE)
        observer.close()
        for consumer in consumers[1:]:
            consumer.wait(timeout=DEADLINE)
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
    errors = [w.stderr.read().decode(errors="replace") for w in workers if w.returncode not in (0, -signal.SIGKILL)]
    assert not errors, errors
    assert consumers[0].returncode == -signal.SIGKILL

    everything = {f"s{i}" for i in range(SAMPLES)}
    consumed = collections.Counter(
        line.split()[1] for role in ("c0", "c1", "c2") for line in _lines(logs[role]) if line.startswith("consumed")
    )
    acks = collections.Counter(
        line.split()[1] for role in ("c0", "c1", "c2") for line in _lines(logs[role]) if line.startswith("Ack")
    )
    assert set(consumed) == everything, "some sample was never trained on"
    assert consumed[held_by_victim] >= 2, "the killed consumer's sample was not redelivered"
    assert set(acks) == everything and max(acks.values()) == 1, {s: n for s, n in acks.items() if n != 1}
    stats = observer.stats()
    assert acked_before_restart < SAMPLES, "the restart came after the run"
    assert (stats.put, stats.acked, stats.dead_lettered) == (SAMPLES, SAMPLES, 0)
    assert (stats.pending, stats.outstanding) == (0, 0)
    assert stats.reclaimed >= 1 and observer.lifecycle_state == "drained"
    assert entries(shared) == [], "sample or marker files left in the shared directory"
    client = redis.Redis.from_url(durable_redis.url)
    prefix = f"featurestream:{{{name}}}:"
    assert client.hlen(prefix + "refs") == client.hlen(prefix + "leases") == client.llen(prefix + "pending") == 0
    client.close()
    observer.disconnect()

"""Orphan reclaim over Redis with a shared-directory store: a producer process SIGKILLed between its store and
queue steps, restarted, leaves no file once the grace period has passed; kept dead-letter bytes of a producer
that exited are freed after their purge.

The trainer side is this test's own queue instance, whose reaper runs the store's sweep with the queue's answer to
"which of these samples do you hold?"; the grace period is a second.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from featurestream import SharedDirFeatureStore
from featurestream.stores.arena import entries

pytest.importorskip("redis", reason="redis-py is missing: pip install 'featurestream[redis]'")
from featurestream.backends.redis.queue import RedisSampleRefQueue
from featurestream.stores.directory import HOST
from featurestream.testing import sample_tensors

sys.path.insert(0, str(Path(__file__).parent))
from _orphan_worker import QUEUE_OPTIONS, TOKENS, dead_letter

WORKER = str(Path(__file__).with_name("_orphan_worker.py"))
GRACE = 1.0
DEADLINE = 30.0

Spawn = Callable[..., subprocess.Popen[str]]


@pytest.fixture
def spawn(request: pytest.FixtureRequest, queue_name: str, tmp_path: Path) -> Iterator[Spawn]:
    """``spawn(first, count, stop_at, where)``: a producer process (``where="lease"``: a trainer holding a lease);
    returns once it printed its first line. On the test's ``durable_redis`` when it has one."""
    durable = "durable_redis" in request.fixturenames
    server = request.getfixturevalue("durable_redis" if durable else "redis_server")
    procs: list[subprocess.Popen[str]] = []

    def start(first: int, count: int, stop_at: int = -1, where: str = "stored") -> subprocess.Popen[str]:
        args = [server.url, queue_name, tmp_path / "shared", first, count, stop_at, where]
        proc = subprocess.Popen([sys.executable, WORKER, *map(str, args)], stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline().strip()
        expected = "leased" if where == "lease" else "done" if stop_at < 0 else f"stopped s{stop_at}"
        assert line.startswith(expected), (line, proc.wait(5))
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)


@pytest.fixture
def trainer(redis_server: Any, queue_name: str, tmp_path: Path) -> Iterator[RedisSampleRefQueue]:
    store = SharedDirFeatureStore(tmp_path / "shared", create=True, orphan_grace=GRACE, orphan_interval=0.2)
    queue = RedisSampleRefQueue(store, url=redis_server.url, name=queue_name, reaper_interval=0.1, **QUEUE_OPTIONS)
    yield queue
    queue.disconnect()
    store.close()


def kill(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL


def train(queue: RedisSampleRefQueue, count: int) -> list[str]:
    """Lease, read (checking the bytes) and ack ``count`` samples; their ids in order."""
    trained = []
    while len(trained) < count:
        lease = queue.acquire(timeout=DEADLINE)
        assert lease is not None, f"trained only {trained}"
        tensors, handle = queue.store.get(lease.ref)
        expected = sample_tensors(int(lease.ref.sample_id[1:]), TOKENS)
        assert all(torch.equal(tensors[name], expected[name]) for name in expected), lease.ref.sample_id
        queue.store.release(handle)
        assert queue.ack(lease)
        trained.append(lease.ref.sample_id)
    return trained


def emptied(directory: Path) -> list[str]:
    """Wait until ``directory`` holds nothing (its data files, links and markers all gone); what is left."""
    give_up = time.monotonic() + DEADLINE
    while entries(directory) and time.monotonic() < give_up:
        time.sleep(0.05)
    return sorted(entries(directory))


def named(directory: Path) -> list[str]:
    """The directory's names but files on their way out (an ack's scrub renames a file so, then unlinks it)."""
    return sorted(name for name in os.listdir(directory) if not name.startswith(".scrubbed-"))


def data_files(directory: Path) -> list[str]:
    return sorted(name.split("@")[0] for name in os.listdir(directory) if "@" in name and name.endswith(".safetensors"))


@pytest.mark.parametrize("where", ["stored", "retained"])
def test_a_sigkilled_producer_restarted_leaves_no_file_once_the_grace_period_passed(
    spawn: Spawn, trainer: RedisSampleRefQueue, tmp_path: Path, where: str
) -> None:
    """Killed after ``store.put`` (no marker) or inside ``queue.put`` (marker written, never enqueued) of s3;
    the restarted producer puts s3 again (a new incarnation) and the rest."""
    shared = tmp_path / "shared"
    kill(spawn(0, 6, stop_at=3, where=where))
    assert train(trainer, 3) == ["s0", "s1", "s2"]
    assert set(data_files(shared)) <= {"s3"}, "the killed producer's s3 is the only file left (if not reclaimed yet)"
    spawn(3, 3)
    assert sorted(train(trainer, 3)) == ["s3", "s4", "s5"]
    assert emptied(shared) == [], "orphaned files outlived the grace period"
    assert trainer.stats().acked == 6 and trainer.pending_count() == 0


def test_kept_dead_letter_bytes_of_an_exited_producer_are_freed_after_the_purge(
    spawn: Spawn, trainer: RedisSampleRefQueue, redis_server: Any, queue_name: str, tmp_path: Path
) -> None:
    """Purged by an operator's handle (no store), the bytes used to wait for their producer's instance to scrub
    them, gone with its process; the trainer's reaper reclaims them."""
    shared = tmp_path / "shared"
    spawn(0, 1).wait(30)  # puts s0 and exits without closing its store
    assert dead_letter(trainer) == "s0"
    time.sleep(GRACE + 0.5)  # the writer is long dead, and the reaper's sweeps ran: a kept dead letter is held
    assert data_files(shared) == ["s0"]
    operator = RedisSampleRefQueue.open(redis_server.url, queue_name)  # `featurestream dead-letters purge`: no store
    assert operator.purge_dead_letters() == ["s0"]
    operator.disconnect()
    assert emptied(shared) == [], "the purged dead letter's bytes outlived their producer"


@pytest.mark.parametrize("where", ["stored", "retained", "dangling"])
def test_a_drained_queue_frees_a_killed_producers_leftovers_without_the_grace_period(
    spawn: Spawn, redis_server: Any, queue_name: str, tmp_path: Path, where: str
) -> None:
    """Killed after ``store.put`` of s3 (its file and link), inside its ``queue.put`` (a queued marker too), or so
    and its file gone since (a scrub killed halfway: a dangling link and a marker). Once the queue is closed and
    drained no enqueue can land, so the close frees them at once, with a grace period of an hour."""
    shared = tmp_path / "shared"
    producer = spawn(0, 4, stop_at=3, where="stored" if where == "stored" else "retained")
    kill(producer)
    store = SharedDirFeatureStore(shared, orphan_grace=3600.0, orphan_interval=None)
    queue = RedisSampleRefQueue(store, url=redis_server.url, name=queue_name, **QUEUE_OPTIONS)
    assert train(queue, 3) == ["s0", "s1", "s2"]
    if where == "dangling":
        [data] = [name for name in os.listdir(shared) if name.startswith("s3@") and name.endswith(".safetensors")]
        os.unlink(shared / data)
    left = named(shared)
    assert "s3.safetensors" in left, left
    assert any(name.endswith(".retained") for name in left) == (where != "stored"), left
    assert queue.reclaim_expired() == 0 and named(shared) == left, "nothing goes while the queue is open"
    # What a writer killed inside put (its temporary) and a process killed while unlinking (a file on its way
    # out) leave; a new instance would sweep them at its start, the drained sweep does at once.
    (shared / f".s7.{HOST}-{producer.pid}.0123.tmp").write_bytes(b"partial")
    (shared / ".scrubbed-0123").write_bytes(b"freed")
    queue.close()  # nothing pending or leased: drained
    assert entries(shared) == [], "the drained queue's sweep left the dead writer's files"
    queue.disconnect()
    store.close()


def test_the_drained_sweep_spares_a_live_writers_sample_and_a_kept_dead_letter(
    spawn: Spawn, trainer: RedisSampleRefQueue, tmp_path: Path
) -> None:
    """A writer that lives may still be between its ``store.put`` and its (refused) enqueue: its close frees its
    sample. A kept dead letter is the queue's until it is purged."""
    shared = tmp_path / "shared"
    spawn(0, 1).wait(30)  # puts s0 and exits without closing its store
    assert dead_letter(trainer) == "s0"  # its bytes kept
    writer = SharedDirFeatureStore(shared, orphan_interval=None)
    writer.put("s9", sample_tensors(9, TOKENS))
    trainer.close()  # drained: the dead letter is no lease
    assert data_files(shared) == ["s0", "s9"]
    writer.close()
    assert data_files(shared) == ["s0"]
    assert trainer.purge_dead_letters() == ["s0"]
    assert emptied(shared) == []


@pytest.mark.parametrize("where", ["stored", "retained"])
def test_a_sigkill_history_leaves_no_file_once_drained_and_closed(
    spawn: Spawn, durable_redis: Any, queue_name: str, tmp_path: Path, where: str
) -> None:
    """A producer SIGKILLed between its store and queue steps, a trainer process SIGKILLed holding a lease (and a
    handle), redis-server SIGKILLed (AOF) and restarted, the producer restarted: once the queue is drained and the
    trainer closed cleanly, the directory is empty, with a grace period of an hour."""
    shared = tmp_path / "shared"
    kill(spawn(0, 4, stop_at=3, where=where))  # s0..s2 queued; s3 stored (or retained), never enqueued
    kill(spawn(0, 0, where="lease"))  # s0 leased, read, never settled
    durable_redis.restart(kill=True)
    spawn(3, 3).wait(30)  # the restarted producer: s3 anew (another incarnation), s4, s5
    store = SharedDirFeatureStore(shared, orphan_grace=3600.0, orphan_interval=None)
    queue = RedisSampleRefQueue(store, url=durable_redis.url, name=queue_name, reaper_interval=0.1, **QUEUE_OPTIONS)
    assert sorted(train(queue, 6)) == [f"s{i}" for i in range(6)], "s0 is redelivered once its lease expired"
    assert len([name for name in os.listdir(shared) if name.startswith("s3@")]) >= 1, "the killed writer's s3 is left"
    queue.close()
    queue.disconnect()
    store.close()
    assert entries(shared) == []

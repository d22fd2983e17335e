"""Orphan reclaim on the shared-directory store: a writer killed before its queue step leaves nothing behind.

Writers run as real processes, SIGKILLed or exiting without ``close``: their liveness tokens are the kernel's
locks, so only a process's death releases one. Grace periods are a fraction of a second to keep the tests fast.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from featurestream import SampleRefQueue, SharedDirFeatureStore
from featurestream.stores import orphans
from featurestream.stores.arena import entries
from featurestream.testing import sample_tensors

GRACE = 0.3

WRITER = """
import sys, threading
from featurestream import SharedDirFeatureStore
from featurestream.testing import sample_tensors

directory, mode, *ids = sys.argv[1:]
store = SharedDirFeatureStore(directory, orphan_interval=None)
for index, sample_id in enumerate(ids):
    ref = store.put(sample_id, sample_tensors(index, 4))
    if mode == "retained":
        store.retain(ref)  # the queue's first step of a put; the process dies before the enqueue
print("stored", flush=True)
threading.Event().wait()
"""


def settled(directory: Path) -> list[str]:
    """The directory's names once the background deleter unlinked what was removed."""
    deadline = time.monotonic() + 10
    while any(name.startswith(".scrubbed-") for name in os.listdir(directory)):
        assert time.monotonic() < deadline, sorted(os.listdir(directory))
        time.sleep(0.005)
    return sorted(entries(directory))


@pytest.fixture
def killed_writer(tmp_path: Path) -> Iterator[object]:
    """``write(mode, *ids)``: a process stores ``ids`` (``mode`` ``retained``: and retains them) and is
    SIGKILLed before any queue step; returns once it is dead."""
    procs: list[subprocess.Popen[str]] = []

    def write(mode: str, *ids: str) -> None:
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(tmp_path), mode, *ids], stdout=subprocess.PIPE, text=True
        )
        procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "stored"
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL

    yield write
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_killed_writers_unqueued_samples_are_freed_once_the_grace_period_passed(
    tmp_path: Path, killed_writer: object
) -> None:
    killed_writer("stored", "s0", "s1")  # type: ignore[operator]
    assert len([name for name in os.listdir(tmp_path) if "@" in name]) == 2
    store = SharedDirFeatureStore(tmp_path, orphan_grace=GRACE, orphan_interval=None)  # notes the dead writer
    assert store.gc() == 0, "freed before the grace period passed"
    assert store.is_resident("s0") and store.is_resident("s1")
    time.sleep(GRACE)
    assert store.gc() == 2
    assert settled(tmp_path) == [], "data files or their <id>.safetensors links left"
    assert not store.is_resident("s0")


def test_a_live_writers_samples_are_never_reclaimed(tmp_path: Path) -> None:
    writer = SharedDirFeatureStore(tmp_path, orphan_interval=None)
    writer.put("s0", sample_tensors(0, 4))
    sweeper = SharedDirFeatureStore(tmp_path, orphan_grace=0.0, orphan_interval=None)
    time.sleep(0.05)
    assert sweeper.gc() == 0 and sweeper.reclaim_orphans(lambda ids: set(), force=True) == 0
    assert writer.is_resident("s0") and sweeper.is_resident("s0")
    writer.close()
    assert settled(tmp_path) == []


def test_a_dead_writers_marked_samples_wait_for_the_queue_to_let_them_go(tmp_path: Path, killed_writer: object) -> None:
    killed_writer("retained", "s0", "s1")  # type: ignore[operator]
    store = SharedDirFeatureStore(tmp_path, orphan_grace=GRACE, orphan_interval=None)
    time.sleep(GRACE)
    assert store.gc() == 0, "a marked sample was freed without asking the queue"
    asked: list[Sequence[str]] = []

    def holds_s0(sample_ids: Sequence[str]) -> set[str]:
        asked.append(sorted(sample_ids))
        return {"s0"} & set(sample_ids)

    def broken(sample_ids: Sequence[str]) -> set[str]:
        raise ConnectionError("queue unreachable")

    assert store.reclaim_orphans(broken, force=True) == 0, "a queue that cannot answer holds everything"
    assert store.reclaim_orphans(holds_s0, force=True) == 1
    assert asked == [["s0", "s1"]]
    assert store.is_resident("s0") and not store.is_resident("s1")
    names = settled(tmp_path)
    assert [name for name in names if name.startswith("s1")] == [], names
    assert store.reclaim_orphans(lambda ids: set(), force=True) == 1
    assert settled(tmp_path) == []


def test_a_reclaim_never_frees_a_later_put_of_the_same_id(tmp_path: Path, killed_writer: object) -> None:
    killed_writer("stored", "s0")  # type: ignore[operator]
    store = SharedDirFeatureStore(tmp_path, orphan_grace=GRACE, orphan_interval=None)
    ref = store.put("s0", sample_tensors(7, 4))  # the restarted producer puts the id again
    time.sleep(GRACE)
    assert store.gc() == 1
    names = settled(tmp_path)
    assert names == sorted([os.path.basename(store.data_path(ref)), "s0.safetensors"]), names
    assert os.readlink(tmp_path / "s0.safetensors") == os.path.basename(store.data_path(ref))
    got, handle = store.get(ref)
    store.release(handle)
    assert got.keys() == sample_tensors(7, 4).keys()


def test_markers_and_links_a_scrub_killed_halfway_left_go_with_their_dead_writer(
    tmp_path: Path, killed_writer: object
) -> None:
    killed_writer("retained", "s0", "s1")  # type: ignore[operator]
    for name in os.listdir(tmp_path):  # a scrub moved both data files out and died: links and markers are left
        if "@" in name and name.endswith(".safetensors"):
            os.unlink(tmp_path / name)
    assert len(entries(tmp_path)) == 4
    store = SharedDirFeatureStore(tmp_path, orphan_grace=GRACE, orphan_interval=None)
    time.sleep(GRACE)
    assert store.gc() == 2, "no queue is asked about samples whose bytes are gone"
    assert settled(tmp_path) == []


def test_the_stores_own_sweep_frees_orphans_without_any_call(tmp_path: Path, killed_writer: object) -> None:
    killed_writer("stored", "s0")  # type: ignore[operator]
    store = SharedDirFeatureStore(tmp_path, orphan_grace=GRACE, orphan_interval=0.1)
    deadline = time.monotonic() + 10
    while any("@" in name for name in os.listdir(tmp_path)):
        assert time.monotonic() < deadline, sorted(os.listdir(tmp_path))
        time.sleep(0.05)
    assert settled(tmp_path) == []
    store.close()


def test_the_queues_reaper_frees_a_dead_writers_marked_sample_the_queue_does_not_hold(
    tmp_path: Path, killed_writer: object
) -> None:
    """Retained, then killed before the enqueue: only the queue can say it never took the sample."""
    killed_writer("retained", "s0")  # type: ignore[operator]
    store = SharedDirFeatureStore(tmp_path, orphan_grace=GRACE, orphan_interval=None)
    queue = SampleRefQueue(store, keep_dead_letter_bytes=1 << 20)
    time.sleep(GRACE)
    assert queue._holds_or_dead(["s0", "s1"]) == set()
    assert queue._reclaim_orphans(force=True) == 1
    assert settled(tmp_path) == []


def test_orphan_options_are_checked(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="orphan_grace must be a finite number of seconds >= 0, got -1"):
        SharedDirFeatureStore(tmp_path, orphan_grace=-1)
    with pytest.raises(ValueError, match="orphan_interval must be > 0 seconds, got 0"):
        SharedDirFeatureStore(tmp_path, orphan_interval=0)
    assert entries(tmp_path) == []


def test_incarnations_name_their_writer_and_the_token_dies_with_close(tmp_path: Path) -> None:
    writer = SharedDirFeatureStore(tmp_path, orphan_interval=None)
    prober = SharedDirFeatureStore(tmp_path, orphan_interval=None)
    ref = writer.put("s0", sample_tensors(0, 4))
    token = os.path.basename(writer.data_path(ref)).split("@")[1][: orphans.TOKEN_DIGITS]
    assert prober._writer.alive(token) and not prober._writer.alive("1".zfill(orphans.TOKEN_DIGITS))
    writer.close()
    assert not prober._writer.alive(token)


def test_the_orphan_clock_frees_only_after_the_grace_and_forgets_writers_gone() -> None:
    now = [100.0]
    clock = orphans.OrphanClock(grace=2.0, interval=1.0, clock=lambda: now[0])
    assert clock.due(False) and not clock.due(False)
    assert clock.due(True) and not clock.due(True), "the store's own sweeps do not starve the queue's"
    assert clock.ripe({"a": False, "b": True}) == set()
    now[0] += 1.0
    assert clock.due(False) and clock.due(True)
    assert clock.ripe({"a": False, "b": False}) == set()
    now[0] += 1.0
    assert clock.ripe({"a": False, "b": False}) == {"a"}
    assert clock.ripe({"b": True}) == set()  # a gone (nothing of it left), b alive again: both forgotten
    now[0] += 5.0
    assert clock.ripe({"a": False, "b": False}) == set()

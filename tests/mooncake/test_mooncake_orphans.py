"""Orphan reclaim on Mooncake with a dedicated storage process: a producer process (no segment of its own) killed
before its enqueue leaves objects in the storage's segment; once its record stopped beating for the grace period,
a sweep with the queue's word removes the ones the queue does not hold, and the record with the last of them."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest

from featurestream.testing import sample_tensors
from featurestream.tools.mooncake import MooncakeMaster

GRACE = 1.0

# A producer with no segment (its objects go to the storage's): puts b0..b<count-1>, beats every 0.2 s, and waits.
PRODUCER = """
import sys, threading
from featurestream import MooncakeFeatureStore
from featurestream.testing import sample_tensors
master, metadata, namespace, count = sys.argv[1:]
store = MooncakeFeatureStore(
    master_server_address=master, metadata_server=metadata, local_hostname="127.0.0.1",
    global_segment_size=0, namespace=namespace, close_timeout=0, orphan_interval=0.2,
)
for i in range(int(count)):
    store.put(f"b{i}", sample_tensors(i, tokens=4))
print("put", flush=True)
threading.Event().wait()
"""


@pytest.fixture
def storage(mooncake_master: MooncakeMaster, namespace: str) -> Iterator[Any]:
    """The dedicated storage process's store (this process): a segment for everyone's objects; it sweeps too."""
    from featurestream import MooncakeFeatureStore

    kwargs = mooncake_master.store_kwargs(namespace=namespace, global_segment_size=64 << 20, close_timeout=0)
    store = MooncakeFeatureStore(**kwargs, orphan_grace=GRACE)
    yield store
    store.close(force=True)


@pytest.fixture
def producer(mooncake_master: MooncakeMaster, namespace: str) -> Iterator[Any]:
    procs: list[subprocess.Popen[str]] = []

    def start(count: int) -> subprocess.Popen[str]:
        args = [mooncake_master.master_server_address, mooncake_master.metadata_server, namespace, str(count)]
        proc = subprocess.Popen([sys.executable, "-c", PRODUCER, *args], stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "put", proc.wait(30)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(30)


def slots_taken(store: Any) -> int:
    return sum(int(found) == 1 for found in store._client.batch_is_exist(store._slots))


def test_a_killed_producers_objects_go_once_its_record_stopped_beating_and_the_queue_does_not_hold_them(
    storage: Any, producer: Any
) -> None:
    proc = producer(3)
    assert storage.health().sample_count == 3 and slots_taken(storage) == 1
    proc.kill()
    proc.wait(30)
    assert storage.reclaim_orphans(lambda ids: set(), force=True) == 0, "freed before the grace period passed"
    time.sleep(GRACE + 0.5)
    assert storage.reclaim_orphans(None, force=True) == 0, "without the queue's word nothing can be told apart"
    asked: list[list[str]] = []

    def holds_b0(sample_ids: Any) -> set[str]:
        asked.append(list(sample_ids))
        return {"b0"} & set(sample_ids)

    assert storage.reclaim_orphans(holds_b0, force=True) == 2
    assert asked == [["b0", "b1", "b2"]]
    assert storage.is_resident("b0") and not storage.is_resident("b1") and not storage.is_resident("b2")
    assert slots_taken(storage) == 1, "the dead writer's record stays while the queue holds one of its objects"
    assert storage.reclaim_orphans(lambda ids: set(), force=True) == 1
    assert slots_taken(storage) == 0 and storage.health().sample_count == 0


def test_a_live_producers_objects_are_never_reclaimed(storage: Any, producer: Any) -> None:
    producer(2)
    time.sleep(GRACE + 0.5)
    assert storage.reclaim_orphans(lambda ids: set(), force=True) == 0
    assert storage.health().sample_count == 2


def test_orphan_options_are_checked(mooncake_master: MooncakeMaster, namespace: str) -> None:
    from featurestream import MooncakeFeatureStore

    kwargs = mooncake_master.store_kwargs(namespace=namespace, global_segment_size=0)
    with pytest.raises(ValueError, match="orphan_interval must be > 0 seconds, got 0"):
        MooncakeFeatureStore(**kwargs, orphan_interval=0)
    with pytest.raises(ValueError, match="orphan_grace must be a finite number of seconds >= 0, got -1"):
        MooncakeFeatureStore(**kwargs, orphan_grace=-1)


def test_a_force_closed_writers_queued_objects_stay_counted_until_a_scrub_or_a_sweep_frees_them(
    storage: Any, mooncake_master: MooncakeMaster, namespace: str
) -> None:
    from featurestream import MooncakeFeatureStore

    kwargs = mooncake_master.store_kwargs(namespace=namespace, global_segment_size=0, close_timeout=0)
    writer = MooncakeFeatureStore(**kwargs, orphan_interval=0.2)  # its objects live in the storage's segment
    refs = [writer.put(f"q{i}", sample_tensors(i, tokens=4)) for i in range(3)]
    for ref in refs:
        writer.retain(ref)  # a queue holds all three
    writer.close(force=True)
    assert storage.health().sample_count == 3, "a forced close dropped the record of objects still in the cluster"
    assert slots_taken(storage) == 1
    storage.scrub(refs[0])  # the queue acked q0: its scrub frees it from any instance
    assert storage.health().sample_count == 2
    time.sleep(0.2 + GRACE + 0.5)
    assert storage.reclaim_orphans(lambda ids: {"q1"} & set(ids), force=True) == 1  # q2: no queue holds it
    assert storage.is_resident("q1") and not storage.is_resident("q2") and slots_taken(storage) == 1
    storage.scrub(refs[1])
    assert storage.reclaim_orphans(lambda ids: set(), force=True) == 0
    assert slots_taken(storage) == 0 and storage.health().sample_count == 0

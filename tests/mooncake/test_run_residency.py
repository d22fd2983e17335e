"""``health()`` is the run's residency: every writer's samples, in any process, as the master sees them now."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from featurestream import SampleRefQueue, StoreHealth
from featurestream.stores.mooncake import RESIDENCY_SLOTS
from featurestream.testing import sample_tensors
from featurestream.tools.mooncake import MooncakeMaster

MakeStore = Callable[..., Any]

# A producer in its own process: it puts COUNT samples of 4000 B (queued elsewhere, so retained), then
# scrubs them on the first line from stdin and closes on the second.
WRITER = """
import sys
from featurestream import MooncakeFeatureStore
from featurestream.testing import sample_tensors
master, metadata, namespace, count = sys.argv[1:]
store = MooncakeFeatureStore(
    master_server_address=master, metadata_server=metadata, local_hostname="127.0.0.1",
    global_segment_size=64 << 20, namespace=namespace, close_timeout=0,
)
refs = [store.put(f"b{i}", sample_tensors(i, tokens=100)) for i in range(int(count))]
for ref in refs:
    store.retain(ref)
print("put", flush=True)
sys.stdin.readline()
for ref in refs:
    store.scrub(ref)
print("scrubbed", flush=True)
sys.stdin.readline()
store.close()
"""

BAND = {"max_samples": None, "max_bytes": 1 << 20, "high_watermark_bytes": 10_000, "low_watermark_bytes": 5_000}


class Writer:
    def __init__(self, master: MooncakeMaster, namespace: str, count: int) -> None:
        args = [master.master_server_address, master.metadata_server, namespace, str(count)]
        self.process = subprocess.Popen(
            [sys.executable, "-c", WRITER, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )

    def expect(self, line: str) -> None:
        assert self.process.stdout is not None
        got = self.process.stdout.readline().strip()
        assert got == line, f"the writer process said {got!r} (exit code {self.process.poll()}), not {line!r}"

    def go_on(self) -> None:
        assert self.process.stdin is not None
        self.process.stdin.write("\n")
        self.process.stdin.flush()


@pytest.fixture
def writer_process(mooncake_master: MooncakeMaster, namespace: str) -> Iterator[Callable[[int], Writer]]:
    made: list[Writer] = []

    def start(count: int) -> Writer:
        made.append(Writer(mooncake_master, namespace, count))
        return made[-1]

    yield start
    for writer in made:
        if writer.process.poll() is None:
            writer.process.kill()
        writer.process.wait(timeout=30)


def _counts(health: StoreHealth) -> tuple[int, int, bool]:
    return health.sample_count, health.resident_bytes, health.high_watermark_hit


def test_every_instance_sees_the_run_s_residency_and_backpressure_pauses_on_another_process_s_bytes(
    make_store: MakeStore, writer_process: Callable[[int], Writer]
) -> None:
    producer, trainer = make_store(**BAND), make_store(global_segment_size=0, **BAND)
    first = producer.put("a0", sample_tensors(0, tokens=10))  # 400 B
    other = writer_process(3)  # 12,000 B in another process: over the high watermark
    other.expect("put")
    assert _counts(trainer.health()) == (4, 12_400, True), "a reader that wrote nothing sees both writers"
    assert _counts(producer.health()) == (4, 12_400, True), "each writer sees the other's samples too"

    paused, resumed = threading.Event(), threading.Event()
    queue = SampleRefQueue(producer, on_pause=lambda _: paused.set(), on_resume=lambda _: resumed.set())
    queue.put(first)  # the queue holds a sample, so a paused producer waits rather than enqueues
    second = producer.put("a1", sample_tensors(1, tokens=10))
    blocked = threading.Thread(target=queue.put_blocks_until_below, args=(second,), kwargs={"poll_interval": 0.01})
    blocked.start()
    try:
        assert paused.wait(timeout=60), "the producer never paused on the other process's bytes"
        assert blocked.is_alive() and queue.stats().pending == 1
        other.go_on()  # the other process scrubs its samples
        other.expect("scrubbed")
        blocked.join(timeout=60)
        assert not blocked.is_alive(), "the producer never resumed after the other process's bytes were scrubbed"
    finally:
        queue.close()
        blocked.join(timeout=60)
    assert resumed.is_set() and queue.stats().pending == 2
    assert _counts(trainer.health()) == (2, 800, False)
    other.go_on()
    assert other.process.wait(timeout=60) == 0


def test_a_writer_s_record_follows_its_releases_and_scrubs_elsewhere_and_leaves_with_it(
    make_store: MakeStore, mooncake_master: MooncakeMaster, namespace: str
) -> None:
    first, second, reader = make_store(), make_store(), make_store(global_segment_size=0)
    kept = first.put("x0", sample_tensors(0, tokens=10))
    freed = first.put("x1", sample_tensors(1, tokens=20))
    queued = second.put("y0", sample_tensors(2, tokens=30))
    second.retain(queued)
    assert _counts(reader.health())[:2] == (3, 400 + 800 + 1200)
    assert reader.is_resident("x0") and reader.is_resident("y0") and not reader.is_resident("x")
    _, handle = first.get(freed)
    first.release(handle)  # the writer's own last release frees it; its record is not republished until a put
    reader.scrub(queued)  # and a scrub in a third instance, which no writer's record hears of
    assert _counts(reader.health())[:2] == (1, 400)
    assert _counts(second.health())[:2] == (1, 400)

    client = reader._client
    taken = sum(int(found) for found in client.batch_is_exist(reader._slots))
    assert taken == 2 and len(reader._slots) == RESIDENCY_SLOTS
    first.close()
    assert sum(int(found) for found in client.batch_is_exist(reader._slots)) == 1, "a closed writer's slot goes"
    assert _counts(reader.health())[:2] == (0, 0) and not reader.is_resident(kept.sample_id)
    third = make_store()
    third.put("z0", sample_tensors(0, tokens=10))
    assert _counts(reader.health())[:2] == (1, 400), "a new writer claims the freed slot"


def test_a_killed_writer_s_samples_and_record_stop_counting_once_the_master_drops_its_segment(
    own_master: MooncakeMaster, namespace: str
) -> None:
    """Its record lived in its own segment, with its samples: both go when the master expires the client."""
    from featurestream import MooncakeFeatureStore

    reader = MooncakeFeatureStore(**own_master.store_kwargs(namespace=namespace, global_segment_size=0))
    try:
        writer = Writer(own_master, namespace, 2)
        writer.expect("put")
        assert _counts(reader.health())[:2] == (2, 4_000 + 4_000) and reader.is_resident("b1")
        writer.process.kill()
        writer.process.wait(timeout=30)
        # Its record cannot be read from a dead process, and the master drops the segment after client_ttl (2 s)
        # without heartbeats; either way its samples are lost, and stop counting.
        give_up = time.monotonic() + 60
        while any(int(found) for found in reader._client.batch_is_exist(reader._slots)):
            assert time.monotonic() < give_up, "the master never dropped the dead writer's segment"
            time.sleep(0.1)
        assert _counts(reader.health())[:2] == (0, 0) and not reader.is_resident("b1")
    finally:
        reader.close()
